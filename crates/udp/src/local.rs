//! Datagrams between processes of one host through shared memory, instead of through the
//! kernel's UDP stack.
//!
//! Each process that uses a device makes an [`Inbox`]: a file in `/dev/shm`, mode 0600,
//! named by its user, network namespace, device, port and slot ([`inbox_name`]), so that a
//! sender finds it from nothing but a packet's destination: an address of the same device
//! and a destination QPN, whose slot (QPN >> 13, see [`crate::host`]) names the process.
//! The inbox holds [`LANES`] single-producer rings of [`SLOTS`] datagrams each; a sender
//! ([`Outbox`]) claims one lane (its process ID in the lane's owner word, taken back from a
//! process that is gone) and is its only producer, the inbox's owner its only consumer.
//!
//! What travels is exactly what the socket would have carried: a whole RoCE packet (ICRC
//! included) and the envelope and IP fields the receiver would have read from the kernel.
//! The engine above sees no difference: its checks, its ordering and its retries are the
//! same, only the two system calls, the kernel's two copies and the loopback interface are
//! gone. A full lane keeps the datagrams in the sender's backlog, in order (the engine's
//! windows bound it), rather than dropping them.
//!
//! **Waking a receiver.** A receiver's thread that is about to sleep in `poll` on the
//! inbox's bell counts itself in the inbox's sleepers ([`Sleepers::sleep_if_empty`]), and a
//! sender that published datagrams looks ([`Outbox::wake`]) and, if anyone sleeps, rings
//! the bell: a FIFO beside the inbox (`<name>.bell`, mode 0600), which the receiver holds
//! open for reading and polls with its sockets. Sender and receiver each write
//! their word before they read the other's (sequentially consistent), so one of them always
//! sees the other: no wake-up is lost. A count, not a flag: two threads of the receiver may
//! take turns watching the bell, and one waking must not unregister the other.
//!
//! **Seeing a datagram.** A sender writes its entries, then publishes them once per batch
//! ([`Outbox::wake`]): its lane's head, then each entry's stamp (`E_STAMP`). A polling
//! receiver reads, for a lane whose owner stamps, the header of the entry after its tail
//! (one line from the sender's core per datagram, the one it reads anyway), and for any
//! other lane that has an owner, its head. The file's sequence number is bumped only when
//! a sender claims a lane (the receiver then reads the owners again), not per batch as in
//! earlier builds, where every post of a one-WR-at-a-time program moved that line between
//! the two cores as well as the head's (a third of a `ib_send_bw -s 64` sender's time went
//! there). A receiver of an earlier build, which looks at the lanes only when the number
//! moves, says so by lacking `FEATURE_HEADS`, and its senders bump it after every batch;
//! a sender of an earlier build bumps it after every batch anyway, and the receiver reads
//! the owners then.
//!
//! **Memory.** An inbox file is 18 MB, sparse: its headers' pages are allocated when it is
//! made, a lane's (1.1 MB) when a sender claims it (`fallocate`, so that a full `/dev/shm`
//! refuses the lane, and the sender stays on the sockets, instead of killing a process with
//! SIGBUS when a page is first touched).
//!
//! **Who can use it.** Only processes of the inbox owner's user can open its files
//! ([`Outbox::open`] also refuses files another user owns), as file permissions decide, so
//! Yama's `ptrace_scope` and other ptrace rules do not matter. A process of the same user
//! could send the receiver UDP datagrams anyway: through the inbox it can do no more than
//! that. A lane's contents are copied out before they are parsed, so a misbehaving producer
//! can give wrong datagrams (which the engine checks like any from the network) but cannot
//! change one while it is read.
//!
//! **Data by reference.** A packet may say (a flag beside it) that its data is not in it
//! but in the sender's memory, for the receiver to copy with `process_vm_readv`: one copy
//! where four would move it through the lane (`softrdma_engine::reference`). That copy
//! needs what the kernel asks of it, the right to ptrace the sender (same user, the
//! sender dumpable, and Yama's `ptrace_scope` 0, or 1 with the receiver an ancestor). So a
//! receiver says, per lane, whether it can ([`Outbox::pulls`]): when it first takes
//! datagrams from a new owner it reads a word the owner named in the lane's header, from
//! the owner's memory, and finds there the random value the header gives or not (a copy
//! refused, or a PID reused by another process, gives a no). A sender sends data by
//! reference only once the receiver said yes. The receiver copies only into registered
//! memory its engine checked, and only from the lane's owner.
//!
//! The inbox, lanes and headers included, is writable by every process of the user, so the
//! receiver cannot know which of them wrote an entry: one could put an entry by reference
//! in another's lane and have the receiver copy from that process. So a receiver takes data
//! by reference only where that gives nobody more than they have
//! ([`copying_adds_no_reach`]): where any process of the user may read any other's memory
//! as far as the kernel lets this one (Yama's `ptrace_scope` absent or 0, and this process
//! holding no `CAP_SYS_PTRACE` beyond its user's, unless it is root, whose inbox only root's
//! processes can write).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use rustix::mm::{MapFlags, ProtFlags};
use rustix::process::Pid;

use crate::{Envelope, IpInfo};

/// Producers an inbox admits at once (one per sending process and device).
pub const LANES: usize = 16;
/// Datagrams a lane holds.
pub const SLOTS: usize = 256;
/// The largest datagram a lane carries (a 4096-byte payload and every header and trailer,
/// with room to spare).
pub const DATAGRAM_MAX: usize = 4096 + 256;

const MAGIC: u64 = u64::from_be_bytes(*b"sRDMAinb");
/// 2: packets may come without their ICRC (they cross no wire; a receiver of version 1
/// checked it).
const VERSION: u32 = 2;
/// The file's header: magic, version, geometry, owner, closed, sleepers; then on a cache
/// line of its own the sequence number senders bump after each batch.
const HEADER: usize = 128;
/// A lane's header: the owner word, then head and tail each on its own cache line.
const LANE_HEADER: usize = 192;
/// An entry: its header (length, envelope, IP fields), then the datagram.
const ENTRY_HEADER: usize = 64;
const ENTRY: usize = ENTRY_HEADER + DATAGRAM_MAX;
/// The bytes of an entry's datagram a receiver copies with its header, before it knows the
/// datagram's length: one cache line.
const FIRST_LINE: usize = 64;
const _: () = assert!(FIRST_LINE <= DATAGRAM_MAX, "the first copy stays in its entry");
const ENTRIES_AT: usize = (HEADER + LANES * LANE_HEADER).next_multiple_of(4096);
/// The file's size.
pub const INBOX_BYTES: usize = ENTRIES_AT + LANES * SLOTS * ENTRY;

// Header fields.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_LANES: usize = 12;
const H_SLOTS: usize = 16;
const H_ENTRY: usize = 20;
const H_PID: usize = 24;
const H_CLOSED: usize = 32;
const H_SLEEPERS: usize = 36;
/// What the receiver does beyond its version's minimum ([`FEATURE_PULLS`]).
const H_FEATURES: usize = 40;
/// The receiver copies data carried by reference from its senders' memory, where it can
/// ([`Outbox::pulls`]).
const FEATURE_PULLS: u32 = 1;
/// The receiver takes an ACK beside a packet ([`AckBeside`], [`Outbox::acks_beside`]).
const FEATURE_ACKS_BESIDE: u32 = 2;
/// The receiver reads the heads of the lanes that have owners on every look: a sender
/// bumps [`H_SEQ`] when it claims a lane, not after every batch.
const FEATURE_HEADS: u32 = 4;
/// Bumped by a sender when it claims a lane (and, for a receiver without
/// [`FEATURE_HEADS`], after each batch it published): a receiver that finds it changed
/// reads the lanes' owners again.
const H_SEQ: usize = 64;
/// The receiver takes grants beside atomics' answers, and keeps a gate for the senders
/// that apply atomics to its memory on their own ([`Grant`], [`Outbox::enter_gate`]).
const FEATURE_GRANTS: u32 = 8;
/// The gate: the grant epoch under which senders may apply atomics to the receiver's
/// memory themselves, or [`GATE_CLOSED`] (on the sequence number's line, which senders
/// write only when they claim a lane, not on the first, whose sleepers the receiver
/// writes whenever it sleeps).
const H_GATE: usize = 72;
/// The gate's value when no grant holds.
const GATE_CLOSED: u64 = u64::MAX;
/// The receiver keeps a life word ([`H_LIFE`]): a sender knows at once, from memory, that
/// it died ([`Outbox::is_closed`]). Grants go only with it.
const FEATURE_LIFE: u32 = 16;
/// The life word's place on the kernel's robust list (`crate::life`), then the word, on
/// the gate's line, which a sender reads before each atomic it applies.
const H_LIFE_ENTRY: usize = 80;
const H_LIFE: usize = 88;
// Lane fields (from the lane header).
const L_OWNER: usize = 0;
/// Whether the receiver can copy from the lane's owner: [`PULLS_UNKNOWN`], [`PULLS_YES`]
/// or [`PULLS_NO`], written by the receiver once it tried ([`probe`]).
const L_PULLS: usize = 8;
/// Where the owner's [`PROBE`] word is in its memory, and what it holds.
const L_PROBE: usize = 16;
const L_TOKEN: usize = 24;
const PULLS_UNKNOWN: u32 = 0;
const PULLS_YES: u32 = 1;
const PULLS_NO: u32 = 2;
/// The process that stamps the lane's entries ([`E_STAMP`]): the owner, if it is of a build
/// that does (an owner of an earlier build leaves the last one's PID here).
const L_STAMPS: usize = 32;
/// When the lane's owner started (`/proc/<pid>/stat`'s start time), 0 if unknown, and
/// the PID of the owner it is of (written after it): a process found under the owner's
/// PID that started at another time is not the owner, but one that reused the dead
/// owner's PID ([`owner_gone`]).
const L_BORN: usize = 40;
const L_BORN_OF: usize = 48;
const L_HEAD: usize = 64;
/// 1 while the lane's owner applies an atomic to the receiver's memory on its own
/// ([`Outbox::enter_gate`]); on the head's line, which the owner writes anyway.
const L_INSIDE: usize = 72;
const L_TAIL: usize = 128;
/// An entry's stamp: [`stamp_of`] its index once it is published, written by the sender
/// after the lane's head ([`Outbox::wake`]). A receiver that polls the entry after its tail
/// (its header line, which it reads anyway) sees a new datagram with one line from the
/// sender's core, not two (the head's, then the entry's).
const E_STAMP: usize = 18;

/// The stamp of the entry with index `index`: never 0 (what `put` writes, and an earlier
/// build's senders leave), and different from the stamp the slot held a lap before.
fn stamp_of(index: u64) -> u16 {
    (index % 32767) as u16 + 1
}

/// The inbox of `slot` on `device`/`port`, for this user and network namespace.
pub fn inbox_name(device: &str, port: u16, slot: u32) -> io::Result<String> {
    let device: String = device.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    Ok(format!("{}{device}.{port}.{slot}", prefix()?))
}

/// The start of every inbox name of this user and network namespace.
fn prefix() -> io::Result<String> {
    let netns = std::fs::metadata("/proc/self/ns/net")?.ino();
    let uid = rustix::process::getuid().as_raw();
    Ok(format!("softrdma.{uid}.{netns}."))
}

/// A word of this process's memory that holds a random value, for a receiver to read
/// from here with `process_vm_readv` ([`probe`]): if it finds the value the lane's header
/// gives, the lane's owner is the process it can copy from.
static PROBE: AtomicU64 = AtomicU64::new(0);

/// [`PROBE`]'s value, drawn the first time.
fn probe_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let token = PROBE.load(Ordering::Relaxed);
    if token != 0 {
        return token;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(my_pid());
    let fresh = h.finish() | 1;
    match PROBE.compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => fresh,
        Err(drawn) => drawn,
    }
}

/// Copies `buf.len()` bytes from address `from` of process `pid` (`process_vm_readv`).
pub fn read_process(pid: u32, from: u64, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: `buf` is borrowed mutably for the call: `buf.len()` bytes writable.
    unsafe { read_process_into(pid, from, buf.as_mut_ptr(), buf.len()) }
}

/// Copies `len` bytes from address `from` of process `pid` to `to` (`process_vm_readv`).
/// The kernel checks the remote range against the other process's mappings and the right
/// to read it; a copy short of `len` (a hole there) is an error.
///
/// # Safety
/// `to .. to + len` must be writable memory of this process that no Rust reference covers
/// while the call runs: the kernel writes it.
pub unsafe fn read_process_into(pid: u32, from: u64, to: *mut u8, len: usize) -> io::Result<()> {
    let local = libc::iovec { iov_base: to.cast(), iov_len: len };
    let remote = libc::iovec { iov_base: from as usize as *mut libc::c_void, iov_len: len };
    // SAFETY: the local range is writable and unaliased (the caller's promise); the remote
    // one is only read, by the kernel, through its own checks.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    match usize::try_from(n) {
        Ok(n) if n == len => Ok(()),
        Ok(_) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a partial copy")),
        Err(_) => Err(io::Error::last_os_error()),
    }
}

/// Whether copying from other processes on the word of its inbox gives this process's
/// user nothing it has not: Yama's `ptrace_scope` is absent or 0 (then a process of the user
/// may read the memory of any other the kernel lets this one read), and this process holds
/// no `CAP_SYS_PTRACE` its user lacks (root's inbox only root's processes can write). Under
/// `ptrace_scope` 1 this process may read its descendants', which another process of the
/// user may not; an entry that other process put in the inbox would make this one copy
/// from them.
pub fn copying_adds_no_reach() -> bool {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective =
        status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
    adds_no_reach(scope.as_deref(), rustix::process::geteuid().is_root(), effective)
}

/// [`copying_adds_no_reach`] from Yama's `ptrace_scope` (the file's text, `None` without
/// Yama), whether the process is root, and its effective capabilities (`CapEff`).
fn adds_no_reach(ptrace_scope: Option<&str>, root: bool, effective: Option<u64>) -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    if ptrace_scope.is_some_and(|s| s.trim() != "0") {
        return false;
    }
    root || effective.is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) == 0)
}

/// Whether this process can copy from the owner of `lane` (the sender it names in the lane
/// header), decided once per owner: its probe word must be readable and hold its token.
fn probe(map: &Mapping, lane: usize) -> u32 {
    let at = Mapping::lane(lane);
    let owner = map.u32(at + L_OWNER).load(Ordering::Acquire);
    let (addr, token) = (map.u64(at + L_PROBE).load(Ordering::Acquire), map.u64(at + L_TOKEN).load(Ordering::Acquire));
    let mut word = [0u8; 8];
    let can = owner != 0 && read_process(owner, addr, &mut word).is_ok() && u64::from_ne_bytes(word) == token;
    let verdict = if can { PULLS_YES } else { PULLS_NO };
    // Only over "unknown": a new owner that reset the lane since asks again.
    let _ = map.u32(at + L_PULLS).compare_exchange(PULLS_UNKNOWN, verdict, Ordering::AcqRel, Ordering::Relaxed);
    verdict
}

fn my_pid() -> u32 {
    crate::fork::pid()
}

/// Whether process `pid` is gone (not merely beyond our right to signal it).
fn is_gone(pid: u32) -> bool {
    Pid::from_raw(pid as i32).is_none_or(|p| rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH))
}

/// When process `pid` started, in clock ticks since boot (`/proc/<pid>/stat`'s 22nd
/// field), if it can be read.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis (the command may hold spaces and parentheses)
    // come the fields from the 3rd on.
    stat.get(stat.rfind(')')? + 1..)?.split_whitespace().nth(19)?.parse().ok()
}

/// When this process started ([`start_time`]), read once per process.
fn my_start_time() -> u64 {
    static KNOWN: std::sync::Mutex<(u32, u64)> = std::sync::Mutex::new((0, 0));
    let me = my_pid();
    let mut known = KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if known.0 != me {
        *known = (me, start_time(me).unwrap_or(0));
    }
    known.1
}

/// Whether the owner of `lane`, `owner`, is gone: no process has its PID, or the one that
/// has it is another ([`pid_reused`]).
fn owner_gone(map: &Mapping, lane: usize, owner: u32) -> bool {
    is_gone(owner) || pid_reused(map, lane, owner)
}

/// Whether the process under `owner`'s PID started at another time than the owner of
/// `lane` did: it took the dead owner's PID.
fn pid_reused(map: &Mapping, lane: usize, owner: u32) -> bool {
    let at = Mapping::lane(lane);
    if map.u32(at + L_BORN_OF).load(Ordering::Acquire) != owner {
        return false; // not known (an owner of an earlier build, or one claiming it now)
    }
    let born = map.u64(at + L_BORN).load(Ordering::Acquire);
    born != 0 && start_time(owner).is_some_and(|t| t != born)
}

/// Removes the inboxes of this user and network namespace whose processes are gone (killed
/// before they could remove their own): their pages stay in `/dev/shm` until then.
fn sweep() {
    let Ok(prefix) = prefix() else { return };
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(&prefix) && !n.ends_with(".bell")) else {
            continue;
        };
        let Ok(file) = OpenOptions::new().read(true).write(true).open(path_of(name)) else { continue };
        if file.metadata().is_ok_and(|m| m.len() == INBOX_BYTES as u64)
            && let Ok(map) = Mapping::new(&file)
            && map.u64(H_MAGIC).load(Ordering::Acquire) == MAGIC
            // Its PID gone, or its life word dead (the PID may be another process's now).
            && (is_gone(map.u32(H_PID).load(Ordering::Relaxed)) || closed(&map))
        {
            map.u32(H_CLOSED).store(1, Ordering::SeqCst);
            let _ = std::fs::remove_file(path_of(name));
            let _ = std::fs::remove_file(bell_of(name));
        }
    }
}

fn path_of(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name)
}

fn bell_of(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(format!("{name}.bell"))
}

/// Empties a bell ([`Inbox::bell`]) once it polled readable.
pub fn drain_bell(bell: BorrowedFd<'_>) {
    let mut b = [0u8; 256];
    while rustix::io::read(bell, &mut b).is_ok_and(|n| n == b.len()) {}
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A shared mapping of a whole inbox file.
struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics or
// raw copies of bytes that no Rust reference covers, so any thread may make them.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file at least INBOX_BYTES long (the callers
        // set or check its length); nothing else in this process uses the range.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                INBOX_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                file,
                0,
            )
        }?;
        Ok(Mapping { base: NonNull::new(p.cast()).expect("mmap returns a non-null address") })
    }

    #[inline]
    fn u32(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= INBOX_BYTES && off % 4 == 0);
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned), and the
        // mapping lives as long as `self`. Shared memory written by other processes is read
        // only through atomics.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    #[inline]
    fn u16(&self, off: usize) -> &AtomicU16 {
        assert!(off + 2 <= INBOX_BYTES && off % 2 == 0);
        // SAFETY: as for `u32`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU16>() }
    }

    #[inline]
    fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= INBOX_BYTES && off % 8 == 0);
        // SAFETY: as for `u32`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Copies `data` to `off`.
    fn put(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= INBOX_BYTES);
        // SAFETY: in bounds; the range belongs to an entry this process produces and the
        // consumer does not read until the head moves past it (Release), so no one reads it
        // now; `data` is private memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(off), data.len()) };
    }

    /// Copies `buf.len()` bytes from `off`.
    fn get(&self, off: usize, buf: &mut [u8]) {
        assert!(off + buf.len() <= INBOX_BYTES);
        // SAFETY: in bounds; the entry was published (Acquire on the head) and its producer
        // does not reuse it before the tail moves past it; `buf` is private memory.
        unsafe { std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), buf.as_mut_ptr(), buf.len()) };
    }

    fn lane(lane: usize) -> usize {
        HEADER + lane * LANE_HEADER
    }

    fn entry(lane: usize, index: u64) -> usize {
        ENTRIES_AT + (lane * SLOTS + (index % SLOTS as u64) as usize) * ENTRY
    }

    /// The lanes (bit `l`: lane `l`) that have an owner or hold datagrams, and of those the
    /// ones whose owner stamps its entries.
    fn lanes_in_use(&self) -> (u16, u16) {
        (0..LANES).fold((0, 0), |(lanes, stamped), l| {
            let at = Self::lane(l);
            let owner = self.u32(at + L_OWNER).load(Ordering::Acquire);
            let stamps = owner != 0 && self.u32(at + L_STAMPS).load(Ordering::Acquire) == owner;
            let held = self.u64(at + L_HEAD).load(Ordering::Acquire) != self.u64(at + L_TAIL).load(Ordering::Relaxed);
            let bit = 1 << l;
            (if owner != 0 || held { lanes | bit } else { lanes }, if stamps { stamped | bit } else { stamped })
        })
    }

    /// Asks the CPU to fetch the line at `off` (a hint: it reads nothing).
    #[inline]
    fn prefetch(&self, off: usize) {
        #[cfg(target_arch = "x86_64")]
        if off < INBOX_BYTES {
            // SAFETY: a prefetch of an address inside the mapping; it has no effect on memory.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.base.as_ptr().add(off).cast(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    fn pending(&self) -> bool {
        (0..LANES).any(|l| {
            let at = Self::lane(l);
            self.u64(at + L_HEAD).load(Ordering::SeqCst) != self.u64(at + L_TAIL).load(Ordering::Relaxed)
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), INBOX_BYTES) };
    }
}

/// An ACK that a sender put beside a packet to the QP the ACK is for, instead of sending it
/// as a packet of its own (a responder that answers a request at once owes the request's
/// ACK and sends its answer in the same batch): its PSN and its AETH's syndrome and MSN.
/// The receiver takes it just before the packet, where the ACK packet would have been.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckBeside {
    /// The PSN it acknowledges (24 bits).
    pub psn: u32,
    /// The AETH's syndrome byte.
    pub syndrome: u8,
    /// The AETH's MSN (24 bits).
    pub msn: u32,
}

/// What an entry says beside its datagram, which a socket could not have carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Beside {
    /// Its data is carried by reference, for the receiver to copy from the sender (only
    /// where the receiver [`pulls`](Outbox::pulls)).
    pub by_reference: bool,
    /// An ACK to take before it (only where the receiver takes them,
    /// [`Outbox::acks_beside`]).
    pub ack: Option<AckBeside>,
    /// A grant beside an atomic's answer (only where the receiver takes them,
    /// [`Outbox::takes_grants`]).
    pub grant: Option<Grant>,
    /// Beside an atomic's request: the sender holds no grant for it and asks for one with
    /// the answer, whether or not one was sent before (only where the receiver takes
    /// grants).
    pub asks_grant: bool,
}

/// What a responder's device vouches for beside an atomic it executed
/// (`softrdma_engine::AtomicGrant`), and where the region is for the requester to map it
/// ([`crate::peer_region`]): descriptor `fd` of the lane's owner, the memfd with inode
/// `ino`, whose byte `offset` is the region's first. Valid while the owner's inbox gate
/// stands at `epoch` ([`Outbox::enter_gate`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// The responder's QP.
    pub qp: u32,
    /// The region's R_Key.
    pub rkey: u32,
    /// The address peers name the region's first byte by, and its length.
    pub va: u64,
    /// The region's length.
    pub len: u64,
    /// The memfd: its descriptor in the owner, its inode, and the region's offset in it.
    pub fd: u32,
    /// Its inode.
    pub ino: u64,
    /// The region's offset in it.
    pub offset: u64,
    /// The epoch it holds under.
    pub epoch: u64,
}

/// A grant's bytes in an entry, after its datagram.
const GRANT_BYTES: usize = 56;
/// Byte 55 of an entry's header: a [`Grant`] follows the datagram.
const GRANT_FOLLOWS: u8 = 1;
/// Byte 55 of an entry's header: the sender asks for a grant ([`Beside::asks_grant`]).
const ASKS_GRANT: u8 = 2;
/// The longest datagram a grant goes beside (an atomic's answer is 28 bytes).
const GRANTED_MAX: usize = 200;

impl Grant {
    fn encode(&self) -> [u8; GRANT_BYTES] {
        let mut b = [0u8; GRANT_BYTES];
        b[0..4].copy_from_slice(&self.qp.to_le_bytes());
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b[8..16].copy_from_slice(&self.va.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.fd.to_le_bytes());
        b[32..40].copy_from_slice(&self.ino.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.epoch.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Grant> {
        let u32_at = |i: usize| b.get(i..i + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes);
        let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
        Some(Grant {
            qp: u32_at(0)?,
            rkey: u32_at(4)?,
            va: u64_at(8)?,
            len: u64_at(16)?,
            fd: u32_at(24)?,
            ino: u64_at(32)?,
            offset: u64_at(40)?,
            epoch: u64_at(48)?,
        })
    }
}

/// How a datagram came, beside what a socket would have told ([`Inbox::receive`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrived {
    /// For a datagram whose data is carried by reference: the process to copy it from.
    pub origin: Option<u32>,
    /// An ACK to take before the datagram.
    pub ack: Option<AckBeside>,
    /// A grant beside it, and the process that gave it (the lane's owner).
    pub grant: Option<(u32, Grant)>,
    /// The sender asks for a grant with the answer ([`Beside::asks_grant`]).
    pub asks_grant: bool,
}

/// An entry's header: the datagram's length, what the socket would have told, whether its
/// data is carried by reference (byte 52), an ACK beside it (byte 53 says there is one, 54
/// is its syndrome, 56..60 its PSN and 60..64 its MSN), and whether a [`Grant`] follows the
/// datagram in the entry (byte 55: [`GRANT_FOLLOWS`]) or the sender asks for one
/// ([`ASKS_GRANT`]).
fn encode(envelope: &Envelope, ip: IpInfo, len: usize, beside: Beside) -> [u8; ENTRY_HEADER] {
    let mut h = [0u8; ENTRY_HEADER];
    h[52] = u8::from(beside.by_reference);
    h[55] = if beside.grant.is_some() {
        GRANT_FOLLOWS
    } else if beside.asks_grant {
        ASKS_GRANT
    } else {
        0
    };
    if let Some(ack) = beside.ack {
        h[53] = 1;
        h[54] = ack.syndrome;
        h[56..60].copy_from_slice(&(ack.psn & 0xff_ffff).to_le_bytes());
        h[60..64].copy_from_slice(&(ack.msn & 0xff_ffff).to_le_bytes());
    }
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[5] = ip.traffic_class;
    h[6] = ip.hop_limit;
    h[8..10].copy_from_slice(&envelope.src_port().to_le_bytes());
    h[10..12].copy_from_slice(&envelope.dst_port().to_le_bytes());
    h[12..16].copy_from_slice(&ip.flow_label.to_le_bytes());
    match envelope {
        Envelope::V4(e) => {
            h[4] = 4;
            h[7] = u8::from(e.dont_fragment);
            h[16..18].copy_from_slice(&e.identification.to_le_bytes());
            h[20..24].copy_from_slice(&e.src.octets());
            h[36..40].copy_from_slice(&e.dst.octets());
        }
        Envelope::V6(e) => {
            h[4] = 6;
            h[20..36].copy_from_slice(&e.src.octets());
            h[36..52].copy_from_slice(&e.dst.octets());
        }
    }
    h
}

#[inline]
fn decode(h: &[u8]) -> Option<(Envelope, IpInfo, usize, Beside)> {
    let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
    let len = u32::from_le_bytes(h[0..4].try_into().ok()?) as usize;
    let (src, dst): (IpAddr, IpAddr) = match h[4] {
        4 => (
            Ipv4Addr::from(<[u8; 4]>::try_from(&h[20..24]).ok()?).into(),
            Ipv4Addr::from(<[u8; 4]>::try_from(&h[36..40]).ok()?).into(),
        ),
        6 => (
            Ipv6Addr::from(<[u8; 16]>::try_from(&h[20..36]).ok()?).into(),
            Ipv6Addr::from(<[u8; 16]>::try_from(&h[36..52]).ok()?).into(),
        ),
        _ => return None,
    };
    let mut envelope = Envelope::rocev2(src, u16_at(8), dst)?;
    match &mut envelope {
        Envelope::V4(e) => {
            e.dst_port = u16_at(10);
            e.dont_fragment = h[7] != 0;
            e.identification = u16_at(16);
        }
        Envelope::V6(e) => e.dst_port = u16_at(10),
    }
    let ip =
        IpInfo { hop_limit: h[6], traffic_class: h[5], flow_label: u32::from_le_bytes(h[12..16].try_into().ok()?) };
    let u24_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) & 0xff_ffff;
    let ack = (h[53] != 0).then(|| AckBeside { psn: u24_at(56), syndrome: h[54], msn: u24_at(60) });
    // The grant itself follows the datagram: the caller reads it (a placeholder here).
    let grant = (h[55] == GRANT_FOLLOWS && len <= GRANTED_MAX).then(Grant::default);
    let beside = Beside { by_reference: h[52] != 0, ack, grant, asks_grant: h[55] == ASKS_GRANT };
    (len <= DATAGRAM_MAX).then_some((envelope, ip, len, beside))
}

/// This process's inbox on one device: datagrams from other processes of the host.
pub struct Inbox {
    map: Arc<Mapping>,
    path: PathBuf,
    bell_path: PathBuf,
    /// The bell's read end.
    bell: OwnedFd,
    ino: u64,
    /// The process that made it (a child of `fork` inherits the inbox but does not own it).
    pid: u32,
    _file: File,
    /// The datagram being handed over, copied out of its lane.
    scratch: Box<[u8]>,
    /// The lane the next receive starts with (lanes take turns).
    next_lane: usize,
    /// The senders' sequence number when the lanes' owners were last read.
    seen: u64,
    /// The lanes a look reads (bit `l`: lane `l`): those with an owner or datagrams when
    /// the owners were last read.
    lanes: u16,
    /// Of those, the lanes whose owner stamps its entries ([`E_STAMP`]): a look reads the
    /// entry after the tail, not the head.
    stamped: u16,
    /// Calls to [`Inbox::receive`].
    looks: u32,
    /// It takes data by reference ([`Inbox::create`]).
    pulls: bool,
    /// Keeps the life word ([`FEATURE_LIFE`]), where the kernel has robust lists.
    keeper: Option<crate::life::Keeper>,
    /// Lanes whose owner [`close_gate`](Self::close_gate) left inside the gate (bit `l`:
    /// lane `l`).
    undrained: u16,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Inbox {
    /// Makes the inbox `name` ([`inbox_name`]) and its bell; with `pulls`, it takes data
    /// carried by reference, from senders it can copy from ([`Outbox::pulls`]); with
    /// `acks_beside`, ACKs beside packets ([`Outbox::acks_beside`]). An inbox left under
    /// that name by a process that held the slot before is closed (its senders see it and
    /// open the new one) and replaced.
    pub fn create(name: &str, pulls: bool, acks_beside: bool) -> io::Result<Inbox> {
        sweep();
        let path = path_of(name);
        let bell_path = bell_of(name);
        if let Ok(old) = OpenOptions::new().read(true).write(true).open(&path) {
            if old.metadata()?.len() == INBOX_BYTES as u64 {
                Mapping::new(&old)?.u32(H_CLOSED).store(1, Ordering::SeqCst);
            }
            let _ = std::fs::remove_file(&path);
        }
        // The bell first: a sender that finds the inbox finds its bell.
        let _ = std::fs::remove_file(&bell_path);
        rustix::fs::mkfifoat(rustix::fs::CWD, &bell_path, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR)?;
        // Read-write, so that it never reads end-of-file and a sender always finds a reader.
        let bell = rustix::fs::open(
            &bell_path,
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
        file.set_len(INBOX_BYTES as u64)?;
        // The headers' pages now (lanes' pages as senders claim them): a page of a full
        // /dev/shm first touched through the mapping would be SIGBUS, not an error.
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, ENTRIES_AT as u64)?;
        let ino = file.metadata()?.ino();
        let map = Arc::new(Mapping::new(&file)?);
        map.u32(H_VERSION).store(VERSION, Ordering::Relaxed);
        map.u32(H_LANES).store(LANES as u32, Ordering::Relaxed);
        map.u32(H_SLOTS).store(SLOTS as u32, Ordering::Relaxed);
        map.u32(H_ENTRY).store(ENTRY as u32, Ordering::Relaxed);
        map.u32(H_PID).store(my_pid(), Ordering::Relaxed);
        let keeper = crate::life::Keeper::start(Arc::clone(&map), map.u64(H_LIFE_ENTRY), map.u32(H_LIFE))
            .inspect_err(|e| tracing::debug!(target: "softrdma::local", "no life word ({e}): no grants"))
            .ok();
        let features = FEATURE_HEADS
            | if keeper.is_some() { FEATURE_LIFE | FEATURE_GRANTS } else { 0 }
            | if pulls { FEATURE_PULLS } else { 0 }
            | if acks_beside { FEATURE_ACKS_BESIDE } else { 0 };
        map.u64(H_GATE).store(GATE_CLOSED, Ordering::Relaxed);
        map.u32(H_FEATURES).store(features, Ordering::Relaxed);
        map.u64(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Inbox {
            map,
            path,
            bell_path,
            bell,
            ino,
            pid: my_pid(),
            _file: file,
            scratch: vec![0; ENTRY].into_boxed_slice(),
            next_lane: 0,
            seen: 0,
            lanes: 0,
            stamped: 0,
            looks: 0,
            pulls,
            keeper,
            undrained: 0,
        })
    }

    /// Hands up to `max` datagrams to `deliver` (envelope, IP fields, the packet, and how
    /// it came: for a packet whose data is carried by reference the process to copy it
    /// from, the lane's owner; an ACK to take before it), lanes in turn. Returns how many.
    pub fn receive(&mut self, max: usize, mut deliver: impl FnMut(&Envelope, IpInfo, &[u8], Arrived)) -> usize {
        // A lane claimed (or, by a sender of an earlier build, a batch published) since the
        // last look: read which lanes to look at. The number's line stays in this core's
        // cache otherwise: senders of this build write it only when they claim a lane.
        // Every 64th look reads them anyway: a sender of an earlier build that died between
        // its first batch and its first bump must not leave datagrams unseen (and a thread
        // that finds them pending, in `Sleepers::sleep_if_empty`, awake forever).
        let seq = self.map.u64(H_SEQ).load(Ordering::Acquire);
        self.looks = self.looks.wrapping_add(1);
        // Such a look reads every lane's head, stamps or not: a lane taken over by a sender
        // of an earlier build from one of this build with the same PID, or left holding an
        // earlier build's unstamped datagrams, is read so at least every 64th look.
        let refresh = seq != self.seen || self.looks % 64 == 0;
        if refresh {
            self.seen = seq;
            (self.lanes, self.stamped) = self.map.lanes_in_use();
        }
        let lanes = self.lanes;
        let stamped = if refresh { 0 } else { self.stamped };
        let mut n = 0;
        let mut idle = 0;
        while n < max && idle < lanes.count_ones() {
            // The next lane in `lanes`, from `next_lane` on, round.
            let lane = (self.next_lane + lanes.rotate_right(self.next_lane as u32).trailing_zeros() as usize) % LANES;
            self.next_lane = (lane + 1) % LANES;
            let at = Mapping::lane(lane);
            let tail = self.map.u64(at + L_TAIL).load(Ordering::Relaxed);
            // What the lane holds, up to `max`, in one run: the tail written once (a cache
            // line the producer reads), not per datagram with every other lane looked at in
            // between; counted by the entries' stamps where the owner stamps them, else by
            // the head.
            let room = (max - n) as u64;
            let run = if stamped & 1 << lane != 0 {
                let stamp = |k: u64| {
                    let entry = Mapping::entry(lane, tail.wrapping_add(k));
                    self.map.u16(entry + E_STAMP).load(Ordering::Acquire) == stamp_of(tail.wrapping_add(k))
                };
                // The first entry's datagram line on its way while its header is read (a
                // no-op while the lane is idle: this core holds it).
                self.map.prefetch(Mapping::entry(lane, tail) + ENTRY_HEADER);
                (0..room.min(SLOTS as u64)).find(|&k| !stamp(k)).unwrap_or(room.min(SLOTS as u64))
            } else {
                self.map.u64(at + L_HEAD).load(Ordering::Acquire).wrapping_sub(tail).min(room)
            };
            if run == 0 {
                idle += 1;
                continue;
            }
            idle = 0;
            // A new sender: can its data be copied from where it is? Data by reference
            // goes in only from a lane that said so, into an inbox that takes it; anything
            // else so flagged is dropped, as a lost packet.
            let mut verdict = self.map.u32(at + L_PULLS).load(Ordering::Relaxed);
            if self.pulls && verdict == PULLS_UNKNOWN {
                verdict = probe(&self.map, lane);
            }
            let owner =
                (self.pulls && verdict == PULLS_YES).then(|| self.map.u32(at + L_OWNER).load(Ordering::Acquire));
            for k in 0..run {
                let entry = Mapping::entry(lane, tail.wrapping_add(k));
                // The header and the datagram's first line in one copy, the two cache lines
                // fetched at once rather than the second after the header told the length;
                // the rest, if any, after.
                self.map.get(entry, &mut self.scratch[..ENTRY_HEADER + FIRST_LINE]);
                if let Some((envelope, ip, len, beside)) = decode(&self.scratch[..ENTRY_HEADER]) {
                    let origin = match (beside.by_reference, owner) {
                        (false, _) => None,
                        (true, Some(owner)) => Some(owner),
                        (true, None) => continue,
                    };
                    let end = ENTRY_HEADER + len + if beside.grant.is_some() { GRANT_BYTES } else { 0 };
                    if end > ENTRY_HEADER + FIRST_LINE {
                        let rest = ENTRY_HEADER + FIRST_LINE..end;
                        self.map.get(entry + rest.start, &mut self.scratch[rest]);
                    }
                    let grant = beside
                        .grant
                        .and_then(|_| Grant::decode(&self.scratch[ENTRY_HEADER + len..end]))
                        .map(|g| (self.map.u32(at + L_OWNER).load(Ordering::Acquire), g));
                    let arrived = Arrived { origin, ack: beside.ack, grant, asks_grant: beside.asks_grant };
                    deliver(&envelope, ip, &self.scratch[ENTRY_HEADER..ENTRY_HEADER + len], arrived);
                }
            }
            // The run's slots are free again.
            self.map.u64(at + L_TAIL).store(tail.wrapping_add(run), Ordering::Release);
            n += run as usize;
        }
        n
    }

    /// Whether a datagram waits.
    pub fn pending(&self) -> bool {
        self.map.pending()
    }

    /// Whether this process copies from process `pid`: it sends here, and this process
    /// found it could read its probe word ([`Outbox::pulls`] is the other direction).
    pub fn pulls_from(&self, pid: u32) -> bool {
        self.pulls
            && (0..LANES).any(|l| {
                let at = Mapping::lane(l);
                self.map.u32(at + L_OWNER).load(Ordering::Relaxed) == pid
                    && self.map.u32(at + L_PULLS).load(Ordering::Acquire) == PULLS_YES
            })
    }

    /// Opens the gate at `epoch`: senders holding a grant of that epoch may apply atomics
    /// to this process's memory on their own ([`Outbox::enter_gate`]).
    pub fn open_gate(&self, epoch: u64) {
        self.map.u64(H_GATE).store(epoch, Ordering::SeqCst);
    }

    /// The epoch the gate is open at, if it is.
    pub fn gate(&self) -> Option<u64> {
        gate(&self.map)
    }

    /// Closes the gate and waits until no sender is inside: from its return until the gate
    /// opens again, no sender applies an atomic here on its own. A sender that stays inside
    /// (its thread stopped there, or descheduled for long) is waited for up to `patience`,
    /// and then again at every later close until it left ([`undrained`](Self::undrained));
    /// one that died there, not at all. Returns whether none was left inside.
    pub fn close_gate(&mut self, patience: std::time::Duration) -> bool {
        let was_open = self.map.u64(H_GATE).swap(GATE_CLOSED, Ordering::SeqCst) != GATE_CLOSED;
        let lanes = if was_open { u16::MAX } else { self.undrained };
        if lanes == 0 {
            return true;
        }
        let deadline = std::time::Instant::now() + patience;
        let mut left = 0u16;
        for lane in (0..LANES).filter(|l| lanes & 1 << l != 0) {
            let at = Mapping::lane(lane);
            let mut spins = 0u32;
            while self.map.u32(at + L_INSIDE).load(Ordering::SeqCst) != 0 {
                spins += 1;
                if spins % 64 != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                // Now and then: whether it is still there to wait for (a dead owner's word
                // stays set until its lane is claimed again, which clears it).
                let owner = self.map.u32(at + L_OWNER).load(Ordering::Acquire);
                if owner == 0 || is_gone(owner) {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    // Not a process that took the dead owner's PID since.
                    if !pid_reused(&self.map, lane, owner) {
                        left |= 1 << lane;
                    }
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.undrained = left;
        left == 0
    }

    /// Whether a sender that [`close_gate`](Self::close_gate) left inside may still be
    /// there: the next close waits for it, even with the gate closed.
    pub fn undrained(&self) -> bool {
        self.undrained != 0
    }

    /// The bell: readable once a sender rang it; poll it while counted among the
    /// [`Sleepers`], and [`drain_bell`] it after.
    pub fn bell(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }

    /// The inbox's count of sleeping readers, for any thread of this process (it needs no
    /// access to the inbox itself).
    pub fn sleepers(&self) -> Sleepers {
        Sleepers { map: Arc::clone(&self.map) }
    }
}

/// The count of an inbox's readers that sleep on its bell ([`Inbox::sleepers`]).
pub struct Sleepers {
    map: Arc<Mapping>,
}

impl std::fmt::Debug for Sleepers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sleepers").field("count", &self.map.u32(H_SLEEPERS).load(Ordering::Relaxed)).finish()
    }
}

impl Sleepers {
    /// Before sleeping on the bell: counts this thread in, so that senders ring, unless a
    /// datagram already waits (then returns `false`, counted out again: stay awake). After
    /// `true`, call [`awake`](Self::awake) once awake.
    pub fn sleep_if_empty(&self) -> bool {
        let count = self.map.u32(H_SLEEPERS);
        count.fetch_add(1, Ordering::SeqCst);
        // Against the sender's fence between its head and its look at the sleepers
        // (`Outbox::wake`): one of the two sees the other's write.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.map.pending() {
            count.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Awake again after [`sleep_if_empty`](Self::sleep_if_empty) returned `true`.
    pub fn awake(&self) {
        self.map.u32(H_SLEEPERS).fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if my_pid() != self.pid {
            return; // a child of fork: the parent's inbox stays open
        }
        self.map.u32(H_CLOSED).store(1, Ordering::SeqCst);
        drop(self.keeper.take()); // the life word says dead
        // Remove the name only while it is still this inbox's.
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(&self.bell_path);
        }
    }
}

/// A lane of another process's inbox, claimed by this process.
pub struct Outbox {
    map: Mapping,
    lane: usize,
    /// The process that claimed the lane: only it produces into the lane, and a child of
    /// `fork` neither does nor gives it back.
    pid: u32,
    /// The receiver's bell, open for writing.
    bell: OwnedFd,
    /// Datagrams that found the lane full, in order, entry header first.
    backlog: VecDeque<Vec<u8>>,
    /// The lane's head: entries up to here are written, those from the head in the lane
    /// on are published at the next [`Outbox::wake`].
    head: u64,
    /// The head as last published (the lane's head word, which the receiver's reads take
    /// from this core's cache: read there, it was a miss per batch).
    published: u64,
    /// The lane's tail as last read.
    tail: u64,
    /// The receiver reads the heads ([`FEATURE_HEADS`]); else it looks at the lanes only
    /// when the sequence number moves, and each batch bumps it.
    heads: bool,
    /// The headers of the entries written since the last publication, by index modulo
    /// [`SLOTS`]: [`Outbox::wake`] writes each entry's header line once, with its stamp,
    /// where `put` writing it earlier let a polling receiver take the line between the
    /// header and the stamp, and the stamp then took it back.
    headers: Box<[[u8; ENTRY_HEADER]; SLOTS]>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("lane", &self.lane).field("backlog", &self.backlog.len()).finish()
    }
}

impl Outbox {
    /// Opens the inbox `name` and claims a lane. Fails when there is no such inbox (the
    /// process is not on this host, or has not made one), when it belongs to another user,
    /// is closed or of another version, or when every lane is taken by a live process.
    pub fn open(name: &str) -> io::Result<Outbox> {
        let file = OpenOptions::new().read(true).write(true).open(path_of(name))?;
        let meta = file.metadata()?;
        if meta.uid() != rustix::process::getuid().as_raw() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the inbox belongs to another user"));
        }
        if meta.len() != INBOX_BYTES as u64 {
            return Err(invalid("the inbox has another size (another softrdma version)"));
        }
        let map = Mapping::new(&file)?;
        if map.u64(H_MAGIC).load(Ordering::Acquire) != MAGIC
            || map.u32(H_VERSION).load(Ordering::Relaxed) != VERSION
            || map.u32(H_LANES).load(Ordering::Relaxed) != LANES as u32
            || map.u32(H_SLOTS).load(Ordering::Relaxed) != SLOTS as u32
            || map.u32(H_ENTRY).load(Ordering::Relaxed) != ENTRY as u32
        {
            return Err(invalid("the inbox is not ready or of another softrdma version"));
        }
        if closed(&map) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the inbox is closed, or its process died"));
        }
        let bell = rustix::fs::open(
            bell_of(name),
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let bell_meta = rustix::fs::fstat(&bell)?;
        if bell_meta.st_uid != rustix::process::getuid().as_raw()
            || rustix::fs::FileType::from_raw_mode(bell_meta.st_mode) != rustix::fs::FileType::Fifo
        {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the inbox's bell is not this user's FIFO"));
        }
        let me = my_pid();
        let lane = claim(&map, me)
            .ok_or_else(|| io::Error::new(io::ErrorKind::WouldBlock, "every lane of the inbox is taken"))?;
        // The lane's pages, before any is written through the mapping (where a full
        // /dev/shm would be SIGBUS): no room, no lane.
        let entries = Mapping::entry(lane, 0) as u64;
        if let Err(e) =
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), entries, (SLOTS * ENTRY) as u64)
        {
            map.u32(Mapping::lane(lane) + L_OWNER).store(0, Ordering::Release);
            return Err(e.into());
        }
        // Where the receiver finds this process's probe word, before it is asked to look.
        let at = Mapping::lane(lane);
        map.u64(at + L_PROBE).store(std::ptr::from_ref(&PROBE) as u64, Ordering::Release);
        map.u64(at + L_TOKEN).store(probe_token(), Ordering::Release);
        map.u32(at + L_PULLS).store(PULLS_UNKNOWN, Ordering::Release);
        // Not inside the gate (a dead owner may have left its word set).
        map.u32(at + L_INSIDE).store(0, Ordering::Release);
        map.u64(at + L_BORN).store(my_start_time(), Ordering::Release);
        map.u32(at + L_BORN_OF).store(me, Ordering::Release);
        // This process stamps its entries (before the bump that has the receiver read it).
        map.u32(at + L_STAMPS).store(me, Ordering::Release);
        let tail = map.u64(at + L_TAIL).load(Ordering::Acquire);
        let head = map.u64(at + L_HEAD).load(Ordering::Acquire);
        let heads = map.u32(H_FEATURES).load(Ordering::Relaxed) & FEATURE_HEADS != 0;
        // The receiver reads the owners again, and looks at this lane from now on.
        map.u64(H_SEQ).fetch_add(1, Ordering::SeqCst);
        Ok(Outbox {
            map,
            lane,
            pid: me,
            bell,
            backlog: VecDeque::new(),
            head,
            published: head,
            tail,
            heads,
            headers: Box::new([[0; ENTRY_HEADER]; SLOTS]),
        })
    }

    /// Whether the receiver closed the inbox (it went away, or its slot has a new owner)
    /// or died: open its name again.
    pub fn is_closed(&self) -> bool {
        closed(&self.map)
    }

    /// Whether the receiver copies data carried by reference from this process: it says
    /// so once it tried, after this process's first datagram in the lane.
    pub fn pulls(&self) -> bool {
        self.map.u32(H_FEATURES).load(Ordering::Relaxed) & FEATURE_PULLS != 0
            && self.map.u32(Mapping::lane(self.lane) + L_PULLS).load(Ordering::Acquire) == PULLS_YES
    }

    /// Whether the receiver takes an ACK beside a packet ([`Beside::ack`]); an inbox of an
    /// earlier build does not, and would lose it.
    pub fn acks_beside(&self) -> bool {
        self.map.u32(H_FEATURES).load(Ordering::Relaxed) & FEATURE_ACKS_BESIDE != 0
    }

    /// Whether the receiver takes a grant beside a packet ([`Beside::grant`]) and keeps
    /// the gate ([`enter_gate`](Self::enter_gate)).
    pub fn takes_grants(&self) -> bool {
        self.map.u32(H_FEATURES).load(Ordering::Relaxed) & FEATURE_GRANTS != 0
    }

    /// Before this process applies an atomic to the receiver's memory on its own: steps
    /// into the gate if it stands open at `epoch` (a grant's), and returns whether it did;
    /// then [`leave_gate`](Self::leave_gate), after the atomic. The receiver closes the
    /// gate, and waits for the senders inside, before anything that could void a grant
    /// takes effect ([`Inbox::close_gate`]): each side writes its word before it reads the
    /// other's, so one of them sees the other.
    pub fn enter_gate(&self, epoch: u64) -> bool {
        if my_pid() != self.pid || self.is_closed() {
            return false;
        }
        let inside = self.map.u32(Mapping::lane(self.lane) + L_INSIDE);
        inside.store(1, Ordering::SeqCst);
        if self.map.u64(H_GATE).load(Ordering::SeqCst) == epoch {
            return true;
        }
        inside.store(0, Ordering::Release);
        false
    }

    /// The epoch the receiver's gate stands open at, if it does: grants of another epoch
    /// hold no more.
    pub fn gate(&self) -> Option<u64> {
        gate(&self.map)
    }

    /// After the atomic [`enter_gate`](Self::enter_gate) let through.
    pub fn leave_gate(&self) {
        self.map.u32(Mapping::lane(self.lane) + L_INSIDE).store(0, Ordering::Release);
    }

    /// The process that owns the inbox.
    pub fn receiver(&self) -> u32 {
        self.map.u32(H_PID).load(Ordering::Relaxed)
    }

    /// Datagrams waiting in the sender's backlog for room in the lane.
    pub fn backlog(&self) -> usize {
        self.backlog.len()
    }

    /// Queues one datagram: into the lane, or behind the backlog, with what is said
    /// `beside` it. Fails only for a datagram over [`DATAGRAM_MAX`] bytes.
    pub fn send(&mut self, envelope: &Envelope, ip: IpInfo, datagram: &[u8], beside: Beside) -> io::Result<()> {
        if datagram.len() > DATAGRAM_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "datagram larger than an inbox entry"));
        }
        let takes_grants = self.takes_grants();
        let beside = Beside {
            grant: beside.grant.filter(|_| datagram.len() <= GRANTED_MAX && takes_grants),
            asks_grant: beside.asks_grant && takes_grants,
            ..beside
        };
        let header = encode(envelope, ip, datagram.len(), beside);
        match beside.grant {
            // A grant rides after an atomic's answer, a datagram of a few dozen bytes:
            // joined on the stack.
            Some(g) => {
                let mut joined = [0u8; GRANTED_MAX + GRANT_BYTES];
                joined[..datagram.len()].copy_from_slice(datagram);
                joined[datagram.len()..datagram.len() + GRANT_BYTES].copy_from_slice(&g.encode());
                self.put_entry(&header, &joined[..datagram.len() + GRANT_BYTES]);
            }
            None => self.put_entry(&header, datagram),
        }
        Ok(())
    }

    /// Puts an entry into the lane, or behind the backlog.
    #[inline]
    fn put_entry(&mut self, header: &[u8; ENTRY_HEADER], datagram: &[u8]) {
        if self.flush()
            && put(&self.map, self.lane, &mut self.head, &mut self.tail, &mut self.headers, header, datagram)
        {
            return;
        }
        let mut entry = Vec::with_capacity(ENTRY_HEADER + datagram.len());
        entry.extend_from_slice(header);
        entry.extend_from_slice(datagram);
        self.backlog.push_back(entry);
    }

    /// Moves the backlog into the lane as far as it has room. Returns whether the backlog
    /// is empty.
    pub fn flush(&mut self) -> bool {
        while let Some(entry) = self.backlog.front() {
            let (header, datagram) = entry.split_at(ENTRY_HEADER);
            let header: [u8; ENTRY_HEADER] = header.try_into().expect("an entry starts with its header");
            if !put(&self.map, self.lane, &mut self.head, &mut self.tail, &mut self.headers, &header, datagram) {
                return false;
            }
            self.backlog.pop_front();
        }
        true
    }

    /// After a batch: publishes what was sent since the last call (the lane's head) and
    /// rings the receiver's bell if it sleeps. Datagrams sent but not yet followed by this
    /// are not seen.
    pub fn wake(&mut self) {
        if self.published == self.head {
            return;
        }
        // The headers, then the head (a receiver of an earlier build reads the head, then
        // the entries), then the stamps: a receiver that saw a stamp sees the head past it.
        let count = self.write_headers();
        self.map.u64(Mapping::lane(self.lane) + L_HEAD).store(self.head, Ordering::Release);
        let mut index = self.head.wrapping_sub(count);
        while index != self.head {
            let stamp = self.map.u16(Mapping::entry(self.lane, index) + E_STAMP);
            stamp.store(stamp_of(index), Ordering::Release);
            index = index.wrapping_add(1);
        }
        self.published = self.head;
        // Sequentially consistent, so that it orders the head and stamps written before it
        // against the sleepers read after it (the receiver counts itself in, then looks).
        if self.heads {
            std::sync::atomic::fence(Ordering::SeqCst);
        } else {
            self.map.u64(H_SEQ).fetch_add(1, Ordering::SeqCst);
        }
        if self.map.u32(H_SLEEPERS).load(Ordering::SeqCst) != 0 {
            self.nudge();
        }
    }

    /// The lane's head as last published ([`wake`](Self::wake)): the entries before it are
    /// the receiver's to take.
    pub fn published(&self) -> u64 {
        self.published
    }

    /// The lane's tail, read now: the receiver has taken the entries before it. (The
    /// receiver writes that line with each take: a read is a miss from its core.)
    pub fn taken(&mut self) -> u64 {
        self.tail = self.map.u64(Mapping::lane(self.lane) + L_TAIL).load(Ordering::Acquire);
        self.tail
    }

    /// Rings the receiver's bell whether or not a thread of it counts itself asleep on it:
    /// for a receiver that has taken nothing of this lane for a while, whose application
    /// polled of late and so leaves the inbox to its next poll, but may now wait in its
    /// memory (for the very WRITE that waits here) and poll no more. A receiver's thread
    /// that watches the bell then takes the inbox (the bell is only a wake-up: a ring
    /// nobody watches is drained by the next sleeper, which finds the inbox as it is).
    pub fn nudge(&self) {
        // A write fails only when the FIFO is full, and then the receiver has a wake-up
        // pending anyway.
        let _ = rustix::io::write(&self.bell, &[1]);
    }

    /// Writes the header line of each entry written since the last publication, unstamped,
    /// and returns how many (at most a lane's worth: a head moved further by hand writes
    /// and stamps no more).
    fn write_headers(&self) -> u64 {
        let count = self.head.wrapping_sub(self.published).min(SLOTS as u64);
        let mut index = self.head.wrapping_sub(count);
        while index != self.head {
            let (entry, header) = (Mapping::entry(self.lane, index), &self.headers[index as usize % SLOTS]);
            // Unpublished until its stamp: the stamp is written only atomically (a receiver
            // may be reading it), the rest of the header around it.
            self.map.u16(entry + E_STAMP).store(0, Ordering::Relaxed);
            self.map.put(entry, &header[..E_STAMP]);
            self.map.put(entry + E_STAMP + 2, &header[E_STAMP + 2..]);
            index = index.wrapping_add(1);
        }
        count
    }
}

/// Writes one entry's datagram in `lane` at `head` if it has room, keeps its header in
/// `headers` for [`Outbox::wake`] to write, and moves `head` past it (the producer's head,
/// published by `wake`). `tail` is the consumer's tail as last read: read again only when
/// the lane looks full (the consumer writes it, so each read is a cache miss).
fn put(
    map: &Mapping,
    lane: usize,
    head: &mut u64,
    tail: &mut u64,
    headers: &mut [[u8; ENTRY_HEADER]; SLOTS],
    header: &[u8; ENTRY_HEADER],
    datagram: &[u8],
) -> bool {
    if head.wrapping_sub(*tail) >= SLOTS as u64 {
        *tail = map.u64(Mapping::lane(lane) + L_TAIL).load(Ordering::Acquire);
        if head.wrapping_sub(*tail) >= SLOTS as u64 {
            return false;
        }
    }
    let entry = Mapping::entry(lane, *head);
    headers[*head as usize % SLOTS] = *header;
    map.put(entry + ENTRY_HEADER, datagram);
    *head = head.wrapping_add(1);
    true
}

/// The epoch the gate of the inbox in `map` stands open at, if it does.
fn gate(map: &Mapping) -> Option<u64> {
    Some(map.u64(H_GATE).load(Ordering::Acquire)).filter(|&g| g != GATE_CLOSED)
}

/// Whether the inbox in `map` is closed (its process went away, or its slot has a new
/// owner) or its process died: its life word ([`FEATURE_LIFE`]) says so, marked by the
/// kernel as the process died (`crate::life`).
fn closed(map: &Mapping) -> bool {
    map.u32(H_CLOSED).load(Ordering::Acquire) != 0
        || map.u32(H_FEATURES).load(Ordering::Relaxed) & FEATURE_LIFE != 0
            && !crate::life::lives(map.u32(H_LIFE).load(Ordering::Acquire))
}

/// Takes a free lane, or one whose owner is no longer alive.
fn claim(map: &Mapping, me: u32) -> Option<usize> {
    for lane in 0..LANES {
        let owner = map.u32(Mapping::lane(lane) + L_OWNER);
        if owner.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Some(lane);
        }
    }
    for lane in 0..LANES {
        let owner = map.u32(Mapping::lane(lane) + L_OWNER);
        let held = owner.load(Ordering::Acquire);
        if owner_gone(map, lane, held) && owner.compare_exchange(held, me, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            return Some(lane);
        }
    }
    None
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if my_pid() != self.pid {
            return;
        }
        // What the lane holds stays for the receiver (published now if it was not); a later
        // producer continues at the head.
        self.wake();
        self.map.u32(Mapping::lane(self.lane) + L_OWNER).store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope_v4(id: u16) -> Envelope {
        let mut e = Envelope::rocev2([127, 0, 0, 1].into(), 4791, [127, 0, 0, 2].into()).unwrap();
        if let Envelope::V4(v4) = &mut e {
            v4.identification = id;
        }
        e
    }

    fn unique(tag: &str) -> String {
        format!("softrdma-test.{}.{tag}", std::process::id())
    }

    #[test]
    fn entry_header_round_trips_both_families() {
        let ip = IpInfo { hop_limit: 63, traffic_class: 0x2a, flow_label: 0xabcde };
        let v4 = envelope_v4(7);
        let plain = Beside::default();
        assert_eq!(decode(&encode(&v4, ip, 100, plain)), Some((v4, ip, 100, plain)));
        let v6 = Envelope::rocev2("fe80::1".parse().unwrap(), 51000, "::1".parse().unwrap()).unwrap();
        let by_reference = Beside { by_reference: true, ..Beside::default() };
        assert_eq!(decode(&encode(&v6, ip, 4096, by_reference)), Some((v6, ip, 4096, by_reference)));
        let ack = AckBeside { psn: 0xfe_dcba, syndrome: 0x1f, msn: 0x12_3456 };
        let both = Beside { by_reference: true, ack: Some(ack), ..Beside::default() };
        assert_eq!(decode(&encode(&v4, ip, 44, both)), Some((v4, ip, 44, both)));
        let asks = Beside { asks_grant: true, ..Beside::default() };
        assert_eq!(decode(&encode(&v4, ip, 40, asks)), Some((v4, ip, 40, asks)));
        let wide = Beside { ack: Some(AckBeside { psn: 0x1ff_ffff, msn: 0xff00_0001, ..ack }), ..Beside::default() };
        let narrowed = Beside { ack: Some(AckBeside { psn: 0xff_ffff, msn: 1, ..ack }), ..wide };
        assert_eq!(decode(&encode(&v4, ip, 44, wide)), Some((v4, ip, 44, narrowed)), "PSN and MSN are 24 bits");
        let mut bad = encode(&v4, ip, DATAGRAM_MAX + 1, plain);
        assert_eq!(decode(&bad), None, "an entry longer than its slot is refused");
        bad[4] = 5;
        assert_eq!(decode(&bad), None, "an unknown family is refused");
    }

    /// A datagram arrives whole at every length, through slots that held longer ones: in
    /// particular either side of the first line the receiver copies with the header before
    /// it knows the length.
    #[test]
    fn datagrams_of_every_length_arrive_whole() {
        let name = unique("lengths");
        let mut inbox = Inbox::create(&name, true, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        let lengths = [0, 1, FIRST_LINE - 1, FIRST_LINE, FIRST_LINE + 1, 2 * FIRST_LINE + 1, 1000, DATAGRAM_MAX];
        let sent: Vec<Vec<u8>> =
            lengths.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 31 + j * 7) as u8).collect()).collect();
        // Stale bytes in the slots first: a longer datagram through every slot the test uses.
        for _ in 0..lengths.len() {
            out.send(&envelope_v4(0), IpInfo::default(), &[0xee; DATAGRAM_MAX], Beside::default()).unwrap();
        }
        out.wake();
        assert_eq!(inbox.receive(64, |_, _, _, _| {}), lengths.len());
        for d in &sent {
            out.send(&envelope_v4(1), IpInfo::default(), d, Beside::default()).unwrap();
        }
        out.wake();
        let mut got = Vec::new();
        inbox.receive(64, |_, _, d, _| got.push(d.to_vec()));
        assert_eq!(got, sent);
    }

    #[test]
    fn datagrams_arrive_in_order_through_a_full_lane_and_its_backlog() {
        let name = unique("order");
        let mut inbox = Inbox::create(&name, true, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        let total = SLOTS * 3 + 5;
        for i in 0..total {
            let payload = vec![(i % 251) as u8; 1 + i % 4096];
            out.send(&envelope_v4(i as u16), IpInfo::default(), &payload, Beside::default()).unwrap();
        }
        assert_eq!(out.backlog(), total - SLOTS, "the lane holds SLOTS, the rest waits in order");
        let mut got = Vec::new();
        for _ in 0..200 {
            assert_eq!(inbox.receive(64, |_, _, _, _| {}), 0, "nothing is seen before the batch is published");
        }
        assert!(!inbox.pending());
        out.wake();
        while got.len() < total {
            let n = inbox.receive(64, |e, _, d, _| {
                let Envelope::V4(v4) = e else { panic!("family changed") };
                got.push((v4.identification, d.len(), d[0]));
            });
            assert!(n > 0 || out.backlog() > 0, "nothing received and nothing left to send");
            out.flush();
            out.wake();
        }
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, (i as u16, 1 + i % 4096, (i % 251) as u8), "datagram {i}");
        }
        assert!(!inbox.pending());
    }

    #[test]
    fn a_head_moved_past_what_a_lane_holds_costs_a_receive_no_more_than_max() {
        // A misbehaving producer of the user sets its lane's head far ahead: a look that
        // reads the head takes `max` entries, round the lane, skipping those that do not
        // decode; the others read the stamps, which it did not write.
        let name = unique("head");
        let mut inbox = Inbox::create(&name, true, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        out.send(&envelope_v4(9), IpInfo::default(), &[1, 2, 3], Beside::default()).unwrap();
        out.head = 1 << 40;
        out.wake();
        let mut got = Vec::new();
        assert_eq!(inbox.receive(1000, |e, _, d, _| got.push((*e, d.to_vec()))), 1000);
        let mut taken = 1000;
        for _ in 0..63 {
            let n = inbox.receive(64, |e, _, d, _| got.push((*e, d.to_vec())));
            assert!(n <= 64);
            taken += n;
        }
        assert!(taken >= 1064, "the 64th look reads the head: {taken}");
        // Slot 0 was written once and read on each round the calls made; no other slot was
        // ever written.
        assert_eq!(got, vec![(envelope_v4(9), vec![1, 2, 3]); taken.div_ceil(SLOTS)]);
    }

    #[test]
    fn a_batch_moves_its_lanes_head_and_the_sequence_number_only_for_a_receiver_of_an_earlier_build() {
        let name = unique("seq");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let seq = |inbox: &Inbox| inbox.map.u64(H_SEQ).load(Ordering::Acquire);
        let mut first = Outbox::open(&name).unwrap();
        assert_eq!(seq(&inbox), 1, "a claim moves it: the receiver reads the owners again");
        let mut got = Vec::new();
        for i in 0..10u8 {
            first.send(&envelope_v4(0), IpInfo::default(), &[i], Beside::default()).unwrap();
            first.wake();
            inbox.receive(8, |_, _, d, _| got.push(d[0]));
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(seq(&inbox), 1, "batches leave it alone");
        // A lane claimed after the receiver read the owners is looked at too.
        let mut second = Outbox::open(&name).unwrap();
        assert_ne!(first.lane, second.lane);
        second.send(&envelope_v4(0), IpInfo::default(), &[20], Beside::default()).unwrap();
        second.wake();
        first.send(&envelope_v4(0), IpInfo::default(), &[10], Beside::default()).unwrap();
        first.wake();
        got.clear();
        inbox.receive(8, |_, _, d, _| got.push(d[0]));
        got.sort();
        assert_eq!(got, [10, 20]);

        // A receiver of an earlier build (no FEATURE_HEADS) looks at the lanes only when
        // the number moves: its senders move it after every batch.
        let old = unique("seq-old");
        let inbox = Inbox::create(&old, false, true).unwrap();
        inbox.map.u32(H_FEATURES).fetch_and(!FEATURE_HEADS, Ordering::Relaxed);
        let mut out = Outbox::open(&old).unwrap();
        let before = seq(&inbox);
        for i in 0..3u8 {
            out.send(&envelope_v4(0), IpInfo::default(), &[i], Beside::default()).unwrap();
            out.wake();
        }
        out.wake();
        assert_eq!(seq(&inbox), before + 3, "one bump per batch that published");
    }

    /// A new inbox that has read its (no) lanes' owners, and a sender that acts as one of an
    /// earlier build as far as the receiver can tell: its claim moved no sequence number
    /// (put back), the lane names no stamping process (an earlier owner's PID, left there),
    /// and it bumps the number per batch.
    fn earlier_build_sender(tag: &str) -> (Inbox, Outbox) {
        let name = unique(tag);
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        assert_eq!(inbox.receive(8, |_, _, _, _| {}), 0);
        let before = inbox.map.u64(H_SEQ).load(Ordering::Acquire);
        let mut out = Outbox::open(&name).unwrap();
        out.map.u64(H_SEQ).store(before, Ordering::Release);
        out.map.u32(Mapping::lane(out.lane) + L_STAMPS).store(my_pid() + 1, Ordering::Release);
        out.heads = false;
        (inbox, out)
    }

    /// `out`'s last published entry as an earlier build leaves it: unstamped.
    fn unstamp_last(out: &Outbox) {
        out.map.u16(Mapping::entry(out.lane, out.head.wrapping_sub(1)) + E_STAMP).store(0, Ordering::Release);
    }

    #[test]
    fn a_sender_of_an_earlier_build_is_heard() {
        // It claims its lane without moving the sequence number, stamps nothing, and moves
        // the number after every batch (a receiver of its build looks at the lanes only then).
        let (mut inbox, mut out) = earlier_build_sender("old-sender");
        for i in 0..3u8 {
            out.send(&envelope_v4(0), IpInfo::default(), &[i], Beside::default()).unwrap();
            out.wake();
            unstamp_last(&out);
            let mut got = Vec::new();
            assert_eq!(inbox.receive(8, |_, _, d, _| got.push(d.to_vec())), 1);
            assert_eq!(got, [vec![i]]);
        }

        // One that died between its first batch (its entries and head written) and its
        // first bump: seen within 64 looks all the same.
        let (mut inbox, mut out) = earlier_build_sender("old-dead");
        out.send(&envelope_v4(0), IpInfo::default(), b"last", Beside::default()).unwrap();
        out.write_headers();
        out.map.u64(Mapping::lane(out.lane) + L_HEAD).store(out.head, Ordering::Release);
        let mut looks = 1;
        let mut got = Vec::new();
        while inbox.receive(8, |_, _, d, _| got.push(d.to_vec())) == 0 {
            looks += 1;
            assert!(looks <= 64, "not seen in 64 looks");
        }
        assert_eq!(got, [b"last".to_vec()]);
    }

    #[test]
    fn an_entrys_header_line_is_written_when_it_is_published() {
        // A receiver polls the header line of the entry after its tail: it must not change
        // until `wake` writes it whole, just before its stamp (written earlier, a look in
        // between took the line from the sender, and the stamp took it back).
        let name = unique("header-once");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        let (map, lane) = (Arc::clone(&inbox.map), out.lane);
        let line = |index: u64| {
            let mut h = [0u8; ENTRY_HEADER];
            map.get(Mapping::entry(lane, index), &mut h);
            h
        };
        let (first, before) = (out.head, line(out.head));
        for i in 0..3u8 {
            out.send(&envelope_v4(0), IpInfo::default(), &[i; 8], Beside::default()).unwrap();
        }
        assert_eq!(line(first), before, "a header line written before its entry is published");
        assert_eq!(inbox.receive(8, |_, _, _, _| {}), 0, "an unpublished entry taken");
        out.wake();
        for k in 0..3 {
            let h = line(first + k);
            assert_eq!(decode(&h), Some((envelope_v4(0), IpInfo::default(), 8, Beside::default())), "entry {k}");
            let stamp = map.u16(Mapping::entry(lane, first + k) + E_STAMP).load(Ordering::Acquire);
            assert_eq!(stamp, stamp_of(first + k), "entry {k}'s stamp");
        }
        let mut got = Vec::new();
        assert_eq!(inbox.receive(8, |_, _, d, _| got.push(d[0])), 3);
        assert_eq!(got, [0, 1, 2]);
    }

    #[test]
    fn a_receiver_takes_a_stamped_lanes_datagrams_by_their_stamps() {
        let name = unique("stamps");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        assert_eq!(inbox.receive(8, |_, _, _, _| {}), 0, "reads the owners: the lane stamps");
        let map = Arc::clone(&inbox.map);
        let head = map.u64(Mapping::lane(out.lane) + L_HEAD);
        for i in 0..300u16 {
            // Every 64th look reads the heads: the others see each datagram by its stamp
            // alone (the head word put back for the look).
            let batch = 1 + usize::from(i % 3);
            for _ in 0..batch {
                out.send(&envelope_v4(i), IpInfo::default(), &i.to_le_bytes(), Beside::default()).unwrap();
            }
            let before = head.load(Ordering::Acquire);
            out.wake();
            let by_stamps = inbox.looks.wrapping_add(1) % 64 != 0;
            if by_stamps {
                head.store(before, Ordering::Release);
            }
            let mut got = Vec::new();
            assert_eq!(inbox.receive(8, |_, _, d, _| got.push(d.to_vec())), batch, "round {i}");
            assert!(got.iter().all(|d| d[..] == i.to_le_bytes()), "round {i}");
            head.store(out.head, Ordering::Release);
        }
        assert!(!inbox.pending());
    }

    #[test]
    fn a_sleeping_receiver_is_rung_once_per_batch_and_an_awake_one_not_at_all() {
        let name = unique("wake");
        let mut inbox = Inbox::create(&name, true, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        let bell = inbox.bell().try_clone_to_owned().unwrap();
        let rung = || {
            let mut b = [0u8; 16];
            rustix::io::read(&bell, &mut b).unwrap_or(0)
        };
        out.send(&envelope_v4(0), IpInfo::default(), b"awake", Beside::default()).unwrap();
        out.wake();
        assert_eq!(rung(), 0, "an awake receiver is not rung");
        let sleepers = inbox.sleepers();
        assert!(!sleepers.sleep_if_empty(), "a receiver with a datagram waiting does not sleep");
        inbox.receive(8, |_, _, _, _| {});
        assert!(sleepers.sleep_if_empty());
        assert!(inbox.sleepers().sleep_if_empty(), "a second thread sleeps too");
        sleepers.awake();
        out.send(&envelope_v4(3), IpInfo::default(), b"zero", Beside::default()).unwrap();
        out.wake();
        assert_eq!(rung(), 1, "one thread woke; the other still sleeps and is rung");
        inbox.receive(8, |_, _, _, _| {});
        out.send(&envelope_v4(1), IpInfo::default(), b"one", Beside::default()).unwrap();
        out.send(&envelope_v4(2), IpInfo::default(), b"two", Beside::default()).unwrap();
        out.wake();
        out.wake();
        assert_eq!(rung(), 1, "one ring for the batch");
        sleepers.awake();
        assert_eq!(inbox.receive(8, |_, _, _, _| {}), 2);
    }

    #[test]
    fn an_ack_beside_a_datagram_arrives_with_it_and_only_with_it() {
        let name = unique("ack");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        assert!(out.acks_beside(), "an inbox that takes them says so, pulling or not");
        let refusing = unique("no-acks");
        let _no = Inbox::create(&refusing, true, false).unwrap();
        assert!(!Outbox::open(&refusing).unwrap().acks_beside(), "one that does not (its process captures)");
        let ack = AckBeside { psn: 0x00_0102, syndrome: 0x1f, msn: 7 };
        out.send(&envelope_v4(0), IpInfo::default(), b"answer", Beside { ack: Some(ack), ..Beside::default() })
            .unwrap();
        out.send(&envelope_v4(1), IpInfo::default(), b"next", Beside::default()).unwrap();
        out.wake();
        let mut got = Vec::new();
        assert_eq!(inbox.receive(8, |_, _, d, arrived| got.push((d.to_vec(), arrived))), 2);
        let arrived = Arrived { ack: Some(ack), ..Arrived::default() };
        assert_eq!(got, [(b"answer".to_vec(), arrived), (b"next".to_vec(), Arrived::default())]);
    }

    #[test]
    fn a_grant_beside_a_datagram_arrives_with_it_named_by_the_lanes_owner() {
        let name = unique("grant");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        assert!(out.takes_grants());
        let grant = Grant {
            qp: 0x2001,
            rkey: 0xdead_beef,
            va: 0x7f00_0000_1000,
            len: 4096,
            fd: 9,
            ino: 77,
            offset: 0,
            epoch: 3,
        };
        let answer = Beside { grant: Some(grant), ..Beside::default() };
        out.send(&envelope_v4(0), IpInfo::default(), b"answer", answer).unwrap();
        out.send(&envelope_v4(1), IpInfo::default(), b"next", Beside::default()).unwrap();
        // A datagram longer than an atomic's answer goes without it.
        let long = vec![7u8; GRANTED_MAX + 1];
        out.send(&envelope_v4(2), IpInfo::default(), &long, answer).unwrap();
        out.wake();
        let mut got = Vec::new();
        assert_eq!(inbox.receive(8, |_, _, d, arrived| got.push((d.to_vec(), arrived.grant))), 3);
        assert_eq!(got, [(b"answer".to_vec(), Some((my_pid(), grant))), (b"next".to_vec(), None), (long, None)]);
    }

    #[test]
    fn the_gate_lets_a_sender_in_only_at_its_epoch_and_closing_it_waits_for_those_inside() {
        let name = unique("gate");
        let mut inbox = Inbox::create(&name, false, true).unwrap();
        let out = Outbox::open(&name).unwrap();
        assert_eq!(inbox.gate(), None, "closed until a grant is given");
        assert!(!out.enter_gate(0));
        inbox.open_gate(5);
        assert!(!out.enter_gate(4), "a grant of another epoch");
        assert!(out.enter_gate(5));
        let closed = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let inbox = &mut inbox;
            let closer = s.spawn(|| {
                let all_out = inbox.close_gate(std::time::Duration::from_secs(20));
                closed.store(true, Ordering::SeqCst);
                all_out
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!closed.load(Ordering::SeqCst), "it waits while a sender is inside");
            out.leave_gate();
            assert!(closer.join().unwrap());
        });
        assert_eq!(inbox.gate(), None);
        assert!(!out.enter_gate(5), "closed");
        // A sender that stays inside is waited for no longer than the patience given...
        inbox.open_gate(6);
        assert!(out.enter_gate(6));
        let started = std::time::Instant::now();
        assert!(!inbox.close_gate(std::time::Duration::from_millis(20)));
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert!(inbox.undrained());
        // ...and again at the next close, though the gate is closed already.
        assert!(!inbox.close_gate(std::time::Duration::from_millis(20)), "still inside");
        out.leave_gate();
        assert!(inbox.close_gate(std::time::Duration::from_millis(20)));
        assert!(!inbox.undrained(), "it left");
        // One that died inside is not waited for (PID 0x7fff_fff0 is above any pid_max)...
        inbox.open_gate(7);
        assert!(out.enter_gate(7));
        let at = Mapping::lane(out.lane);
        inbox.map.u32(at + L_OWNER).store(0x7fff_fff0, Ordering::Release);
        assert!(inbox.close_gate(std::time::Duration::from_secs(20)));
        // ...nor one whose PID a process that started at another time took since (this
        // one, as if the lane's owner had started a tick earlier).
        inbox.open_gate(8);
        inbox.map.u32(at + L_OWNER).store(my_pid(), Ordering::Release);
        assert!(out.enter_gate(8));
        assert!(!owner_gone(&inbox.map, out.lane, my_pid()), "the owner's PID and start time");
        inbox.map.u64(at + L_BORN).store(my_start_time() - 1, Ordering::Release);
        assert!(owner_gone(&inbox.map, out.lane, my_pid()));
        assert!(inbox.close_gate(std::time::Duration::from_millis(20)), "not left inside");
        assert!(!inbox.undrained());
    }

    #[test]
    fn a_receiver_that_can_copy_from_a_sender_says_so_and_names_it() {
        let name = unique("pulls");
        let mut inbox = Inbox::create(&name, true, true).unwrap();
        let mut out = Outbox::open(&name).unwrap();
        assert!(!out.pulls(), "not before the receiver tried");
        out.send(&envelope_v4(0), IpInfo::default(), b"by value", Beside::default()).unwrap();
        out.send(
            &envelope_v4(1),
            IpInfo::default(),
            b"by reference",
            Beside { by_reference: true, ..Beside::default() },
        )
        .unwrap();
        out.wake();
        let mut got = Vec::new();
        assert_eq!(inbox.receive(8, |_, _, d, arrived| got.push((d.to_vec(), arrived.origin))), 2);
        assert_eq!(got, [(b"by value".to_vec(), None), (b"by reference".to_vec(), Some(my_pid()))]);
        assert!(out.pulls(), "this process can read its own probe word");
        assert_eq!(out.receiver(), my_pid());
        assert!(inbox.pulls_from(my_pid()));
        assert!(!inbox.pulls_from(0x7fff_fff0), "no lane of that process");

        // A lane whose header gives a token its owner's probe word does not hold (a PID
        // reused by another process, say): no copies from it, and what comes flagged by
        // reference in it is dropped.
        let mut other = Outbox::open(&name).unwrap();
        other.map.u64(Mapping::lane(other.lane) + L_TOKEN).store(probe_token() ^ 1, Ordering::Release);
        other.send(&envelope_v4(2), IpInfo::default(), b"x", Beside::default()).unwrap();
        other
            .send(&envelope_v4(3), IpInfo::default(), b"flagged", Beside { by_reference: true, ..Beside::default() })
            .unwrap();
        other.wake();
        let mut got = Vec::new();
        inbox.receive(8, |_, _, d, arrived| got.push((d.to_vec(), arrived.origin)));
        assert_eq!(got, [(b"x".to_vec(), None)]);
        assert!(!other.pulls());
        assert!(out.pulls(), "each lane for itself");

        // An inbox made without the feature (its process captures packets, which must show
        // their data): no sender is told yes, nothing flagged goes in, and it copies from
        // nobody.
        let plain = unique("plain");
        let mut inbox = Inbox::create(&plain, false, true).unwrap();
        let mut out = Outbox::open(&plain).unwrap();
        out.send(&envelope_v4(0), IpInfo::default(), b"x", Beside::default()).unwrap();
        out.send(&envelope_v4(1), IpInfo::default(), b"flagged", Beside { by_reference: true, ..Beside::default() })
            .unwrap();
        out.wake();
        let mut got = Vec::new();
        inbox.receive(8, |_, _, d, arrived| got.push((d.to_vec(), arrived.origin)));
        assert_eq!(got, [(b"x".to_vec(), None)]);
        assert!(!out.pulls());
        assert!(!inbox.pulls_from(my_pid()));

        let mut word = [0u8; 8];
        read_process(my_pid(), std::ptr::from_ref(&PROBE) as u64, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), probe_token());
        assert!(read_process(my_pid(), 8, &mut word).is_err(), "an unmapped address is an error, not a crash");
    }

    #[test]
    fn copies_are_taken_only_where_they_reach_no_further_than_the_user() {
        assert!(adds_no_reach(None, false, Some(0)), "no Yama, no capabilities");
        assert!(adds_no_reach(Some("0\n"), false, Some(0)));
        assert!(!adds_no_reach(Some("1\n"), false, Some(0)), "descendants this process alone may read");
        assert!(!adds_no_reach(Some("1\n"), true, Some(u64::MAX)), "root under Yama 1 too");
        assert!(!adds_no_reach(Some("2\n"), false, Some(0)));
        assert!(!adds_no_reach(Some("3\n"), false, Some(0)));
        assert!(!adds_no_reach(None, false, Some(1 << 19)), "CAP_SYS_PTRACE beyond its user's");
        assert!(adds_no_reach(None, true, Some(u64::MAX)), "root, whose inbox only root writes");
        assert!(!adds_no_reach(None, false, None), "capabilities unknown");
    }

    #[test]
    fn a_new_inbox_removes_those_of_processes_that_are_gone() {
        let (dead, alive) = (unique("dead"), unique("alive"));
        let killed = Inbox::create(&format!("{}{dead}", prefix().unwrap()), true, true).unwrap();
        let live = Inbox::create(&format!("{}{alive}", prefix().unwrap()), true, true).unwrap();
        let reused = Inbox::create(&format!("{}{}", prefix().unwrap(), unique("reused")), true, true).unwrap();
        // As if its process had been killed: PID 0x7fff_fff0 is above any pid_max.
        killed.map.u32(H_PID).store(0x7fff_fff0, Ordering::Relaxed);
        // As if its process had been killed and its PID taken since (by this process): the
        // kernel marked its life word.
        reused.map.u32(H_LIFE).store(crate::life::DEAD, Ordering::Relaxed);
        let _new = Inbox::create(&unique("sweeper"), true, true).unwrap();
        assert!(!killed.path.exists(), "the dead process's inbox is gone");
        assert!(!killed.bell_path.exists(), "and its bell");
        assert!(killed.map.u32(H_CLOSED).load(Ordering::Relaxed) != 0, "and closed for its senders");
        assert!(live.path.exists(), "a live process's inbox stays");
        assert!(!reused.path.exists(), "a dead process's inbox goes, whoever has its PID now");
    }

    #[test]
    fn a_replaced_inbox_is_closed_and_lanes_of_dead_or_departed_senders_are_taken_again() {
        let name = unique("replace");
        let old = Inbox::create(&name, true, true).unwrap();
        let first = Outbox::open(&name).unwrap();
        let second = Outbox::open(&name).unwrap();
        assert_ne!(first.lane, second.lane, "one lane per producer");
        let lane = first.lane;
        drop(first);
        let third = Outbox::open(&name).unwrap();
        assert_eq!(third.lane, lane, "a departed sender's lane is free again");
        // A lane held by a process that no longer exists (PID 0x7fff_fff0 is above pid_max).
        for l in 0..LANES {
            let _ = old.map.u32(Mapping::lane(l) + L_OWNER).compare_exchange(
                0,
                0x7fff_fff0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        assert!(Outbox::open(&name).is_ok(), "a dead owner's lane is taken back");
        let new = Inbox::create(&name, true, true).unwrap();
        assert!(third.is_closed(), "the old inbox tells its senders it is gone");
        drop(old); // must not remove the new inbox's name
        assert!(Outbox::open(&name).is_ok());
        drop(new);
        assert_eq!(Outbox::open(&name).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
