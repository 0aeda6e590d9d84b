//! What a perf run does: the options on the command line, checked, and the [`Spec`] the
//! client sends the server so both sides run the same test.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The operation a test measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    /// SEND into receives the peer posted.
    Send,
    /// RDMA WRITE into the peer's memory (with immediate for latency: see the README).
    Write,
    /// RDMA READ from the peer's memory.
    Read,
    /// 8-byte atomic FETCH_AND_ADD on the peer's memory.
    Atomic,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        })
    }
}

/// Bandwidth or latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// Bandwidth and message rate: many operations in flight.
    Bw,
    /// Latency: one operation at a time.
    Lat,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Bw => "bw",
            Mode::Lat => "lat",
        })
    }
}

/// The QP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum Conn {
    /// Reliable connected.
    #[value(name = "RC", alias = "rc")]
    Rc,
    /// Unreliable connected.
    #[value(name = "UC", alias = "uc")]
    Uc,
    /// Unreliable datagram.
    #[value(name = "UD", alias = "ud")]
    Ud,
}

impl fmt::Display for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        })
    }
}

/// The options every `softrdma perf <op> <bw|lat>` takes, in perftest's spirit.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// `bw` (bandwidth and message rate) or `lat` (latency).
    #[arg(value_enum)]
    pub(crate) mode: Mode,
    /// The server to connect to. Without it, this side is the server: it waits for one
    /// client, runs the test the client asks for, and exits.
    pub(crate) host: Option<String>,
    /// Run the server and the client here, as two processes on 127.0.0.1, and print the
    /// client's results.
    #[arg(long, conflicts_with = "host")]
    pub(crate) loopback: bool,
    /// Bytes per message (default: 65536 for bw, the path MTU for UD bw, 2 for lat;
    /// atomics are always 8).
    #[arg(short, long, value_parser = parse_size)]
    pub(crate) size: Option<u64>,
    /// Every size from 2 bytes to 8 MiB, doubling (up to the path MTU for UD).
    #[arg(short, long, conflicts_with = "size")]
    pub(crate) all: bool,
    /// These sizes, in this order (`--sizes 64,4K,64K`): one table, one curve.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with_all = ["size", "all"])]
    pub(crate) sizes: Vec<u64>,
    /// Run the test once per QP count (`--qps-sweep 1,2,4,16,128`, bw only): one table of
    /// bandwidth and message rate against QPs and sizes, and with --plot one curve per size.
    /// Against a server, the server serves one connection per count.
    #[arg(long = "qps-sweep", value_delimiter = ',', conflicts_with = "qps",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) qps_sweep: Vec<u32>,
    /// Operations per size (default: 5000 for bw, 1000 for lat).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub(crate) iters: Option<u64>,
    /// Run each size for this many seconds instead of a number of operations.
    #[arg(short = 'D', long, value_parser = parse_seconds, conflicts_with = "iters")]
    pub(crate) duration: Option<Duration>,
    /// Queue pairs (bw only), each running `-n` operations (or `-D` seconds) at once, as
    /// perftest's `-q`.
    #[arg(short, long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) qps: u32,
    /// Operations in flight per QP (default: 128 for bw; lat is always 1).
    #[arg(short = 't', long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) tx_depth: Option<u32>,
    /// Send messages up to this many bytes inline (default: 64 for lat, 0 for bw; at most
    /// 256).
    #[arg(short = 'I', long, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub(crate) inline: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the device's active MTU).
    #[arg(short, long, value_parser = parse_mtu)]
    pub(crate) mtu: Option<u32>,
    /// The transport.
    #[arg(short, long, value_enum, default_value_t = Conn::Rc)]
    pub(crate) connection: Conn,
    /// Connect through rdma_cm (IB CM on QP1) instead of an out-of-band TCP exchange.
    #[arg(short = 'R', long)]
    pub(crate) rdma_cm: bool,
    /// Authenticated mode (with --rdma-cm; softrdma at both ends): keys agreed through the
    /// CM and an AES-128-GMAC on every packet, to measure what it costs.
    #[arg(long, requires = "rdma_cm")]
    pub(crate) authenticate: bool,
    /// Both sides send at once (bw only); the figures are the sum of both directions.
    #[arg(short, long)]
    pub(crate) bidirectional: bool,
    /// Keep every packet on the sockets (UDP through the kernel), as between hosts: turns
    /// the same-host path off (for both sides: the server follows the client's test).
    #[arg(long)]
    pub(crate) wire: bool,
    /// Sleep on a completion channel for completions instead of polling the CQ, as
    /// perftest's `-e`: wait in `get_cq_event`, re-arm the CQ, then poll it (both sides; a
    /// wait polls first for a window learned from the recent waits, up to
    /// `SOFTRDMA_WAIT_SPIN_US`).
    #[arg(short = 'e', long = "use-event", alias = "use_event")]
    pub(crate) events: bool,
    /// The TCP port (or, with --rdma-cm, the rdma_cm port) the server listens on.
    #[arg(short, long, default_value_t = 18515)]
    pub(crate) port: u16,
    /// The device (default: the one whose address reaches the peer).
    #[arg(short = 'd', long = "ib-dev")]
    pub(crate) device: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw a bandwidth-vs-size curve (bw) or a latency histogram (lat) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Also measure this machine's limits in this run and print each figure as a ratio of
    /// its limit (see `softrdma perf baseline`).
    #[arg(long)]
    pub(crate) vs_baseline: bool,
    /// With --vs-baseline: run the test and measure the limits this many times in turn
    /// (test, limits, test, limits, ...) and give each ratio as the median of the rounds',
    /// with every round's beside it: on a machine whose own limits swing between minutes,
    /// one round's ratio says little. Against a server, the server serves one connection
    /// per round.
    #[arg(long, default_value_t = 1, requires = "vs_baseline", conflicts_with = "qps_sweep",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Server side: print `LISTENING <port>` once ready (`--loopback` uses it).
    #[arg(long, hide = true)]
    pub(crate) announce: bool,
}

/// The whole test, as the client sends it to the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) op: Op,
    pub(crate) mode: Mode,
    pub(crate) conn: Conn,
    pub(crate) sizes: Vec<u64>,
    pub(crate) iters: u64,
    pub(crate) duration_ms: Option<u64>,
    pub(crate) qps: u32,
    pub(crate) depth: u32,
    pub(crate) inline: u32,
    /// Path MTU in bytes; 0: each side's device default.
    pub(crate) mtu: u32,
    pub(crate) bidirectional: bool,
    /// The QPs are connected through rdma_cm (IB CM on QP1), not by the TCP exchange.
    #[serde(default)]
    pub(crate) rdma_cm: bool,
    /// rdma_cm connects the QPs in authenticated mode.
    #[serde(default)]
    pub(crate) authenticate: bool,
    /// Another test follows this one on the same server (`--qps-sweep`): the server
    /// waits for its client once this one is done.
    #[serde(default)]
    pub(crate) more: bool,
    /// Every packet stays on the sockets (`--wire`): both sides open their device with the
    /// same-host path off.
    #[serde(default)]
    pub(crate) wire: bool,
    /// Both sides sleep on a completion channel for their completions (`-e`).
    #[serde(default)]
    pub(crate) events: bool,
}

/// Largest message `-a` runs.
pub(crate) const MAX_SIZE: u64 = 8 << 20;

impl Spec {
    /// Checks the options and fills in the defaults; the error is one line for the user.
    pub(crate) fn from_args(op: Op, a: &TestArgs) -> Result<Spec, String> {
        let mode = a.mode;
        if mode == Mode::Lat && a.qps != 1 {
            return Err("-q/--qps: latency tests use one QP".into());
        }
        if mode == Mode::Lat && !a.qps_sweep.is_empty() {
            return Err("--qps-sweep: latency tests use one QP".into());
        }
        if mode == Mode::Lat && a.bidirectional {
            return Err("--bidirectional: only for bw tests".into());
        }
        match (a.connection, op) {
            (Conn::Ud, Op::Send) | (Conn::Rc, _) | (Conn::Uc, Op::Send | Op::Write) => {}
            (Conn::Ud, _) => return Err(format!("--connection UD: only send tests (UD has no {op})")),
            (Conn::Uc, _) => return Err(format!("--connection UC: UC has no {op}; use RC")),
        }
        if a.rdma_cm && a.mtu.is_some() {
            return Err("--mtu with --rdma-cm: rdma_cm takes the path MTU from the route (the device's active \
                        MTU); drop --mtu"
                .into());
        }
        let mtu = a.mtu.unwrap_or(0);
        let ud_max = u64::from(if mtu == 0 { 4096 } else { mtu });
        // A size the option `flag` gave.
        let check = |flag: &str, s: u64| {
            if s == 0 || s > MAX_SIZE {
                return Err(format!("{flag} {s}: must be 1 to {MAX_SIZE} bytes"));
            }
            if a.connection == Conn::Ud && s > ud_max {
                return Err(format!("{flag} {s}: a UD message must fit one packet (the path MTU)"));
            }
            Ok(())
        };
        let sizes = if op == Op::Atomic {
            if a.all || a.size.is_some_and(|s| s != 8) || a.sizes.iter().any(|&s| s != 8) {
                return Err("atomic tests move 8 bytes; drop -s/--size, --sizes and -a/--all".into());
            }
            vec![8]
        } else if !a.sizes.is_empty() {
            if a.sizes.len() > 64 {
                return Err(format!("--sizes: {} sizes, at most 64", a.sizes.len()));
            }
            for &s in &a.sizes {
                check("--sizes", s)?;
            }
            a.sizes.clone()
        } else if a.all {
            let top = if a.connection == Conn::Ud { ud_max } else { MAX_SIZE };
            std::iter::successors(Some(2u64), |s| Some(s * 2)).take_while(|s| *s <= top).collect()
        } else {
            let default = match (mode, a.connection) {
                (Mode::Bw, Conn::Ud) => ud_max, // a UD message is one packet
                (Mode::Bw, _) => 65536,
                (Mode::Lat, _) => 2,
            };
            let s = a.size.unwrap_or(default);
            check("-s/--size", s)?;
            vec![s]
        };
        let depth = if mode == Mode::Lat { 1 } else { a.tx_depth.unwrap_or(128) };
        Ok(Spec {
            op,
            mode,
            conn: a.connection,
            sizes,
            iters: a.iters.unwrap_or(if mode == Mode::Bw { 5000 } else { 1000 }),
            duration_ms: a.duration.map(|d| d.as_millis().max(1) as u64),
            qps: a.qps,
            depth,
            inline: a.inline.unwrap_or(if mode == Mode::Lat { 64 } else { 0 }),
            mtu,
            bidirectional: a.bidirectional,
            rdma_cm: a.rdma_cm,
            authenticate: a.authenticate,
            more: false,
            wire: a.wire,
            events: a.events,
        })
    }

    /// Checks a spec that came from the network: what [`from_args`](Spec::from_args)
    /// would have refused.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.sizes.is_empty() || self.sizes.iter().any(|s| *s == 0 || *s > MAX_SIZE) {
            return Err(format!("sizes {:?}: each 1 to {MAX_SIZE} bytes", self.sizes));
        }
        if self.sizes.len() > 64 || !(1..=1024).contains(&self.qps) || !(1..=4096).contains(&self.depth) {
            return Err(format!("{} sizes, {} QPs, depth {}", self.sizes.len(), self.qps, self.depth));
        }
        if self.inline > 256 || !matches!(self.mtu, 0 | 256 | 512 | 1024 | 2048 | 4096) || self.rdma_cm && self.mtu != 0
        {
            return Err(format!("inline {}, MTU {}", self.inline, self.mtu));
        }
        if self.iters == 0 || self.duration_ms.is_some_and(|d| d == 0 || d > 3_600_000) {
            return Err("no operations".into());
        }
        Ok(())
    }

    /// The name perftest would give this test (`ib_write_bw`).
    pub(crate) fn title(&self) -> String {
        format!("{} {}", self.op, self.mode)
    }

    /// Largest message.
    pub(crate) fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(8)
    }

    /// How long a run may take before the peer gives up on it: its duration, or a bound on
    /// `iters` operations that only a stalled transfer exceeds.
    pub(crate) fn run_deadline(&self, size: u64) -> Duration {
        match self.duration_ms {
            Some(ms) => Duration::from_millis(ms) + Duration::from_secs(30),
            None => {
                let bytes = size.saturating_mul(self.iters).saturating_mul(if self.bidirectional { 2 } else { 1 });
                // 50 MB/s and 20 µs per operation are far below the slowest machine's rates.
                Duration::from_secs(30)
                    + Duration::from_secs_f64(bytes as f64 / 50e6 + self.iters as f64 * 20e-6 * f64::from(self.qps))
            }
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let mult = match s[i..].to_ascii_lowercase().as_str() {
                "k" | "kib" | "kb" => 1 << 10,
                "m" | "mib" | "mb" => 1 << 20,
                "b" => 1,
                other => return Err(format!("unknown unit {other:?} (use a number of bytes, or K or M)")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 8, 4096, 64K, 1M)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.001..=3600.0).contains(&secs) {
        return Err(format!("{s}: a duration of 0.001 to 3600 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(m @ (256 | 512 | 1024 | 2048 | 4096)) => Ok(m),
        _ => Err(format!("{s}: the path MTU is one of 256, 512, 1024, 2048, 4096")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("x").is_err());
        assert!(parse_size("3q").is_err());
    }

    #[test]
    fn mtu_must_be_an_ib_mtu() {
        assert_eq!(parse_mtu("1024"), Ok(1024));
        assert!(parse_mtu("1500").is_err());
    }
}
