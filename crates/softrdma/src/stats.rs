//! Counters published for other processes: what `softrdma stats` reads.
//!
//! softrdma's "NIC" lives inside each application process, so no kernel file holds a
//! device's counters as `/sys/class/infiniband/rxe0/ports/1/hw_counters/` does for rxe.
//! Instead every open [`Context`](crate::Context) publishes its [`Counters`] in a small file
//! in shared memory, [`stats_dir()`] (`/dev/shm/softrdma/` unless [`STATS_DIR_ENV`] says
//! otherwise), named `<pid>-<n>.stats`, and removes it when it closes. [`scan`] reads every
//! live one; `softrdma stats` sums them per device.
//!
//! # When the file is updated
//!
//! At the end of each receive step of the device: a progress pass (by the progress thread,
//! or by a thread blocked on a completion channel) or an application's poll of an empty
//! CQ. It writes when the counters changed since it last looked and either
//!
//! - the progress thread found nothing to receive: the device is going idle, and this is
//!   its last look before it sleeps; or
//! - 1 ms passed since it last looked: the device is busy, and whoever does the work
//!   publishes (while an application polls, it receives itself and the progress thread
//!   keeps to the timers).
//!
//! That costs no system call and no wake-up: an idle device writes nothing and is never
//! woken to. An application's poll pays a comparison of two timestamps, and at most every
//! millisecond a comparison of the counters. Work the application does without receiving
//! (a post whose packets get no answer) shows at the device's next receive.
//!
//! # The file
//!
//! One page, native byte order, every field a 64-bit word so that both sides reach it
//! only through 64-bit atomics:
//!
//! | word | what |
//! |---|---|
//! | 0 | magic `b"SRDMSTAT"` |
//! | 1 | layout version ([`LAYOUT_VERSION`]) in the low 32 bits, counter count in the high 32 |
//! | 2 | pid in the low 32 bits, UDP port in the next 16 |
//! | 3 | sequence: odd while the values are being written (a seqlock) |
//! | 4..12 | device name, 64 bytes, NUL padded |
//! | 12..14 | command name (`/proc/self/comm`), 16 bytes, NUL padded |
//! | 14..32 | reserved, zero |
//! | 32.. | counter names, 32 bytes each, NUL padded |
//! | then | counter values, one word each, in the order of the names |
//!
//! The names make the file self-describing: a reader built from another version of
//! softrdma reads the counters it finds by name. Only the values and the sequence change
//! after the file appears; the writer creates it under a temporary name (`.<pid>-<n>.tmp`),
//! fills the header, locks it and renames it into place.
//!
//! # Liveness
//!
//! The writer holds an exclusive `flock` on its file for as long as the context is open.
//! The kernel drops the lock when the process dies, however it dies, so a reader that can
//! take a shared lock on a file knows its writer is gone: [`scan`] skips such a file and
//! removes it. PIDs are never trusted for this (they are reused). A process that forks
//! shares the lock with its child until the child exits or execs.
//!
//! The directory is created mode 1777 (like `/tmp`: anyone may publish, nobody may remove
//! another user's file) and files are mode 0600: a user's counters are its own (users of
//! one host stay apart, docs/architecture.md "Many users, one host"; rxe's `hw_counters`
//! are the whole device's, readable by all), and root reads every one. A reader counts the
//! files it may not read ([`Scan::other_users`]).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use rustix::fs::FlockOperation;
use rustix::mm::{MapFlags, ProtFlags};

use crate::device::Device;

/// The environment variable that names the directory of published counters (default
/// [`DEFAULT_STATS_DIR`]). Processes that should see each other must agree on it.
pub const STATS_DIR_ENV: &str = "SOFTRDMA_STATS_DIR";

/// Where counters are published unless [`STATS_DIR_ENV`] is set.
pub const DEFAULT_STATS_DIR: &str = "/dev/shm/softrdma";

/// The version of the file layout (module documentation). A reader skips files of
/// another version.
pub const LAYOUT_VERSION: u32 = 1;

/// The directory of published counters: [`STATS_DIR_ENV`], or [`DEFAULT_STATS_DIR`].
pub fn stats_dir() -> PathBuf {
    std::env::var_os(STATS_DIR_ENV).filter(|v| !v.is_empty()).map_or_else(|| DEFAULT_STATS_DIR.into(), PathBuf::from)
}

/// The counters one open context published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The process.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`: at most 15 bytes).
    pub command: String,
    /// The device (`softrdma_lo`).
    pub device: String,
    /// The UDP port the context uses (4791 unless opened with another).
    pub port: u16,
    /// Every counter, by name, in the writer's order.
    pub counters: Vec<(String, u64)>,
}

impl Published {
    /// The counter named `name`, if the writer has it.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// What [`scan`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The contexts whose process is alive, by file name.
    pub live: Vec<Published>,
    /// Files of processes that are gone, removed (or skipped when they could not be).
    pub stale: usize,
    /// Files that could not be read, and why (another layout version, unreadable).
    pub skipped: Vec<(PathBuf, String)>,
    /// Contexts of other users: their counters are theirs (mode 0600), read by root only.
    pub other_users: usize,
}

/// Reads every live context's counters from [`stats_dir()`], and removes the files of
/// processes that are gone. A directory that does not exist holds nothing.
pub fn scan() -> io::Result<Scan> {
    scan_dir(&stats_dir())
}

/// [`scan`] of `dir`.
pub fn scan_dir(dir: &Path) -> io::Result<Scan> {
    scan_dir_with_paths(dir).map(|(scan, _)| scan)
}

/// [`scan_dir`], with the file of each live context (in the order of `Scan::live`).
pub(crate) fn scan_dir_with_paths(dir: &Path) -> io::Result<(Scan, Vec<PathBuf>)> {
    let mut out = Scan::default();
    let mut live_paths = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((out, live_paths)),
        Err(e) => return Err(e),
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".stats") && !name.starts_with('.') {
            paths.push(entry.path());
        } else if name.starts_with('.') && name.ends_with(".tmp") {
            // A writer that died between creating and publishing its file. A writer that
            // is still filling one holds it for microseconds, so an old one is abandoned.
            let old = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            if old.is_some_and(|age| age.as_secs() > 60) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    paths.sort();
    for path in paths {
        match read_file(&path) {
            Ok(Some(p)) => {
                out.live.push(p);
                live_paths.push(path);
            }
            Ok(None) => {
                out.stale += 1;
                let _ = fs::remove_file(&path);
                // Its `softrdma res` socket ([`crate::res`]), left as the file was.
                let _ = fs::remove_file(crate::res::socket_path(&path));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // closed meanwhile
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => out.other_users += 1,
            Err(e) => out.skipped.push((path, e.to_string())),
        }
    }
    Ok((out, live_paths))
}

// ---- the layout --------------------------------------------------------------------------

const MAGIC: [u8; 8] = *b"SRDMSTAT";
const FILE_LEN: usize = 4096;
const WORD_VERSION: usize = 1;
const WORD_PID: usize = 2;
const WORD_SEQ: usize = 3;
const WORD_DEVICE: usize = 4;
const DEVICE_LEN: usize = 64;
const WORD_COMMAND: usize = 12;
const COMMAND_LEN: usize = 16;
const WORD_NAMES: usize = 32;
const NAME_LEN: usize = 32;
/// Most counters a file holds.
const MAX_COUNTERS: usize = (FILE_LEN / 8 - WORD_NAMES) / (NAME_LEN / 8 + 1);
/// How often a busy device updates its file.
const BUSY_PERIOD_NS: u64 = 1_000_000;
/// Attempts at a consistent read of a file whose writer is mid-update.
const READ_ATTEMPTS: usize = 10_000;

fn word_of_values(count: usize) -> usize {
    WORD_NAMES + count * NAME_LEN / 8
}

/// A file in shared memory, mapped, seen as 64-bit atomic words.
struct Mapping {
    ptr: NonNull<AtomicU64>,
    words: usize,
    // Holds the lock (the writer's) and keeps the file open while mapped.
    _file: File,
}

// SAFETY: the mapping is plain shared memory reached only through atomics; the pointer
// is valid until `Drop` unmaps it, whichever thread that runs on.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` gives only atomic access.
#[allow(unsafe_code)]
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` (a multiple of 8, at most its length).
    #[allow(unsafe_code)]
    fn new(file: File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        // SAFETY: a fresh shared mapping of an open file chosen by the kernel; it aliases
        // no Rust object. `len` does not exceed the file (checked by the callers), so no
        // access faults unless the file's owner truncates it under us (module docs).
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, file.as_fd(), 0) }?;
        let ptr = NonNull::new(ptr.cast::<AtomicU64>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, words: len / 8, _file: file })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `words` × 8 bytes, page aligned, and lives as long as
        // `self`. Every access to it, in this and any other process, is a 64-bit atomic
        // (this type hands out nothing else), so there is no data race; a read-only
        // mapping is only ever loaded from.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.words)
        }
    }

    fn word(&self, i: usize) -> u64 {
        self.words()[i].load(Ordering::Relaxed)
    }

    fn set(&self, i: usize, v: u64) {
        self.words()[i].store(v, Ordering::Relaxed);
    }

    fn bytes(&self, first_word: usize, len: usize) -> Vec<u8> {
        (first_word..first_word + len / 8).flat_map(|w| self.word(w).to_ne_bytes()).collect()
    }

    fn set_bytes(&self, first_word: usize, len: usize, text: &str) {
        let mut buf = vec![0u8; len];
        let n = text.len().min(len - 1);
        buf[..n].copy_from_slice(&text.as_bytes()[..n]);
        for (i, chunk) in buf.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.set(first_word + i, u64::from_ne_bytes(w));
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Mapping::new` with this address and length, and
        // the `&[AtomicU64]` borrows of it end with `self`.
        #[allow(unsafe_code)]
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.words * 8) };
    }
}

fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Reads one file: `Ok(None)` when its writer is gone.
fn read_file(path: &Path) -> io::Result<Option<Published>> {
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    let file = OpenOptions::new().read(true).custom_flags(nofollow).open(path)?;
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => return Ok(None), // nobody holds it: the writer is gone
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
        Err(e) => return Err(e.into()),
    }
    let len = file.metadata()?.len();
    if len < (WORD_NAMES * 8) as u64 || len > 1 << 20 || len % 8 != 0 {
        return Err(io::Error::other(format!("{len} bytes: not a softrdma counters file")));
    }
    let map = Mapping::new(file, len as usize, false)?;
    if map.word(0).to_ne_bytes() != MAGIC {
        return Err(io::Error::other("not a softrdma counters file (bad magic)"));
    }
    let version = map.word(WORD_VERSION) as u32;
    if version != LAYOUT_VERSION {
        return Err(io::Error::other(format!(
            "layout version {version}; this softrdma reads version {LAYOUT_VERSION} (use the softrdma of that process)"
        )));
    }
    let count = (map.word(WORD_VERSION) >> 32) as usize;
    if word_of_values(count) + count > map.words {
        return Err(io::Error::other(format!("{count} counters do not fit the file")));
    }
    let pid_port = map.word(WORD_PID);
    let names: Vec<String> = (0..count).map(|i| text(&map.bytes(WORD_NAMES + i * NAME_LEN / 8, NAME_LEN))).collect();
    let values = read_values(&map, count)
        .ok_or_else(|| io::Error::other("its writer is in the middle of an update and does not finish (stopped?)"))?;
    Ok(Some(Published {
        pid: pid_port as u32,
        command: text(&map.bytes(WORD_COMMAND, COMMAND_LEN)),
        device: text(&map.bytes(WORD_DEVICE, DEVICE_LEN)),
        port: (pid_port >> 32) as u16,
        counters: names.into_iter().zip(values).collect(),
    }))
}

/// The `count` values, as one consistent update left them (the seqlock's read side), or
/// `None` if the writer kept changing them.
fn read_values(map: &Mapping, count: usize) -> Option<Vec<u64>> {
    let first = word_of_values(count);
    let words = map.words();
    for _ in 0..READ_ATTEMPTS {
        let before = words[WORD_SEQ].load(Ordering::Acquire);
        if before & 1 == 1 {
            std::thread::yield_now();
            continue;
        }
        let values: Vec<u64> = words[first..first + count].iter().map(|w| w.load(Ordering::Relaxed)).collect();
        fence(Ordering::Acquire);
        if words[WORD_SEQ].load(Ordering::Relaxed) == before {
            return Some(values);
        }
    }
    None
}

/// Counters of a device.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Counters {
    /// The engine's protocol counters.
    pub engine: softrdma_engine::Counters,
    /// Datagrams the kernel would not take (full socket buffer, no route).
    pub send_errors: u64,
    /// Datagrams for QP1 that were not CM MADs in valid UD packets, dropped.
    pub gsi_dropped: u64,
    /// Packets sent to other processes of this host through shared memory (the same-host
    /// path), not a socket, ACKs beside packets included; they count in `sent_packets` too.
    pub same_host_sent: u64,
    /// Packets received through shared memory, ACKs beside packets included; they count in
    /// `rcvd_packets` too if accepted.
    /// Those whose data this process copied from the sender's memory (carried by reference:
    /// the same-host path's one copy) are the engine's `rcvd_by_reference`.
    pub same_host_rcvd: u64,
    /// Times this process rang the bell of another process of the host that had left its
    /// packets untaken, taking none, for 100 µs (its application had polled of late, so its
    /// progress thread left the inbox to it, but it polled no more: a C program waiting in
    /// its memory for the WRITE that waited there).
    pub same_host_nudges_sent: u64,
    /// Times this process's progress thread took the inbox on such a ring while its
    /// application had polled of late.
    pub same_host_nudges_taken: u64,
    /// Waits on a completion channel (`get_cq_event`) whose event came while the waiting
    /// thread still polled ([`ContextOptions::wait_spin`](crate::ContextOptions::wait_spin)).
    pub channel_waits_polled: u64,
    /// Waits on a completion channel that slept (the polling window was closed, or the
    /// event came after it), or timed out.
    pub channel_waits_slept: u64,
    /// Polls that returned the completion they found while receiving and left the ACKs that
    /// came with it (the ACK of the poller's own message, paired with the peer's answer on
    /// a socket, or beside it in the inbox) for their next call, or the progress thread's
    /// next pass.
    pub acks_left_for_next_poll: u64,
    /// Passes of the progress thread that took the sockets the application, polling of
    /// late, left readable without polling for 10 µs (a program waiting in its memory for
    /// a WRITE that came by a socket).
    pub sockets_left_by_app: u64,
    /// What injected faults (`SOFTRDMA_FAULTS`) did to the datagrams the device received.
    pub faults: crate::faults::FaultCounters,
    /// The connection manager's counters (MADs sent, received, dropped, retried).
    pub cm: softrdma_cm::CmCounters,
}

impl Counters {
    /// Every counter with its name, in a fixed order: the engine's (named as its fields),
    /// `send_errors`, `gsi_dropped`, `same_host_sent`, `same_host_rcvd`,
    /// `same_host_nudges_sent`, `same_host_nudges_taken`, `channel_waits_polled`,
    /// `channel_waits_slept`, `acks_left_for_next_poll`, `sockets_left_by_app`, the
    /// injected faults' with a `faults_` prefix, then the connection manager's with a `cm_` prefix.
    /// These names are what `softrdma stats` prints and what [`crate::stats`] publishes.
    pub fn named(&self) -> [(&'static str, u64); 48] {
        // Destructured in full, so that a new counter cannot be left out.
        let softrdma_engine::Counters {
            sent_packets,
            rcvd_packets,
            rcvd_malformed,
            rcvd_icrc_exact,
            rcvd_icrc_predicted,
            rcvd_icrc_solved,
            rcvd_icrc_errors,
            rcvd_dropped,
            duplicate_requests,
            out_of_sequence,
            retransmitted_packets,
            ack_timeouts,
            rnr_naks_sent,
            rnr_naks_rcvd,
            naks_sent,
            naks_rcvd,
            resp_remote_access_errors,
            resp_invalid_requests,
            resp_operational_errors,
            rcvd_wrong_source,
            rcvd_auth_failures,
            cnps_sent,
            cnps_rcvd,
            rcvd_by_reference,
            rcvd_acks_beside,
            sent_by_short_path,
            rcvd_by_short_path,
            direct_atomics,
        } = self.engine;
        let softrdma_cm::CmCounters {
            mads_sent,
            mads_received,
            mads_dropped,
            mads_retried,
            duplicates,
            transmit_queue_full,
        } = self.cm;
        let crate::faults::FaultCounters { dropped, duplicated, delayed, corrupted } = self.faults;
        [
            ("sent_packets", sent_packets),
            ("rcvd_packets", rcvd_packets),
            ("rcvd_malformed", rcvd_malformed),
            ("rcvd_icrc_exact", rcvd_icrc_exact),
            ("rcvd_icrc_predicted", rcvd_icrc_predicted),
            ("rcvd_icrc_solved", rcvd_icrc_solved),
            ("rcvd_icrc_errors", rcvd_icrc_errors),
            ("rcvd_dropped", rcvd_dropped),
            ("duplicate_requests", duplicate_requests),
            ("out_of_sequence", out_of_sequence),
            ("retransmitted_packets", retransmitted_packets),
            ("ack_timeouts", ack_timeouts),
            ("rnr_naks_sent", rnr_naks_sent),
            ("rnr_naks_rcvd", rnr_naks_rcvd),
            ("naks_sent", naks_sent),
            ("naks_rcvd", naks_rcvd),
            ("resp_remote_access_errors", resp_remote_access_errors),
            ("resp_invalid_requests", resp_invalid_requests),
            ("resp_operational_errors", resp_operational_errors),
            ("rcvd_wrong_source", rcvd_wrong_source),
            ("rcvd_auth_failures", rcvd_auth_failures),
            ("cnps_sent", cnps_sent),
            ("cnps_rcvd", cnps_rcvd),
            ("rcvd_by_reference", rcvd_by_reference),
            ("rcvd_acks_beside", rcvd_acks_beside),
            ("sent_by_short_path", sent_by_short_path),
            ("rcvd_by_short_path", rcvd_by_short_path),
            ("direct_atomics", direct_atomics),
            ("send_errors", self.send_errors),
            ("gsi_dropped", self.gsi_dropped),
            ("same_host_sent", self.same_host_sent),
            ("same_host_rcvd", self.same_host_rcvd),
            ("same_host_nudges_sent", self.same_host_nudges_sent),
            ("same_host_nudges_taken", self.same_host_nudges_taken),
            ("channel_waits_polled", self.channel_waits_polled),
            ("channel_waits_slept", self.channel_waits_slept),
            ("acks_left_for_next_poll", self.acks_left_for_next_poll),
            ("sockets_left_by_app", self.sockets_left_by_app),
            ("faults_dropped", dropped),
            ("faults_duplicated", duplicated),
            ("faults_delayed", delayed),
            ("faults_corrupted", corrupted),
            ("cm_mads_sent", mads_sent),
            ("cm_mads_received", mads_received),
            ("cm_mads_dropped", mads_dropped),
            ("cm_mads_retried", mads_retried),
            ("cm_duplicates", duplicates),
            ("cm_transmit_queue_full", transmit_queue_full),
        ]
    }
}

// ---- the writer --------------------------------------------------------------------------

/// A context's published counters: its file, and what it last wrote.
pub(crate) struct Publisher {
    file: Option<StatsFile>,
    last: Counters,
    last_ns: u64,
}

impl Publisher {
    /// Publishes the counters of a context of `device` on UDP `port`. Counters that cannot
    /// be published (no `/dev/shm`, a directory of someone else's) do not stop the device:
    /// it then publishes nothing.
    pub(crate) fn open(device: &Device, port: u16) -> Publisher {
        Publisher {
            file: StatsFile::create(&stats_dir(), device.name(), port).ok(),
            last: Counters::default(),
            last_ns: 0,
        }
    }
}

impl Publisher {
    /// The published file, if publishing is on (the `softrdma res` socket is named after
    /// it).
    pub(crate) fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    /// The hook at the end of each receive step (`worked`: whether it received anything or
    /// fired a timer; `progress_thread`: the device's progress thread, if it started);
    /// see the module documentation for when it writes, and so when it calls `counters`.
    pub(crate) fn after_receive(
        &mut self,
        now: softrdma_engine::Instant,
        worked: bool,
        progress_thread: Option<std::thread::ThreadId>,
        counters: impl FnOnce() -> Counters,
    ) {
        let now = now.as_nanos();
        if self.file.is_none() {
            return;
        }
        let busy_due = now.saturating_sub(self.last_ns) >= BUSY_PERIOD_NS;
        if !busy_due && (worked || !is_progress_thread(progress_thread)) {
            return;
        }
        let counters = counters();
        self.last_ns = now;
        if counters != self.last {
            if let Some(f) = &self.file {
                f.write(&counters);
            }
            self.last = counters;
        }
    }
}

/// Whether this thread is `progress`, the progress thread of a device. A thread is the
/// progress thread of at most one device and every other device's application thread, so
/// the first answer holds for the thread's life; it is kept, since applications ask on
/// every poll.
pub(crate) fn is_progress_thread(progress: Option<std::thread::ThreadId>) -> bool {
    thread_local! {
        static PROGRESS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    PROGRESS.with(|p| {
        p.get().unwrap_or_else(|| {
            match progress {
                Some(id) => {
                    let mine = id == std::thread::current().id();
                    p.set(Some(mine));
                    mine
                }
                None => false, // the device is starting: ask again later
            }
        })
    })
}

/// One published file, locked and mapped; removed when dropped.
struct StatsFile {
    map: Mapping,
    path: PathBuf,
}

impl StatsFile {
    fn create(dir: &Path, device: &str, port: u16) -> io::Result<StatsFile> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        prepare_dir(dir)?;
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{pid}-{n}.tmp"));
        let path = dir.join(format!("{pid}-{n}.stats"));
        let open = || {
            let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).custom_flags(nofollow).open(&tmp)
        };
        let file = match open() {
            // Left by an earlier process with this pid that died while creating it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp)?;
                open()?
            }
            r => r?,
        };
        let published = (|| {
            // Its user's alone, whatever the umask: users of one host stay apart.
            rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(0o600))?;
            file.set_len(FILE_LEN as u64)?;
            rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)?;
            let map = Mapping::new(file, FILE_LEN, true)?;
            let names = Counters::default().named();
            debug_assert!(names.len() <= MAX_COUNTERS);
            map.set(0, u64::from_ne_bytes(MAGIC));
            map.set(WORD_VERSION, u64::from(LAYOUT_VERSION) | (names.len() as u64) << 32);
            map.set(WORD_PID, u64::from(pid) | u64::from(port) << 32);
            map.set_bytes(WORD_DEVICE, DEVICE_LEN, device);
            let comm = fs::read_to_string("/proc/self/comm").unwrap_or_default();
            map.set_bytes(WORD_COMMAND, COMMAND_LEN, comm.trim_end());
            for (i, (name, _)) in names.iter().enumerate() {
                map.set_bytes(WORD_NAMES + i * NAME_LEN / 8, NAME_LEN, name);
            }
            fs::rename(&tmp, &path)?;
            Ok::<_, io::Error>(map)
        })();
        match published {
            Ok(map) => Ok(StatsFile { map, path }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Writes `counters` under the seqlock (a reader retries while the sequence is odd or
    /// changed under it).
    fn write(&self, counters: &Counters) {
        let named = counters.named();
        let words = self.map.words();
        let seq = words[WORD_SEQ].load(Ordering::Relaxed);
        words[WORD_SEQ].store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let first = word_of_values(named.len());
        for (w, (_, v)) in words[first..first + named.len()].iter().zip(named) {
            w.store(v, Ordering::Relaxed);
        }
        words[WORD_SEQ].store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Closes the file without removing it, as a process that dies does.
    #[cfg(test)]
    fn abandon(mut self) -> PathBuf {
        std::mem::take(&mut self.path) // `Drop` then removes nothing
    }
}

impl Drop for StatsFile {
    fn drop(&mut self) {
        // Removed while still locked, so no reader mistakes it for a dead process's.
        let _ = fs::remove_file(&self.path);
    }
}

/// Creates `dir` (mode 1777) if it does not exist, and refuses one that is a symbolic link
/// or belongs to another user than this one or root.
fn prepare_dir(dir: &Path) -> io::Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o1777))?;
    }
    let meta = fs::symlink_metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || (meta.uid() != me && meta.uid() != 0) {
        return Err(io::Error::other(format!("{} is not a directory of this user or root", dir.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(v: u64) -> Counters {
        let mut c = Counters::default();
        c.engine.sent_packets = v;
        c.engine.rcvd_packets = v;
        c.engine.naks_rcvd = v;
        c.send_errors = v;
        c.cm.mads_retried = v;
        c
    }

    #[test]
    fn a_published_file_reads_back_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let f = StatsFile::create(dir.path(), "softrdma_lo", 4791).unwrap();
        f.write(&counters(42));
        let scan = scan_dir(dir.path()).unwrap();
        assert_eq!(scan.live.len(), 1, "{scan:?}");
        let p = &scan.live[0];
        assert_eq!((p.pid, p.device.as_str(), p.port), (std::process::id(), "softrdma_lo", 4791));
        assert!(!p.command.is_empty());
        let want: Vec<(String, u64)> = counters(42).named().iter().map(|&(n, v)| (n.to_string(), v)).collect();
        assert_eq!(p.counters, want);
        assert_eq!(p.counter("cm_mads_retried"), Some(42));
        drop(f);
        assert_eq!(scan_dir(dir.path()).unwrap(), Scan::default(), "removed when the context closes");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_whose_writer_is_gone_is_not_counted_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let live = StatsFile::create(dir.path(), "softrdma_lo", 4791).unwrap();
        let dead = StatsFile::create(dir.path(), "softrdma_lo", 4791).unwrap();
        dead.write(&counters(7));
        let path = dead.abandon();
        assert!(path.exists(), "a dead writer leaves its file");
        let scan = scan_dir(dir.path()).unwrap();
        assert_eq!((scan.live.len(), scan.stale), (1, 1), "{scan:?}");
        assert_eq!(scan.live[0].counter("sent_packets"), Some(0));
        assert!(!path.exists(), "the reader removed it");
        drop(live);
    }

    #[test]
    fn readers_never_see_a_half_written_update() {
        let dir = tempfile::tempdir().unwrap();
        let f = StatsFile::create(dir.path(), "softrdma_lo", 4791).unwrap();
        let file = File::open(&f.path).unwrap();
        let reader = Mapping::new(file, FILE_LEN, false).unwrap();
        let count = Counters::default().named().len();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mut reads, mut changes, mut last) = (0, 0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut i = 0u64;
                // Far more often than a device publishes (every 1 ms at most), with pauses
                // in which a read can complete; for 10 s at most, should the reader fail.
                let start = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < std::time::Duration::from_secs(10) {
                    i += 1;
                    f.write(&counters(i));
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(5) {
                        std::hint::spin_loop();
                    }
                }
            });
            // Until enough reads saw enough updates (a loaded machine may starve the
            // writer for a while), 8 s at most.
            let start = std::time::Instant::now();
            while (reads <= 1000 || changes <= 100) && start.elapsed() < std::time::Duration::from_secs(8) {
                let Some(values) = read_values(&reader, count) else { continue };
                let named: Vec<u64> = counters(values[0]).named().iter().map(|&(_, v)| v).collect();
                assert_eq!(values, named, "an update seen half written");
                reads += 1;
                changes += usize::from(values[0] != last);
                last = values[0];
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(reads > 100 && changes > 10, "{reads} reads saw {changes} updates: too few to tell");
    }

    #[test]
    fn other_files_are_skipped_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let f = StatsFile::create(dir.path(), "softrdma_lo", 4791).unwrap();
        f.map.set(WORD_VERSION, 99 | 21 << 32);
        let scan = scan_dir(dir.path()).unwrap();
        assert!(scan.live.is_empty());
        assert!(scan.skipped[0].1.contains("layout version 99"), "{scan:?}");
    }

    #[test]
    fn every_counter_fits_the_file() {
        assert!(Counters::default().named().len() <= MAX_COUNTERS);
        assert!(Counters::default().named().iter().all(|(n, _)| n.len() < NAME_LEN));
    }
}
