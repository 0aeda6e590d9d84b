//! Keepalives (`SO_KEEPALIVE`, `TCP_KEEPIDLE`), as rdma-core's rsockets send them: one
//! thread per process (rdma-core's `tcp_svc`) wakes every socket that asked for them each
//! `TCP_KEEPIDLE` seconds, counted from when it asked (traffic does not move the timer), and
//! each sends a zero-length RDMA WRITE with immediate [`OP_CTRL`](super::OP_CTRL)
//! [`CTRL_KEEPALIVE`](super::CTRL_KEEPALIVE), if it is connected and has a control slot
//! free. The peer takes it like any control message and answers nothing: the transport's
//! ACK is the answer. A peer that is gone without a word (killed, its host down) ACKs
//! nothing, the write's retries run out, and its error completion puts the socket in the
//! error state: `rpoll` says `POLLERR`, `rrecv` the end of the stream, `SO_ERROR` `EIO`,
//! where without keepalives an idle socket would wait for it forever.
//!
//! The thread holds the sockets weakly: a socket closed without turning them off drops out
//! at the thread's next wake-up. It never holds its list's lock while it takes a socket's,
//! and a socket's calls here take the list's only after they let go of their own.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::{State, lock};
use crate::{Error, Result};

/// `TCP_KEEPIDLE` when the application sets none: the kernel's `tcp_keepalive_time`, or
/// its default, 7200 s, as rdma-core reads it.
pub(super) fn default_idle() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(7200)
}

/// A socket that sends keepalives, and when it sends the next.
struct Entry {
    socket: Weak<Mutex<State>>,
    due: Instant,
    every: Duration,
}

/// The process's keepalive thread and its sockets.
struct Service {
    entries: Mutex<Vec<Entry>>,
    changed: Condvar,
}

/// The service, started by the first socket that turns keepalives on.
static SERVICE: Mutex<Option<Arc<Service>>> = Mutex::new(None);

fn service() -> Result<Arc<Service>> {
    let mut slot = lock(&SERVICE);
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let s = Arc::new(Service { entries: Mutex::new(Vec::new()), changed: Condvar::new() });
    let run = s.clone();
    std::thread::Builder::new()
        .name("softrdma-rs-keepalive".into())
        .spawn(move || run.run())
        .map_err(|e| Error::io("rsetsockopt SO_KEEPALIVE: starting the keepalive thread", e))?;
    *slot = Some(s.clone());
    Ok(s)
}

/// Sends `socket`'s keepalives every `every`, the first `every` from now (replacing its
/// schedule if it had one).
pub(super) fn schedule(socket: &Arc<Mutex<State>>, every: Duration) -> Result<()> {
    let s = service()?;
    let mut entries = lock(&s.entries);
    let due = Instant::now() + every;
    match entries.iter_mut().find(|e| std::ptr::eq(e.socket.as_ptr(), Arc::as_ptr(socket))) {
        Some(e) => (e.due, e.every) = (due, every),
        None => entries.push(Entry { socket: Arc::downgrade(socket), due, every }),
    }
    s.changed.notify_one();
    Ok(())
}

/// Sends no more of `socket`'s keepalives.
pub(super) fn cancel(socket: &Arc<Mutex<State>>) {
    let Some(s) = lock(&SERVICE).clone() else { return };
    lock(&s.entries).retain(|e| !std::ptr::eq(e.socket.as_ptr(), Arc::as_ptr(socket)));
}

impl Service {
    fn run(&self) {
        let mut entries = lock(&self.entries);
        loop {
            let now = Instant::now();
            entries.retain(|e| e.socket.strong_count() > 0);
            let mut due = Vec::new();
            for e in entries.iter_mut().filter(|e| e.due <= now) {
                due.push(e.socket.clone());
                e.due = now + e.every;
            }
            if !due.is_empty() {
                drop(entries);
                for socket in due.iter().filter_map(Weak::upgrade) {
                    lock(&socket).send_keepalive();
                }
                entries = lock(&self.entries);
                continue;
            }
            entries = match entries.iter().map(|e| e.due).min() {
                Some(next) => {
                    let wait = next.saturating_duration_since(now);
                    self.changed.wait_timeout(entries, wait).unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
                None => self.changed.wait(entries).unwrap_or_else(std::sync::PoisonError::into_inner),
            };
        }
    }
}
