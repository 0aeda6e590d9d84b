//! `softrdma`: the command-line face of softrdma.
//!
//! `softrdma perf` measures the stack the way perftest does; `softrdma decode` reads RoCEv2
//! captures; `softrdma devices`, `devinfo` and `stats` show the devices, `softrdma res` what
//! every process holds on them.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod decode;
mod devices;
mod host;
mod perf;
mod res;

/// RDMA in software: RoCEv2 verbs and rdma_cm in user space.
#[derive(Parser, Debug)]
#[command(name = "softrdma", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Decode the RoCEv2 packets of a pcap or pcapng capture, one line per packet.
    ///
    /// Every RoCEv2 packet (UDP to port 4791) is shown with its BTH, extended headers, MAD
    /// and CM message, payload length and whether its ICRC verifies. Other frames are
    /// counted and skipped; malformed ones are reported with the reason. A summary goes to
    /// standard error.
    ///
    /// With --follow QPN, only the conversation of that QP and its peer (found from the CM's
    /// REQ and REP, or by the PSNs that answer the QP's): a line per packet, A the followed
    /// QP and B its peer, each packet tagged with its message (A1, A2, ... per requester,
    /// with its operation and the packet's place in it), retransmissions marked, ACKs and
    /// NAKs paired with the messages they answer, NAK reasons named; then a summary
    /// (messages, retransmissions, NAKs by kind, duration).
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, Linux cooked, raw IP links).
        file: PathBuf,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
        /// Follow one QP's conversation: its QPN (0x11, or 17), or ADDR/QPN when QPs of that
        /// number exist on several hosts (198.18.0.3/0x11).
        #[arg(long, value_name = "[ADDR/]QPN")]
        follow: Option<decode::follow::Target>,
    },
    /// perftest for softrdma: bandwidth and latency of SEND, WRITE, READ and atomics
    /// between a server and a client (or both here with --loopback), and this machine's
    /// limits without RDMA (`softrdma perf baseline`).
    Perf {
        #[command(subcommand)]
        test: perf::PerfCommand,
    },
    /// The softrdma devices of this host, one per network interface with an address, with
    /// their node GUIDs (what `ibv_devices` prints).
    Devices(devices::DevicesArgs),
    /// Each device's attributes, port 1 and its GIDs; with -v also the limits the engine
    /// enforces (what `ibv_devinfo` prints).
    Devinfo(devices::DevinfoArgs),
    /// Packet, retry, NAK and drop counters per device (like rxe's hw_counters), summed over
    /// every live process on this host that has the device open; -v shows each process.
    Stats(devices::StatsArgs),
    /// The QPs, CQs, MRs, PDs, SRQs and rdma_cm IDs of every live process on this host (what
    /// `rdma res show` lists for a kernel device): states, PSNs, what is in flight, retries,
    /// peers. Only your own processes (every one as root).
    Res(res::ResArgs),
    /// Hold UDP port 4791 of the devices for every user of this host, until stopped. The
    /// port belongs to the user whose process takes it first, and that user's processes
    /// could read the other users' datagrams; started first by root (at boot, say), this
    /// process owns it, and no user's process can read another's.
    Host(host::HostArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    match cli.command {
        Command::Perf { test } => perf::main(test),
        Command::Devices(args) => devices::devices(&args),
        Command::Devinfo(args) => devices::devinfo(&args),
        Command::Stats(args) => devices::stats(&args),
        Command::Res(args) => res::res(&args),
        Command::Host(args) => host::host(&args),
        Command::Decode { file, json, follow } => {
            let stdout = io::stdout();
            let mut out = io::BufWriter::new(stdout.lock());
            let format = if json { decode::Format::Json } else { decode::Format::Text };
            let result = match follow {
                Some(target) => decode::follow::run(&file, target, format, &mut out).map(|()| None),
                None => decode::run(&file, format, &mut out).map(Some),
            };
            let result = result.and_then(|s| out.flush().map(|()| s).map_err(Into::into));
            match result {
                Ok(summary) => {
                    #[allow(clippy::print_stderr)]
                    if let Some(summary) = summary {
                        eprintln!("softrdma decode: {summary}");
                    }
                    ExitCode::SUCCESS
                }
                Err(decode::DecodeError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("softrdma decode: {e}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Help and version go to standard output as clap prints them; a usage error is one line
/// on standard error (what is wrong, and where the help is) with exit status 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    let rendered = e.render().to_string();
    // The message is the first paragraph ("the following required arguments were not
    // provided:" continues on the next lines), joined into one line.
    let what: Vec<&str> =
        rendered.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).filter(|l| !l.is_empty()).collect();
    let what = what.join(" ");
    let what = what.strip_prefix("error: ").unwrap_or(&what);
    // The help to read is that of the deepest subcommand the arguments name.
    let mut command = Cli::command();
    let mut path = vec![command.get_name().to_string()];
    for arg in std::env::args().skip(1) {
        match command.find_subcommand(&arg) {
            Some(sub) => {
                path.push(sub.get_name().to_string());
                command = sub.clone();
            }
            None if arg.starts_with('-') => continue,
            None => {}
        }
    }
    let command = path.join(" ");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("softrdma: {what} (see `{command} --help`)");
    }
    ExitCode::from(2)
}
