//! Logs, off by default: `SOFTRDMA_LOG` takes a filter in the `RUST_LOG` form
//! (`info`, `softrdma::qp=debug,softrdma::cm=info`, ...) and sends what passes it to stderr,
//! or to the file `SOFTRDMA_LOG_FILE` names (appended). rdma-core's `VERBS_LOG_LEVEL`
//! (0 none, 1 errors, 2 warnings, 3 information, 4 and up debug) and `VERBS_LOG_FILE`, which
//! its providers honour, are taken when `SOFTRDMA_LOG` is not set.
//!
//! Targets: `softrdma::qp` (QP state changes and their cause: the work request, the NAK,
//! the retries run out, the peer; ACK timeouts and RNR waits at debug), `softrdma::cm`
//! (connection-manager events, rejects and failures at info), `softrdma::mr` (registrations
//! refused, with the check that failed, at info), `softrdma::host` (joining and leaving the
//! host's group of processes). When no filter is set no subscriber is
//! installed and every log site costs one relaxed atomic load; a program that installs its
//! own `tracing` subscriber gets the events through it instead.

use std::sync::Once;

use tracing_subscriber::EnvFilter;

/// The filter variable.
pub const LOG_ENV: &str = "SOFTRDMA_LOG";
/// Where the logs go instead of stderr.
pub const LOG_FILE_ENV: &str = "SOFTRDMA_LOG_FILE";

/// The filter the environment asks for, if any: `SOFTRDMA_LOG`, else rdma-core's
/// `VERBS_LOG_LEVEL` as the level of softrdma's targets.
fn filter_from_env() -> Option<String> {
    if let Some(f) = std::env::var(LOG_ENV).ok().filter(|f| !f.trim().is_empty()) {
        return Some(f);
    }
    let level = match std::env::var("VERBS_LOG_LEVEL").ok()?.trim().parse::<u32>().ok()? {
        0 => return None,
        1 => "error",
        2 => "warn",
        3 => "info",
        _ => "debug",
    };
    Some(format!("softrdma={level}"))
}

/// Installs the process's log subscriber once, if the environment asks for logs and no
/// subscriber is installed yet. Called when a device is opened.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(filter) = filter_from_env() else { return };
        let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("softrdma=info"));
        let file = std::env::var_os(LOG_FILE_ENV).or_else(|| std::env::var_os("VERBS_LOG_FILE"));
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(true);
        // An application's own subscriber wins: try_init then fails, and that is fine.
        let _ = match file.and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok()) {
            Some(f) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
            None => builder.with_writer(std::io::stderr).try_init(),
        };
    });
}
