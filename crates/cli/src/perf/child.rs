//! A copy of this program run as the other side of a measurement (`--loopback`'s server,
//! the baseline's echo and sink), talking in lines over its standard input and output.
//! Every read has a deadline; a child still running when its handle drops is killed by its
//! PID and reaped, and one whose parent is killed ends with it (`PR_SET_PDEATHSIG`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use super::PerfError;

/// A running child.
pub(crate) struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    name: String,
}

impl Peer {
    /// Runs this program with `args`.
    pub(crate) fn spawn(args: &[String], name: &str) -> Result<Peer, PerfError> {
        let exe = std::env::current_exe()
            .map_err(|e| PerfError::Io(format!("finding this program to run the {name}: {e}")))?;
        let mut cmd = Command::new(exe);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // A child ends with this process, killed or not (a loopback server spinning on for
        // a client that is gone, for ever). Peers are spawned from the main thread, whose
        // end the kernel's signal follows; a parent gone before the hook ran is caught by
        // the parent pid.
        let parent = std::process::id();
        #[allow(unsafe_code)] // a hook between fork and exec
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // prctl(2) and getppid(2), both async-signal-safe, and allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::from(std::io::ErrorKind::NotConnected));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| PerfError::Io(format!("starting the {name}: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| PerfError::Io("no pipe from the child".into()))?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Peer { child, stdin, lines, name: name.to_string() })
    }

    /// The next line that starts with `prefix` (others are skipped), within `timeout`.
    pub(crate) fn expect_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, PerfError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(PerfError::Io(format!("the {} did not say {prefix:?} within {timeout:?}", self.name)));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    return Err(PerfError::Io(format!(
                        "the {} exited ({status}) before it said {prefix:?}",
                        self.name
                    )));
                }
            }
        }
    }

    /// Sends a line to the child's standard input.
    pub(crate) fn send_line(&mut self, line: &str) -> Result<(), PerfError> {
        let stdin = self.stdin.as_mut().ok_or_else(|| PerfError::Io(format!("the {} has no input", self.name)))?;
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).map_err(|e| PerfError::Io(format!("{}: {e}", self.name)))
    }

    /// Closes the child's input and waits for it to exit, at most `timeout`.
    pub(crate) fn wait(mut self, timeout: Duration) -> Result<ExitStatus, PerfError> {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return Err(PerfError::Io(format!("the {} did not exit within {timeout:?}", self.name))),
                Err(e) => return Err(PerfError::Io(format!("waiting for the {}: {e}", self.name))),
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
