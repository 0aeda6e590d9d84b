//! Child processes for multi-process tests: the test binary runs itself again with
//! `--exact <entry> --nocapture` and a role in the environment. Parent and child talk in
//! lines over the child's stdin and stdout; every read has a deadline, and a child still
//! running when its handle drops is killed (SIGKILL, by its PID) and reaped.

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use softrdma::{Gid, RKey};

/// The environment variable that tells a re-executed test binary which role to play.
pub const ROLE_ENV: &str = "SOFTRDMA_TEST_ROLE";

/// A running child.
pub struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub name: String,
}

impl ChildProc {
    /// Runs test `entry` of this binary as role `role`, with `env`, optionally inside
    /// network namespace `netns` (`ip netns exec`).
    pub fn spawn(entry: &str, role: &str, env: &[(&str, String)], netns: Option<&str>) -> ChildProc {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(["--exact", entry, "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn a child test process");
        let stdout = child.stdout.take().expect("piped stdout");
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
        ChildProc { child, stdin, lines, name: format!("{role}{}", netns.map(|n| format!("@{n}")).unwrap_or_default()) }
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line holding `prefix`, from `prefix` on (libtest's chatter may precede it
    /// on its line, and other lines are skipped), within `timeout`; panics naming the
    /// child otherwise.
    pub fn expect_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(prefix) => return line[line.find(prefix).unwrap_or(0)..].to_string(),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("{}: no {prefix:?} line within {timeout:?}", self.name),
                Err(RecvTimeoutError::Disconnected) => panic!("{}: exited before printing {prefix:?}", self.name),
            }
        }
    }

    /// Sends one line to the child.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).expect("write to the child");
    }

    /// Closes the child's stdin (its signal to finish).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// SIGKILL, by PID.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the child to exit within `timeout`; returns whether it exited with 0.
    pub fn wait_success(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the child") {
                return status.success();
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("{}: still running after {timeout:?}; killed", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// What one side tells the other: its QP and a buffer the peer may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advert {
    pub qpn: u32,
    pub ip: IpAddr,
    pub psn: u32,
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

impl Advert {
    pub fn line(&self) -> String {
        format!("EP {} {} {} {} {} {}", self.qpn, self.ip, self.psn, self.addr, self.rkey, self.len)
    }

    pub fn parse(line: &str) -> Advert {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 7, "an EP line: {line}");
        Advert {
            qpn: f[1].parse().unwrap(),
            ip: f[2].parse().unwrap(),
            psn: f[3].parse().unwrap(),
            addr: f[4].parse().unwrap(),
            rkey: f[5].parse().unwrap(),
            len: f[6].parse().unwrap(),
        }
    }

    pub fn endpoint(&self) -> softrdma::Endpoint {
        softrdma::Endpoint { qpn: self.qpn, gid: Gid::from_ip(self.ip), psn: self.psn }
    }

    pub fn rkey(&self) -> RKey {
        RKey(self.rkey)
    }
}

/// Reads one line from stdin (in a child); `None` at end of input.
pub fn read_stdin_line() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end().to_string()),
    }
}

/// Prints a protocol line and flushes (in a child).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).expect("stdout");
}

/// A fill pattern that differs per byte and per seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8 ^ seed as u8).collect()
}
