//! Descriptors a child of `fork` must not keep.
//!
//! A child of `fork` gets a copy of every descriptor and none of the threads. Copies of a
//! member's data sockets kept them in the port's reuseport group after the member closed
//! them, at indices its coordinator took for free, so the next member's probes went astray
//! and it failed to join ("not steered within 5 s"); copies of a coordinator's listening
//! socket and connections kept its name bound, and its members connected, with nobody
//! behind them. rdma-core's test suite forks its two rdma_cm players from a process that
//! had opened the device, and every rdma_cm test after the first failed so. A
//! [`ParentOnly`] descriptor is closed in every child of `fork` (a `pthread_atfork` handler)
//! and never closed by a child's drop (its number may be another file's there by then); a
//! child uses devices of its own, as with the kernel's verbs.

use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Descriptors to close in a child; -1 is a free entry. Lock-free: the handler runs in the
/// child, where a lock held by another thread of the parent would never be released.
static FDS: [AtomicI32; 4096] = [const { AtomicI32::new(-1) }; 4096];

/// This process's ID once asked for ([`pid`]); 0 in a child of `fork` until it asks.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn in_child() {
    PID.store(0, Ordering::Relaxed);
    for entry in &FDS {
        let fd = entry.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: `fd` was a ParentOnly descriptor of the parent when it forked, copied
            // into this child; nothing in the child uses it (ParentOnly forgets it here).
            unsafe { libc::close(fd) };
        }
    }
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only closes descriptors (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}

/// This process's ID, without a system call after the first (`getpid` is one, and costs
/// more than an atomic applied through a grant): a child of `fork` asks again.
pub(crate) fn pid() -> u32 {
    let known = PID.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // The handler that forgets it in a child, before it is kept.
    install();
    let pid = std::process::id();
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// A descriptor of this process only: see the [module](self) documentation.
#[derive(Debug)]
pub(crate) struct ParentOnly {
    fd: Option<OwnedFd>,
    pid: u32,
}

impl ParentOnly {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        install();
        let raw = fd.as_raw_fd();
        // Full: the descriptor stays in children, as every descriptor did before.
        let _ = FDS.iter().find(|e| e.compare_exchange(-1, raw, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        Self { fd: Some(fd), pid: pid() }
    }
}

impl Drop for ParentOnly {
    fn drop(&mut self) {
        let Some(fd) = self.fd.take() else { return };
        if pid() != self.pid {
            std::mem::forget(fd); // closed at the fork; the number may be another file's now
            return;
        }
        let raw = fd.as_raw_fd();
        // Out of the table before it is closed, so that a child never closes a number
        // this process has reused.
        if let Some(e) = FDS.iter().find(|e| e.load(Ordering::Relaxed) == raw) {
            e.store(-1, Ordering::Release);
        }
        drop(fd);
    }
}

impl Deref for ParentOnly {
    type Target = OwnedFd;
    fn deref(&self) -> &OwnedFd {
        self.fd.as_ref().expect("present until dropped")
    }
}

impl AsFd for ParentOnly {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.deref().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_of_fork_has_none_of_them_and_the_parent_keeps_them() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let kept = ParentOnly::new(OwnedFd::from(a));
        let raw = kept.as_raw_fd();
        // SAFETY: the child only calls fcntl and _exit (async-signal-safe).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: fcntl on a number only reads the descriptor table.
            let open = unsafe { libc::fcntl(raw, libc::F_GETFD) } != -1;
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(if open { 1 } else { 0 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child this test forked.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child still had it");
        assert!(rustix::io::fcntl_getfd(&*kept).is_ok(), "the parent keeps it");
        drop(b);
    }
}
