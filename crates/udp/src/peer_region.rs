//! Another process's registered memory, mapped here: where a requester applies atomics
//! the responder's device granted it (`softrdma_engine::direct`).
//!
//! A responder's region that allows remote atomics is a memfd of its own, sealed against
//! shrinking and growing. A requester opens it as `/proc/<pid>/fd/<fd>`, which the kernel
//! allows to a process of the same user that may inspect the other (the ptrace *read*
//! check: any process of the user may, under every Yama `ptrace_scope`, unless the other
//! made itself undumpable), so mapping it reaches nothing the requester's user could not
//! reach without softrdma. What the grant names is checked before anything is mapped:
//! the file's inode (a descriptor number reused since names another file), that it is
//! sealed against shrinking (else a peer could truncate it under the mapping and a touch
//! past its new end would be SIGBUS here), and that the region lies inside it. The
//! mapping is touched only by 64-bit atomics, as the responder's own engine touches the
//! region for atomics, so that no access here is a data race with another process.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};

/// A shared mapping of another process's memfd.
pub struct PeerRegion {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory reached only through atomics (`word`); any thread
// may make them.
unsafe impl Send for PeerRegion {}
// SAFETY: as above.
unsafe impl Sync for PeerRegion {}

impl std::fmt::Debug for PeerRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRegion").field("len", &self.len).finish_non_exhaustive()
    }
}

impl PeerRegion {
    /// Maps descriptor `fd` of process `pid`, which must be the memfd with inode `ino`,
    /// sealed against shrinking, of at least `need` bytes.
    pub fn open(pid: u32, fd: u32, ino: u64, need: u64) -> io::Result<PeerRegion> {
        let refuse = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        // What it names, held before it is opened (an O_PATH descriptor opens nothing):
        // opening a device or a FIFO may do something, and the number may name another
        // file by the time a second look at the path would open it.
        let held = rustix::fs::open(
            format!("/proc/{pid}/fd/{fd}"),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let named = rustix::fs::fstat(&held)?;
        if named.st_ino != ino
            || rustix::fs::FileType::from_raw_mode(named.st_mode) != rustix::fs::FileType::RegularFile
        {
            return Err(refuse("the descriptor names another file than the grant's"));
        }
        // That very file, opened for reading and writing.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", held.as_raw_fd()))?;
        let meta = file.metadata()?;
        if meta.ino() != ino || meta.dev() != named.st_dev || !meta.file_type().is_file() {
            return Err(refuse("the descriptor names another file than the grant's"));
        }
        if !rustix::fs::fcntl_get_seals(&file)?.contains(SealFlags::SHRINK) {
            return Err(refuse("the file can shrink under a mapping"));
        }
        if meta.len() < need {
            return Err(refuse("the region lies past the file's end"));
        }
        let len = usize::try_from(meta.len()).map_err(|_| refuse("the file is larger than the address space"))?;
        // SAFETY: a fresh shared mapping, at an address the kernel picks, of a file sealed
        // against shrinking: every page of it stays backed while it is mapped. It is
        // unmapped only in `drop`.
        let p = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &file, 0)
        }?;
        Ok(PeerRegion { base: NonNull::new(p.cast()).expect("mmap returns a non-null address"), len })
    }

    /// The file's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: a memfd region has a page at least).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 64-bit word at byte `offset`, if it is aligned and inside.
    fn word(&self, offset: u64) -> Option<&AtomicU64> {
        let offset = usize::try_from(offset).ok()?;
        if offset % 8 != 0 || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: in bounds and aligned (checked; the mapping is page-aligned), and the
        // mapping lives as long as `self`; other processes write it, so it is reached only
        // through atomics.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() })
    }

    /// Adds `add` to the word at `offset` (wrapping); the value found.
    pub fn fetch_add(&self, offset: u64, add: u64) -> Option<u64> {
        Some(self.word(offset)?.fetch_add(add, Ordering::SeqCst))
    }

    /// Stores `swap` at `offset` if the word there is `compare`; the value found.
    pub fn compare_swap(&self, offset: u64, compare: u64, swap: u64) -> Option<u64> {
        let word = self.word(offset)?;
        Some(word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst).unwrap_or_else(|found| found))
    }
}

impl Drop for PeerRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`; no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn memfd(len: u64, seals: SealFlags) -> (std::os::fd::OwnedFd, u64) {
        use rustix::fs::MemfdFlags;
        let fd = rustix::fs::memfd_create("peer-region-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        if !seals.is_empty() {
            rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        }
        let ino = rustix::fs::fstat(&fd).unwrap().st_ino;
        (fd, ino)
    }

    #[test]
    fn atomics_on_a_mapping_reach_the_owners_memory() {
        let (fd, ino) = memfd(4096, SealFlags::SHRINK | SealFlags::GROW);
        let pid = std::process::id();
        let raw = fd.as_raw_fd() as u32;
        let a = PeerRegion::open(pid, raw, ino, 4096).unwrap();
        let b = PeerRegion::open(pid, raw, ino, 64).unwrap();
        assert_eq!(a.fetch_add(8, 5), Some(0));
        assert_eq!(b.compare_swap(8, 5, 9), Some(5), "the other mapping saw the add");
        assert_eq!(a.fetch_add(8, 0), Some(9));
        assert_eq!(a.fetch_add(4, 1), None, "unaligned");
        assert_eq!(a.fetch_add(4096, 1), None, "past the end");
        assert_eq!(a.fetch_add(4088, 1), Some(0), "the last word");
    }

    #[test]
    fn what_a_grant_could_lie_about_is_refused() {
        let pid = std::process::id();
        let (fd, ino) = memfd(4096, SealFlags::SHRINK);
        let raw = fd.as_raw_fd() as u32;
        assert!(PeerRegion::open(pid, raw, ino + 1, 8).is_err(), "another inode");
        assert!(PeerRegion::open(pid, raw, ino, 4097).is_err(), "a region past the end");
        let (growable, gino) = memfd(4096, SealFlags::empty());
        assert!(PeerRegion::open(pid, growable.as_raw_fd() as u32, gino, 8).is_err(), "not sealed against shrinking");
        assert!(PeerRegion::open(pid, 1 << 30, ino, 8).is_err(), "no such descriptor");
        // A descriptor that is no regular file is not even opened (a FIFO here).
        let (r, w) = std::io::pipe().unwrap();
        let fifo_ino = rustix::fs::fstat(&r).unwrap().st_ino;
        let err = PeerRegion::open(pid, w.as_raw_fd() as u32, fifo_ino, 8).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
