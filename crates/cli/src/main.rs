//! `softrdma`: the command-line face of softrdma.
//!
//! Today it decodes RoCEv2 captures (`softrdma decode`); perf tests, device listings and
//! counters join it as the runtime lands.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod decode;
mod loopback;
mod perf;

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
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, Linux cooked, raw IP links).
        file: PathBuf,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A real RDMA run over the kernel's UDP loopback: two softrdma devices in this process
    /// (127.0.0.1 and 127.0.0.2, UDP port 4791) move data over an RC QP pair with RDMA WRITE,
    /// READ or SEND, and report bandwidth and latency.
    Loopback(loopback::Args),
    /// perftest for softrdma: bandwidth and latency of SEND, WRITE, READ and atomics
    /// between a server and a client (or both here with --loopback), and this machine's
    /// limits without RDMA (`softrdma perf baseline`).
    Perf {
        #[command(subcommand)]
        test: perf::PerfCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Perf { test } => perf::main(test),
        Command::Loopback(args) => match loopback::run(&args) {
            Ok(report) => {
                let out = if args.json {
                    serde_json::to_string(&report).unwrap_or_default() + "\n"
                } else {
                    loopback::text(&report)
                };
                let _ = io::stdout().write_all(out.as_bytes());
                ExitCode::SUCCESS
            }
            Err(e) => {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("softrdma loopback: {e}");
                }
                ExitCode::FAILURE
            }
        },
        Command::Decode { file, json } => {
            let stdout = io::stdout();
            let mut out = io::BufWriter::new(stdout.lock());
            let format = if json { decode::Format::Json } else { decode::Format::Text };
            let result = decode::run(&file, format, &mut out).and_then(|s| out.flush().map(|()| s).map_err(Into::into));
            match result {
                Ok(summary) => {
                    #[allow(clippy::print_stderr)]
                    {
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
