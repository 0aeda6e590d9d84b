//! What the host tests (`host.rs`, `users.rs`) share: a device name and port of their own,
//! and the datagrams they steer.

#![allow(dead_code, unreachable_pub)]

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use softrdma_udp::RecvBatch;
use softrdma_udp::host::Member;

pub fn random() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(Instant::now())
}

/// A device name (`prefix` with this process and a random number) and port of the test's
/// own. The port is below the kernel's ephemeral range (32768 up), where the tests' senders
/// and coordinators' probe sockets bind: one of those on the port made a member's bind fail
/// (`EADDRINUSE`).
pub fn group(prefix: &str) -> (String, u16) {
    let r = random();
    (format!("{prefix}{}-{}", std::process::id(), r % 1_000_000), 20_000 + (r >> 20) as u16 % 12_000)
}

/// An RC SEND to `qpn` whose last 8 bytes are `tag`.
pub fn data_packet(qpn: u32, tag: u64) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = 0x04;
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p.extend_from_slice(&tag.to_be_bytes());
    p
}

/// What a member child does with each datagram of `batch`: a probe goes to `member`; any
/// other is reported through `out`, as `rx TAG` (its last 8 bytes) or `short`.
pub fn report(member: &Member, batch: &RecvBatch, out: impl Fn(String)) {
    for d in batch.iter() {
        if Member::is_probe(d.payload) {
            member.answer_probe(d.payload);
        } else if d.payload.len() >= 20 {
            let tag = u64::from_be_bytes(d.payload[d.payload.len() - 8..].try_into().unwrap());
            out(format!("rx {tag}"));
        } else {
            out("short".into());
        }
    }
}

/// Stops process `pid` (SIGSTOP) and returns once every thread of it is stopped. `kill`
/// returns before they are: the kernel wakes one thread to take the signal, and that one
/// stops the others, so a thread already running goes on until then (4.6 ms after `kill`
/// returned, on this project's 2-core machine, long enough to answer a newcomer).
pub fn stop(pid: u32) {
    let raw = rustix::process::Pid::from_raw(pid as i32).expect("a process ID");
    rustix::process::kill_process(raw, rustix::process::Signal::STOP).expect("SIGSTOP");
    let start = Instant::now();
    while !every_thread_stopped(pid) {
        assert!(start.elapsed() < Duration::from_secs(10), "process {pid} not stopped 10 s after SIGSTOP");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Resumes process `pid` (SIGCONT).
pub fn resume(pid: u32) {
    let raw = rustix::process::Pid::from_raw(pid as i32).expect("a process ID");
    rustix::process::kill_process(raw, rustix::process::Signal::CONT).expect("SIGCONT");
}

/// Whether each thread's state in `/proc/PID/task/TID/stat` is stopped (`T`, or `t` when
/// a debugger holds it).
fn every_thread_stopped(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process lives");
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The command name (in parentheses) may hold spaces; the state follows it.
        let state = stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next());
        // A thread that exited meanwhile has no stat left to read.
        state.is_none_or(|s| matches!(s, 'T' | 't'))
    })
}
