//! `softrdma host`: holds port 4791 of the host's devices for every user. The port's
//! reuseport group belongs to the user whose process binds it first, and that user's
//! processes hold every socket of it, so they could read the other users' datagrams; run
//! first by root (or by a user of its own, at boot), this process owns the groups, and the
//! users' processes are all its guests: none can read another's (docs/architecture.md,
//! "Many users, one host").

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use crate::devices::{choose, failure, warn};

/// `softrdma host` arguments.
#[derive(Args, Debug)]
pub(crate) struct HostArgs {
    /// Only this device (all of them by default).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    device: Option<String>,
    /// End after this many seconds (by default it runs until it is stopped).
    #[arg(long = "for", value_name = "SECONDS")]
    duration: Option<u64>,
}

/// Runs `softrdma host`.
pub(crate) fn host(args: &HostArgs) -> ExitCode {
    let chosen = match choose("host", args.device.as_deref(), &[]) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(u32::MAX);
    let mut held = Vec::new();
    for device in chosen.iter().filter_map(|c| c.device.as_ref()) {
        let ctx = match device.open() {
            Ok(c) => c,
            Err(e) => return failure("host", &format!("opening {}: {e}", device.name())),
        };
        let port = softrdma_udp::ROCEV2_PORT;
        match softrdma_udp::host::port_owner(device.addresses(), port) {
            Some(owner) if owner == uid => {}
            Some(owner) => warn(
                "host",
                &format!(
                    "{}: user {owner}'s processes held UDP port {port} first; this process is their guest, \
                     and they can read the other users' datagrams until they end (start softrdma host before them)",
                    device.name()
                ),
            ),
            None => warn("host", &format!("{}: could not tell which user holds UDP port {port}", device.name())),
        }
        let addresses: Vec<String> = device.addresses().iter().map(ToString::to_string).collect();
        crate::devices::emit(&format!(
            "softrdma host: {} (UDP port {port} on {}) held for every user as user {uid}\n",
            device.name(),
            addresses.join(", ")
        ));
        held.push(ctx);
    }
    // The contexts' progress threads answer the coordinator's probes and make the guests'
    // sockets; nothing to do here but stay.
    let end = args.duration.map(|s| Instant::now() + Duration::from_secs(s));
    while end.is_none_or(|e| Instant::now() < e) {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(held);
    ExitCode::SUCCESS
}
