//! A word of shared memory that tells other processes whether its process lives, with no
//! system call on their side: the kernel marks it the moment the process dies, however it
//! dies (`SIGKILL` included), before the process can be waited for.
//!
//! The kernel's robust futex list does it: at a thread's exit, the kernel walks the list the
//! thread registered (`set_robust_list(2)`) and sets `FUTEX_OWNER_DIED` in every futex word
//! on it that holds the thread's ID. A keeper thread writes its ID into the word, registers
//! a list holding only that word, and waits; when the word's owner stops keeping it, the
//! keeper gives the C library its own list back and marks the word itself. Asking the
//! kernel instead (`kill(pid, 0)`, a pidfd) costs a system call each time, 0.25-1.2 µs on
//! the CI's machines, which is more than a whole atomic applied through a grant; and a PID
//! can be reused, where the word cannot.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// The bit the kernel sets in a dead thread's robust futex word (`linux/futex.h`).
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The word's value once its keeper stopped, or the kernel marked it.
pub(crate) const DEAD: u32 = FUTEX_OWNER_DIED;

/// Whether the process that keeps `word` lives: the keeper's thread ID, unmarked.
pub(crate) fn lives(word: u32) -> bool {
    word != 0 && word & FUTEX_OWNER_DIED == 0
}

/// `struct robust_list_head` of `linux/futex.h`.
#[repr(C)]
struct RobustListHead {
    /// The first entry (`struct robust_list`, one pointer); the head's own address ends the list.
    list: *mut u64,
    /// From an entry to its futex word.
    futex_offset: libc::c_long,
    list_op_pending: *mut u64,
}

/// Keeps a life word ([`lives`]) while it is not dropped.
pub(crate) struct Keeper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The process that started it: a child of `fork` has no such thread.
    pid: u32,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").finish_non_exhaustive()
    }
}

impl Keeper {
    /// Keeps `word`, with `entry` as the word's place on the kernel's list, both in shared
    /// memory that `holder` keeps mapped (the keeper holds it until it let go of them).
    /// Fails where the kernel has no robust futex lists.
    pub(crate) fn start<H: Send + Sync + 'static>(
        holder: Arc<H>,
        entry: &AtomicU64,
        word: &AtomicU32,
    ) -> io::Result<Keeper> {
        let entry = std::ptr::from_ref(entry) as usize;
        let word = std::ptr::from_ref(word) as usize;
        let futex_offset = libc::c_long::try_from(word.wrapping_sub(entry) as isize)
            .map_err(|_| io::Error::other("the life word is too far from its entry"))?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread =
            std::thread::Builder::new().name("softrdma-life".into()).stack_size(64 * 1024).spawn(move || {
                // SAFETY: `holder` keeps the shared mapping that both addresses are in mapped
                // until this thread ends, and they are aligned words of it (the caller's
                // references were).
                let (entry, word) = unsafe { (&*(entry as *const AtomicU64), &*(word as *const AtomicU32)) };
                let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
                let mut head =
                    RobustListHead { list: entry.as_ptr(), futex_offset, list_op_pending: std::ptr::null_mut() };
                let head_at = std::ptr::from_mut(&mut head);
                // The entry's next is the head: the list ends after it.
                entry.store(head_at as u64, Ordering::SeqCst);
                word.store(tid, Ordering::SeqCst);
                let mut theirs: *mut RobustListHead = std::ptr::null_mut();
                let mut their_len: libc::size_t = 0;
                // SAFETY: get_robust_list(2) of this thread, into two locals.
                let got = unsafe {
                    libc::syscall(
                        libc::SYS_get_robust_list,
                        0,
                        std::ptr::from_mut(&mut theirs),
                        std::ptr::from_mut(&mut their_len),
                    )
                };
                // SAFETY: registers `head`, which lives on this thread's stack until the
                // C library's list is given back below, and whose one entry is the word's.
                let set = got == 0
                    && unsafe { libc::syscall(libc::SYS_set_robust_list, head_at, size_of::<RobustListHead>()) } == 0;
                if !set {
                    word.store(0, Ordering::SeqCst);
                    let _ = ready_tx.send(Err(io::Error::last_os_error()));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                // Until the owner stops keeping the word (or drops the sender).
                let _ = stopped.recv();
                // SAFETY: gives the C library back the list it registered for this thread.
                unsafe { libc::syscall(libc::SYS_set_robust_list, theirs, their_len) };
                word.store(DEAD, Ordering::SeqCst);
                drop(holder);
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Keeper { stop: Some(stop), thread: Some(thread), pid: crate::fork::pid() }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("the life word's keeper did not start"))
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            if crate::fork::pid() == self.pid {
                let _ = thread.join();
            } else {
                // A child of fork has no such thread: joining it would wait forever.
                std::mem::forget(thread);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_lives_while_kept_and_says_dead_once_its_keeper_stops() {
        // A process's death is what tests/processes.rs kills a responder for; here, the
        // word's two values and the keeper's list given back (a later thread exit of this
        // process must find the C library's list, not the word's).
        let words = Arc::new((AtomicU64::new(0), AtomicU32::new(0)));
        assert!(!lives(words.1.load(Ordering::SeqCst)), "no keeper, no life");
        let keeper = Keeper::start(Arc::clone(&words), &words.0, &words.1).unwrap();
        let tid = words.1.load(Ordering::SeqCst);
        assert!(lives(tid), "{tid:#x}");
        assert_ne!(words.0.load(Ordering::SeqCst), 0, "the entry points at the keeper's list head");
        drop(keeper);
        assert_eq!(words.1.load(Ordering::SeqCst), DEAD);
        assert!(!lives(DEAD));
        assert!(!lives(tid | FUTEX_OWNER_DIED), "as the kernel marks a dead keeper's word");
        assert_eq!(Arc::strong_count(&words), 1, "the keeper let go of the memory");
    }
}
