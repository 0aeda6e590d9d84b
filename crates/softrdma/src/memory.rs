//! The device's view of the process's memory: the one place that touches memory by address.
//!
//! The engine reaches registered memory only through [`ProcessMemory`], and only after its
//! own key, protection-domain, access and bounds checks against a live memory region. What
//! makes the raw accesses below sound is the rule the rest of the crate keeps:
//!
//! 1. **Every registered range stays allocated while it is registered.** A [`crate::Mr`]
//!    owns its [`MrBuf`] and deregisters (under the device lock) before the buffer is freed;
//!    [`crate::Pd::reg_mr_raw`] is `unsafe` and makes its caller promise the same.
//! 2. **The device lock serialises every access this process makes.** The engine runs
//!    under the driver's mutex, and so do [`crate::Mr`]'s methods that let the owner read or
//!    write its buffer. No Rust reference to registered memory exists outside that lock, so
//!    a remote WRITE can never race a Rust reference.
//!
//! One kind of access takes no lock of this process: the atomics a requester of this host
//! applies itself, through its responder's grant, on its own mapping of a region's memfd
//! ([`MrBuf::zeroed_shared`], `softrdma_engine::direct`): another process's, or another
//! device context's of this one. They are the CPU's atomics on the same physical words, so
//! they are atomic with the engine's atomics ([`ProcessMemory::fetch_add`] and
//! [`ProcessMemory::compare_swap`] are the CPU's too) and with each other. A Rust reference
//! to the bytes is never made while they may run: [`crate::Mr`]'s methods close the
//! inbox's gate and wait for the requesters inside first (`State::paused`). The engine's
//! plain copies (a WRITE's payload, a READ's data) are not paused: a copy that covers a word
//! a direct atomic changes meanwhile reads or leaves either value, which is what the IBTA
//! allows a NIC (atomics are atomic only with respect to other atomics: a WRITE or READ on
//! the same bytes at the same time leaves them undefined). Those copies go through raw
//! pointers, as a NIC's DMA does, never through a reference.
//!
//! A region registered **on demand** (`IBV_ACCESS_ON_DEMAND`, including the implicit one
//! that covers the whole address space) makes no such promise: its pages may be unmapped,
//! or not writable, when the device gets there, as with an ODP NIC. Every access that
//! touches such a range first asks the kernel to fault its pages in
//! (`MADV_POPULATE_READ`/`_WRITE`, which fail with `EFAULT` where the access would have
//! raised SIGSEGV or SIGBUS): an access the pages do not allow is a [`MemoryFault`], which
//! the engine turns into the error completion or NAK it owes, never a crash. (A page the
//! application unmaps in the instant between that and the copy is not covered, as it is
//! not for any region: unmapping memory the device is using is the application's race.)

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

use softrdma_engine::{Memory, MemoryFault};

/// Registered memory by virtual address, in this process.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcessMemory;

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        if buf.is_empty() {
            return Ok(());
        }
        fault_in(addr, buf.len() as u64, false)?;
        // SAFETY: the engine calls this only for a range inside a live memory region, after
        // its key, bounds and access checks; the region is allocated while registered and
        // no Rust reference to it exists while the device lock is held (module
        // documentation: a granted requester's atomics may change words meanwhile, as a
        // NIC's atomics would, and the copy then has either value).
        unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        if data.is_empty() {
            return Ok(());
        }
        fault_in(addr, data.len() as u64, true)?;
        // SAFETY: as for `read`; the region allows the write (the engine checked the access
        // flags), and `data` is engine-owned memory, never inside the target range.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len()) };
        Ok(())
    }

    /// `process_vm_readv` from the sending process straight into the region: the kernel
    /// reads the other process's memory through its own checks (its mappings, and the
    /// right to ptrace it), so a bad address there is an error here, not a fault.
    fn pull(&mut self, addr: u64, origin: u32, from: u64, len: usize) -> Result<(), MemoryFault> {
        if len == 0 {
            return Ok(());
        }
        fault_in(addr, len as u64, true)?;
        // SAFETY: as for `write`: the range is inside a live region the engine checked for
        // this write, and no Rust reference covers it (the device lock is held).
        unsafe { softrdma_udp::local::read_process_into(origin, from, addr as usize as *mut u8, len) }
            .map_err(|_| MemoryFault { addr, len })
    }

    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault> {
        let word = atomic_at(addr)?;
        Ok(match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(old) | Err(old) => old,
        })
    }

    fn fetch_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault> {
        Ok(atomic_at(addr)?.fetch_add(add, Ordering::SeqCst))
    }

    fn atomic_write(&mut self, addr: u64, value: [u8; 8]) -> Result<(), MemoryFault> {
        atomic_at(addr)?.store(u64::from_ne_bytes(value), Ordering::SeqCst);
        Ok(())
    }

    /// A fence; to persistence also `msync(MS_SYNC)` of the range's pages, which writes a
    /// file-backed mapping (a DAX or pmem file, or any file) back to its file before the
    /// FLUSH is answered; anonymous memory has nowhere more durable to go.
    fn flush(&mut self, addr: u64, len: u64, persistent: bool) -> Result<(), MemoryFault> {
        std::sync::atomic::fence(Ordering::SeqCst);
        if !persistent || len == 0 {
            return Ok(());
        }
        let start = addr & !(PAGE - 1);
        let fault = MemoryFault { addr, len: usize::try_from(len).unwrap_or(usize::MAX) };
        let end = addr.checked_add(len).ok_or(fault)?;
        // SAFETY: msync reads no memory of ours; it fails (ENOMEM) for a range with an
        // unmapped page, which is the region's fault, reported as one.
        let rc = unsafe { libc::msync(start as usize as *mut libc::c_void, (end - start) as usize, libc::MS_SYNC) };
        if rc != 0 {
            return Err(fault);
        }
        Ok(())
    }
}

/// The 8 bytes at `addr` as an atomic, if aligned (IBA 9.4.5: atomics need 8-byte alignment).
fn atomic_at(addr: u64) -> Result<&'static AtomicU64, MemoryFault> {
    if addr % 8 != 0 || addr == 0 {
        return Err(MemoryFault { addr, len: 8 });
    }
    fault_in(addr, 8, true)?;
    // SAFETY: aligned and non-null (checked above); the engine checked the 8 bytes lie in a
    // live region that allows atomics, which stays allocated while registered. The
    // 'static lifetime never escapes this module's two callers, which use it at once.
    Ok(unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) })
}

/// The ranges registered on demand in this process (start → end, and how many regions
/// cover exactly that range), and whether there is any: the common case reads one flag.
static ON_DEMAND: RwLock<BTreeMap<(u64, u64), usize>> = RwLock::new(BTreeMap::new());
static ANY_ON_DEMAND: AtomicBool = AtomicBool::new(false);

/// A region on demand at `[addr, addr + len)` was registered.
pub(crate) fn add_on_demand(addr: u64, len: u64) {
    let mut ranges = ON_DEMAND.write().unwrap_or_else(PoisonError::into_inner);
    *ranges.entry((addr, addr.saturating_add(len))).or_default() += 1;
    ANY_ON_DEMAND.store(true, Ordering::Release);
}

/// A region on demand at `[addr, addr + len)` was deregistered.
pub(crate) fn remove_on_demand(addr: u64, len: u64) {
    let mut ranges = ON_DEMAND.write().unwrap_or_else(PoisonError::into_inner);
    let key = (addr, addr.saturating_add(len));
    if let Some(n) = ranges.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            ranges.remove(&key);
        }
    }
    ANY_ON_DEMAND.store(!ranges.is_empty(), Ordering::Release);
}

/// Whether `[addr, addr + len)` touches a range registered on demand.
fn on_demand(addr: u64, len: u64) -> bool {
    if !ANY_ON_DEMAND.load(Ordering::Acquire) {
        return false;
    }
    let end = addr.saturating_add(len);
    ON_DEMAND.read().unwrap_or_else(PoisonError::into_inner).keys().any(|&(s, e)| s < end && addr < e)
}

/// Faults in the pages of `[addr, addr + len)` for reading or writing if the range touches
/// a region on demand (module documentation); a [`MemoryFault`] where the pages are not
/// mapped, or not mapped for that access.
fn fault_in(addr: u64, len: u64, write: bool) -> Result<(), MemoryFault> {
    if !on_demand(addr, len) {
        return Ok(());
    }
    populate(addr, len, write).map_err(|_| MemoryFault { addr, len: usize::try_from(len).unwrap_or(usize::MAX) })
}

/// Whether every page of `[addr, addr + len)` is mapped in this process (`mincore`, which
/// answers `ENOMEM` for a hole, without faulting anything in): what a plain registration
/// checks, as the kernel's pinning fails with `EFAULT` on unmapped memory.
pub(crate) fn mapped(addr: u64, len: u64) -> bool {
    const CHUNK: u64 = 64 << 20;
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len) else { return false };
    let mut at = addr & !(PAGE - 1);
    let mut residency = vec![0u8; (CHUNK / PAGE) as usize];
    while at < end {
        let n = (end - at).min(CHUNK);
        // SAFETY: mincore only reads the page tables of the range and writes one byte per
        // page into `residency`, which holds CHUNK / PAGE >= n / PAGE (rounded up) bytes.
        let rc = unsafe { libc::mincore(at as usize as *mut libc::c_void, n as usize, residency.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        at += n;
    }
    true
}

/// Asks the kernel to map the pages of `[addr, addr + len)` as an access of that kind would
/// (`ibv_advise_mr`'s prefetch does this too); `EFAULT` (or `ENOMEM` for an unmapped hole)
/// where the access would fault.
pub(crate) fn populate(addr: u64, len: u64, write: bool) -> rustix::io::Result<()> {
    let start = addr & !(PAGE - 1);
    let end = addr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
    let advice = if write { rustix::mm::Advice::LinuxPopulateWrite } else { rustix::mm::Advice::LinuxPopulateRead };
    // SAFETY: populating page tables changes no memory contents and no mapping; it only
    // faults in what an access would, or reports that the access would fail.
    unsafe { rustix::mm::madvise(start as usize as *mut std::ffi::c_void, (end - start) as usize, advice) }
}

/// Page-aligned, zeroed memory that a [`crate::Mr`] owns: its address never changes while it
/// lives, which is what a registration needs.
///
/// A region of [`MAP_AT_LEAST`] bytes or more is an anonymous mapping of its own: the kernel
/// gives it zeroed pages as they are first touched, so registering 2 GiB costs no memory until
/// the application or a peer writes it (the allocator's `alloc_zeroed` at page alignment
/// writes every byte up front). Smaller regions come from the allocator.
///
/// A region that allows remote atomics is a shared mapping of a memfd of its own
/// ([`MrBuf::zeroed_shared`]), which a process of this host that the device granted it
/// to can map too, and apply its atomics there itself (`softrdma_engine::direct`).
#[derive(Debug)]
pub(crate) struct MrBuf {
    ptr: NonNull<u8>,
    len: usize,
    mapped: bool,
    /// The memfd it maps, for a [`SharedRegion`].
    memfd: Option<std::os::fd::OwnedFd>,
}

/// A region's memory that other processes of the host may map: the memfd that holds it
/// (its descriptor in this process, and its inode, which a process that opens it by
/// `/proc/<pid>/fd/<fd>` checks), and where its first byte is in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedRegion {
    pub(crate) fd: i32,
    pub(crate) ino: u64,
    pub(crate) offset: u64,
}

/// The most buffers [`MrBuf::zeroed_shared`] makes memfds for at once: each holds a
/// descriptor open, and a process's limit is often 1024.
const MAX_SHARED: usize = 256;

/// The memfd-backed buffers of this process, by address: start → (length, fd, inode).
static SHARED: RwLock<BTreeMap<u64, (u64, i32, u64)>> = RwLock::new(BTreeMap::new());
/// How many memfds [`MrBuf::zeroed_shared`] holds or is making: a place is taken before the
/// memfd is made, so that threads registering at once never pass [`MAX_SHARED`].
static SHARED_PLACES: AtomicUsize = AtomicUsize::new(0);

/// The memfd holding `addr .. addr + len`, if one buffer of [`MrBuf::zeroed_shared`] holds
/// the whole range.
pub(crate) fn shared_region(addr: u64, len: u64) -> Option<SharedRegion> {
    let map = SHARED.read().unwrap_or_else(PoisonError::into_inner);
    let (&start, &(length, fd, ino)) = map.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + length).then_some(SharedRegion { fd, ino, offset: addr - start })
}

/// The size from which [`MrBuf`] maps its bytes instead of allocating them.
const MAP_AT_LEAST: usize = 1 << 20;

// SAFETY: MrBuf owns its allocation like a Box<[u8]>; it is only read or written through
// the device lock (module documentation).
unsafe impl Send for MrBuf {}
// SAFETY: as above: shared references give no unsynchronised access to the bytes.
unsafe impl Sync for MrBuf {}

/// Alignment of the memory [`crate::Pd::reg_mr`] allocates: a page, as registered memory usually is.
pub const MR_ALIGN: usize = 4096;
/// A page, for the system calls that work by pages.
const PAGE: u64 = MR_ALIGN as u64;

impl MrBuf {
    /// `len` zero bytes (at least one), page aligned. `None` if the allocation fails.
    pub(crate) fn zeroed(len: usize) -> Option<Self> {
        if len >= MAP_AT_LEAST {
            use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous};
            // SAFETY: a fresh private anonymous mapping at an address the kernel picks
            // overlaps no memory anyone uses; it is unmapped only in `drop`.
            let ptr = unsafe {
                mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
            }
            .ok()?;
            return Some(Self { ptr: NonNull::new(ptr.cast())?, len, mapped: true, memfd: None });
        }
        let layout = Layout::from_size_align(len.max(1), MR_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Self { ptr, len, mapped: false, memfd: None })
    }

    /// `len` zero bytes (at least one) in a memfd of their own, mapped shared, which other
    /// processes of the user may map too ([`shared_region`]). The file is sealed against
    /// shrinking and growing, so that no mapping of it, here or there, can find its pages
    /// gone (SIGBUS); it is never used for another buffer, so a mapping another process
    /// keeps after this buffer is gone reaches pages nobody else has. Where a memfd cannot
    /// be made (no descriptor left), the buffer is a private one, as [`zeroed`](Self::zeroed).
    pub(crate) fn zeroed_shared(len: usize) -> Option<Self> {
        use rustix::fs::{MemfdFlags, SealFlags};
        use rustix::mm::{MapFlags, ProtFlags};
        if SHARED_PLACES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_SHARED).then_some(n + 1))
            .is_err()
        {
            return Self::zeroed(len); // a descriptor each: leave the process its own
        }
        let unshared = || {
            SHARED_PLACES.fetch_sub(1, Ordering::AcqRel);
            Self::zeroed(len)
        };
        let size = (len.max(1) as u64).next_multiple_of(PAGE);
        let made = rustix::fs::memfd_create("softrdma-mr", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .and_then(|fd| rustix::fs::ftruncate(&fd, size).map(|()| fd))
            .and_then(|fd| {
                rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).map(|()| fd)
            })
            .and_then(|fd| rustix::fs::fstat(&fd).map(|st| (fd, st.st_ino)));
        let Ok((fd, ino)) = made else { return unshared() };
        // SAFETY: a fresh shared mapping, at an address the kernel picks, of a file of
        // `size` bytes that can neither shrink nor grow; it is unmapped only in `drop`.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size as usize,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        };
        let Ok(ptr) = ptr else { return unshared() };
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap returns a non-null address");
        let addr = ptr.as_ptr() as usize as u64;
        use std::os::fd::AsRawFd;
        SHARED.write().unwrap_or_else(PoisonError::into_inner).insert(addr, (size, fd.as_raw_fd(), ino));
        Some(Self { ptr, len, mapped: true, memfd: Some(fd) })
    }

    /// The first byte's address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes. Callers hold the device lock, and for a region others may have a grant
    /// for, the gate closed (`State::paused`; module documentation).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds `len` initialised bytes; callers hold the device lock
        // with the gate closed, so neither the device nor a requester applying a granted
        // atomic writes them while this reference lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable. Callers hold the device lock, and the gate closed, as for
    /// [`bytes`](Self::bytes).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as for `bytes`; callers hold the device lock for the reference's whole
        // life and never make two of them at once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MrBuf {
    fn drop(&mut self) {
        if self.mapped {
            let len = if self.memfd.is_some() {
                SHARED.write().unwrap_or_else(PoisonError::into_inner).remove(&self.addr());
                SHARED_PLACES.fetch_sub(1, Ordering::AcqRel);
                (self.len.max(1) as u64).next_multiple_of(PAGE) as usize
            } else {
                self.len
            };
            // SAFETY: mapped in `zeroed` or `zeroed_shared` with this address and length;
            // the region was deregistered before the buffer drops (module documentation).
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), len) };
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len.max(1), MR_ALIGN) {
            // SAFETY: allocated in `zeroed` with this same layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_memory_reads_writes_and_does_atomics_on_a_buffer() {
        let buf = MrBuf::zeroed(64).unwrap();
        assert_eq!(buf.addr() % MR_ALIGN as u64, 0);
        let mut mem = ProcessMemory;
        mem.write(buf.addr() + 8, &7u64.to_ne_bytes()).unwrap();
        assert_eq!(mem.fetch_add(buf.addr() + 8, 5).unwrap(), 7);
        assert_eq!(mem.compare_swap(buf.addr() + 8, 12, 99).unwrap(), 12);
        assert_eq!(mem.compare_swap(buf.addr() + 8, 12, 1).unwrap(), 99, "no swap when unequal");
        let mut out = [0u8; 8];
        mem.read(buf.addr() + 8, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 99);
        assert_eq!(mem.fetch_add(buf.addr() + 4, 1), Err(MemoryFault { addr: buf.addr() + 4, len: 8 }));
    }

    #[test]
    fn threads_making_shared_buffers_at_once_never_pass_the_cap_and_give_their_places_back() {
        // Other tests of this binary may hold places meanwhile: they leave this one fewer,
        // never more.
        let bufs: Vec<MrBuf> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..64).map(|_| MrBuf::zeroed_shared(100).unwrap()).collect::<Vec<_>>()))
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        let shared = bufs.iter().filter(|b| b.memfd.is_some()).count();
        assert!(shared > 0 && shared <= MAX_SHARED, "{shared} memfds for 512 buffers");
        for b in bufs.iter().filter(|b| b.memfd.is_some()) {
            assert_eq!(shared_region(b.addr(), 100).map(|r| r.offset), Some(0));
        }
        let unshared = bufs.iter().find(|b| b.memfd.is_none()).expect("past the cap: private buffers");
        assert_eq!(shared_region(unshared.addr(), 1), None);
        drop(bufs);
        assert!(MrBuf::zeroed_shared(100).unwrap().memfd.is_some(), "the places are free again");
    }
}
