//! Packet capture: `SOFTRDMA_PCAP=path`, or [`crate::ContextOptions::capture`], writes the
//! packets a device sends and receives to a pcap file that Wireshark and tshark decode as
//! RoCEv2 (Ethernet framing with made-up MAC addresses, the IP and UDP headers Linux sends).
//!
//! All the devices a process opens with the environment variable share one file, so one
//! capture shows both ends of a loopback run.
//!
//! Two refinements ([`CaptureOptions`]; in the environment beside `SOFTRDMA_PCAP`):
//!
//! - **By QP** (`SOFTRDMA_PCAP_QP=0x11,0x12`): only the packets whose BTH destination QP
//!   is in the set, or that a local QP in the set sent. Naming a local QP keeps both
//!   directions of its connections (what it sends, and what is sent to it); naming only the
//!   peer's QPN keeps what is sent to the peer. QP1 is the CM's: its MADs (REQ, REP, RTU,
//!   DREQ, ...) are kept only when the set holds 1, whatever QP they connect.
//! - **A ring** (`SOFTRDMA_PCAP_RING=64M` or `=10000p`): the last 64 MiB (or 10000 packets)
//!   are kept in memory, in a byte ring allocated once (records are overwritten oldest
//!   first; nothing is allocated per packet), and written to the file when the device
//!   closes (the last reference to its context goes; each close rewrites the file with the
//!   ring as it is then) and when the process exits through `exit` or by returning from
//!   `main` (an `atexit` hook). The ring lives in the process's memory: a process killed by
//!   a signal (SIGKILL, or SIGINT/SIGTERM without a handler that calls `exit`) or that
//!   crashes leaves the file as it was at the last close, empty (a pcap header only) if no
//!   device had closed. A long run that fails at the end thus leaves its last moments, if
//!   it ends by exiting.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use softrdma_pcap::CaptureWriter;
use softrdma_wire::{BthPacket, Envelope, Qpn};

use crate::Error;

/// The environment variable naming the capture file.
pub const CAPTURE_ENV: &str = "SOFTRDMA_PCAP";
/// The environment variable that limits the capture to some QPs ([`CaptureOptions::qps`]).
pub const CAPTURE_QP_ENV: &str = "SOFTRDMA_PCAP_QP";
/// The environment variable that makes the capture a ring ([`CaptureOptions::ring`]).
pub const CAPTURE_RING_ENV: &str = "SOFTRDMA_PCAP_RING";

/// What to capture, and how ([`crate::ContextOptions::capture`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureOptions {
    /// The pcap file (created, or truncated, when the device opens).
    pub path: PathBuf,
    /// Only the packets of these QPs (module documentation); `None` keeps every packet.
    pub qps: Option<BTreeSet<Qpn>>,
    /// Keep only the last packets in memory and write them out when the device closes or
    /// the process exits; `None` writes every packet as it goes.
    pub ring: Option<RingSize>,
}

impl CaptureOptions {
    /// Every packet, written as it goes, to `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), qps: None, ring: None }
    }

    /// The capture the environment asks for: `SOFTRDMA_PCAP`, refined by
    /// `SOFTRDMA_PCAP_QP` and `SOFTRDMA_PCAP_RING`. `None` without `SOFTRDMA_PCAP`.
    pub fn from_env() -> Result<Option<Self>, Error> {
        let Some(path) = std::env::var_os(CAPTURE_ENV).filter(|p| !p.is_empty()) else { return Ok(None) };
        let mut options = Self::new(path);
        if let Some(v) = std::env::var_os(CAPTURE_QP_ENV) {
            let v = v.to_string_lossy();
            options.qps = Some(parse_qps(&v).map_err(|problem| bad_setting(CAPTURE_QP_ENV, &v, problem, "0x11,0x12"))?);
        }
        if let Some(v) = std::env::var_os(CAPTURE_RING_ENV) {
            let v = v.to_string_lossy();
            let ring = RingSize::parse(&v).map_err(|problem| bad_setting(CAPTURE_RING_ENV, &v, problem, "64M"))?;
            options.ring = Some(ring);
        }
        Ok(Some(options))
    }
}

fn bad_setting(name: &'static str, value: &str, problem: String, example: &'static str) -> Error {
    Error::BadSetting { name, value: value.to_string(), problem, example }
}

impl From<PathBuf> for CaptureOptions {
    fn from(path: PathBuf) -> Self {
        Self::new(path)
    }
}

impl From<&Path> for CaptureOptions {
    fn from(path: &Path) -> Self {
        Self::new(path)
    }
}

/// How much a capture ring keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingSize {
    /// The last packets that fit in this many bytes of frames (`64M`, `512K`, `1G`, or a
    /// number of bytes); from 64 KiB to 64 GiB.
    Bytes(u64),
    /// The last this many packets (`10000p`), up to a million. The ring reserves room for
    /// that many of the largest packets (4.4 KB each), resident only as it fills.
    Packets(u32),
}

/// The smallest byte ring: a few of the largest packets.
const RING_BYTES_MIN: u64 = 64 << 10;
/// The largest byte ring.
const RING_BYTES_MAX: u64 = 64 << 30;
/// The most packets a packet ring keeps.
const RING_PACKETS_MAX: u32 = 1_000_000;
/// The largest frame: Ethernet, IPv6 and UDP headers around the largest datagram.
const FRAME_MAX: usize = 14 + 40 + 8 + softrdma_udp::local::DATAGRAM_MAX;
/// A ring record's header: the frame's length (u32) and its time, in nanoseconds since the
/// Unix epoch (u64), native byte order (the ring never leaves the process).
const RECORD_HEADER: usize = 12;

impl RingSize {
    /// Parses `64M` (bytes, with an optional `K`, `M` or `G` suffix: powers of 1024) or
    /// `10000p` (packets).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = |why: &str| format!("{why} (a size in bytes with K, M or G, or a packet count ending in p)");
        if let Some(n) = t.strip_suffix(['p', 'P']) {
            let n: u32 = n.trim().parse().map_err(|_| bad("not a packet count"))?;
            if n == 0 || n > RING_PACKETS_MAX {
                return Err(format!("a packet ring keeps 1 to {RING_PACKETS_MAX} packets"));
            }
            return Ok(RingSize::Packets(n));
        }
        let (digits, unit) = match t.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_uppercase()),
            _ => (t, 'B'),
        };
        let shift = match unit {
            'B' => 0,
            'K' => 10,
            'M' => 20,
            'G' => 30,
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        let n: u64 = digits.trim().parse().map_err(|_| bad("not a size"))?;
        let bytes = n.checked_shl(shift).filter(|b| b >> shift == n).unwrap_or(u64::MAX);
        if !(RING_BYTES_MIN..=RING_BYTES_MAX).contains(&bytes) {
            return Err("a byte ring holds 64K to 64G".to_string());
        }
        Ok(RingSize::Bytes(bytes))
    }

    /// The ring's bytes and the most records it keeps.
    fn layout(self) -> (usize, usize) {
        match self {
            RingSize::Bytes(n) => (usize::try_from(n).unwrap_or(usize::MAX), usize::MAX),
            RingSize::Packets(n) => (n as usize * (RECORD_HEADER + FRAME_MAX), n as usize),
        }
    }
}

impl std::str::FromStr for RingSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// Parses a list of QPNs: `0x11,0x12` (hex with `0x`, or decimal), separated by commas or
/// spaces.
pub(crate) fn parse_qps(s: &str) -> Result<BTreeSet<Qpn>, String> {
    let mut set = BTreeSet::new();
    for item in s.split([',', ' ']).map(str::trim).filter(|i| !i.is_empty()) {
        let n = match item.strip_prefix("0x").or_else(|| item.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => item.parse(),
        };
        let qpn = n.ok().and_then(Qpn::new).ok_or_else(|| {
            format!("{item:?} is not a QP number (0 to 0xffffff, hex with 0x or decimal; 1 is the CM's QP1)")
        })?;
        set.insert(qpn);
    }
    if set.is_empty() {
        return Err("no QP number given".to_string());
    }
    Ok(set)
}

/// The file behind a buffer that the capture's owner can flush: the pcap writer owns its
/// writer and offers no flush, so it writes into this shared handle.
#[derive(Clone)]
struct Shared(Arc<Mutex<BufWriter<File>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).flush()
    }
}

/// Where the packets go.
#[derive(Clone)]
enum Sink {
    /// Straight to the file, buffered (an unbuffered capture made every packet cost two
    /// more system calls, and a busy multi-process run 25 times slower); the progress thread
    /// flushes whenever the device goes idle, and dropping the device flushes, so a capture
    /// lags the traffic by at most one burst.
    Stream { pcap: Arc<Mutex<CaptureWriter<Shared>>>, file: Shared },
    /// Into a ring, written out at close and exit.
    Ring(Arc<Mutex<Ring>>),
}

/// A capture, possibly shared by several devices: its sink and its filter.
#[derive(Clone)]
struct Writer {
    sink: Sink,
    /// The QPs kept, sorted; `None`: all.
    qps: Option<Arc<[u32]>>,
}

/// A device's handle on a capture.
pub(crate) struct Capture {
    writer: Writer,
    /// A frame being put together for the ring: reused, so the data path does not allocate.
    scratch: Vec<u8>,
}

static FROM_ENV: OnceLock<Result<Writer, String>> = OnceLock::new();

impl Capture {
    /// A new capture as `options` say (its file created, or truncated).
    pub(crate) fn create(options: &CaptureOptions) -> Result<Capture, Error> {
        Ok(Capture { writer: Writer::create(options)?, scratch: Vec::with_capacity(FRAME_MAX) })
    }
}

impl Writer {
    /// The sink and filter `options` ask for (the file created, or truncated).
    fn create(options: &CaptureOptions) -> Result<Writer, Error> {
        let path = &options.path;
        let what = || format!("creating capture file {}", path.display());
        let file = File::create(path).map_err(|e| Error::io(what(), e))?;
        let qps = options.qps.as_ref().map(|s| s.iter().map(|q| q.value()).collect::<Arc<[u32]>>());
        let sink = match options.ring {
            None => {
                let file = Shared(Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file))));
                let pcap = CaptureWriter::new(file.clone()).map_err(|e| Error::io(what(), std::io::Error::other(e)))?;
                Sink::Stream { pcap: Arc::new(Mutex::new(pcap)), file }
            }
            Some(size) => {
                // The file holds a pcap header at once: an empty capture until the ring is
                // written, which says the ring was lost if the process dies first.
                CaptureWriter::new(file).map_err(|e| Error::io(what(), std::io::Error::other(e)))?;
                let ring = Ring::new(size, path.clone()).map_err(|e| Error::io(what(), e))?;
                let ring = Arc::new(Mutex::new(ring));
                register_for_exit(&ring);
                Sink::Ring(ring)
            }
        };
        Ok(Writer { sink, qps })
    }
}

impl Capture {
    /// The process's capture named by `SOFTRDMA_PCAP` (with `SOFTRDMA_PCAP_QP` and
    /// `SOFTRDMA_PCAP_RING`), created on first use.
    pub(crate) fn from_env() -> Result<Option<Capture>, Error> {
        if std::env::var_os(CAPTURE_ENV).is_none_or(|p| p.is_empty()) {
            for refinement in [CAPTURE_QP_ENV, CAPTURE_RING_ENV] {
                if std::env::var_os(refinement).is_some() {
                    tracing::warn!(target: "softrdma::capture", "{refinement} is set but {CAPTURE_ENV} is not: nothing is captured (set {CAPTURE_ENV}=FILE)");
                }
            }
            return Ok(None);
        }
        let shared = FROM_ENV.get_or_init(|| {
            // Set when checked above, unless the environment changed in between.
            let options = CaptureOptions::from_env()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{CAPTURE_ENV} was unset while the capture was being set up"))?;
            Writer::create(&options).map_err(|e| {
                format!(
                    "{CAPTURE_ENV}={}: {e} (check that its directory exists and is writable)",
                    options.path.display()
                )
            })
        });
        match shared {
            Ok(w) => Ok(Some(Capture { writer: w.clone(), scratch: Vec::with_capacity(FRAME_MAX) })),
            Err(e) => Err(Error::io("opening the capture the environment asks for", std::io::Error::other(e.clone()))),
        }
    }

    /// Records one datagram (a UDP payload) the device received, in its envelope.
    pub(crate) fn write(&mut self, envelope: &Envelope, payload: &[u8]) {
        self.record(None, envelope, payload);
    }

    /// Records one datagram that local QP `local_qp` sent.
    pub(crate) fn write_sent(&mut self, local_qp: Qpn, envelope: &Envelope, payload: &[u8]) {
        self.record(Some(local_qp), envelope, payload);
    }

    fn record(&mut self, local_qp: Option<Qpn>, envelope: &Envelope, payload: &[u8]) {
        if let Some(qps) = &self.writer.qps {
            let dest = BthPacket::new_checked(payload).map(|b| b.dest_qp().value()).ok();
            let wanted = |q: Option<u32>| q.is_some_and(|q| qps.binary_search(&q).is_ok());
            if !wanted(dest) && !wanted(local_qp.map(Qpn::value)) {
                return;
            }
        }
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        match &self.writer.sink {
            Sink::Stream { pcap, .. } => {
                let mut w = pcap.lock().unwrap_or_else(PoisonError::into_inner);
                // A capture that cannot be written (disk full) must not stop the device.
                let _ = w.write_roce(ts, envelope, payload);
            }
            Sink::Ring(ring) => {
                if softrdma_pcap::frame_roce(envelope, payload, &mut self.scratch).is_ok() {
                    ring.lock().unwrap_or_else(PoisonError::into_inner).push(ts, &self.scratch);
                }
            }
        }
    }

    /// Pushes what is buffered to the file (a ring waits for the close).
    pub(crate) fn flush(&mut self) {
        if let Sink::Stream { file, .. } = &mut self.writer.sink {
            let _ = file.flush();
        }
    }
}

impl Drop for Capture {
    /// The device is closing: what is buffered goes to the file, and a ring is written out.
    fn drop(&mut self) {
        match &mut self.writer.sink {
            Sink::Stream { file, .. } => {
                let _ = file.flush();
            }
            Sink::Ring(ring) => {
                let _ = ring.lock().unwrap_or_else(PoisonError::into_inner).write_out();
            }
        }
    }
}

/// The last frames, in a byte ring allocated once: records (`RECORD_HEADER`, then the
/// frame) one after the other, wrapping at the end, the oldest overwritten first.
struct Ring {
    buf: Box<[u8]>,
    /// Where the oldest record starts.
    tail: usize,
    /// Bytes in use from `tail` (wrapping).
    used: usize,
    /// Records in use.
    records: usize,
    /// The most records kept (a packet ring's count; a byte ring's is unbounded).
    records_max: usize,
    /// Frames overwritten or too large to keep: the file says nothing of them.
    dropped: u64,
    path: PathBuf,
    /// The process that made it: a child of `fork` that exits must not replace the file
    /// with its copy of the parent's ring.
    pid: u32,
}

impl Ring {
    fn new(size: RingSize, path: PathBuf) -> std::io::Result<Ring> {
        let (bytes, records_max) = size.layout();
        let mut buf = Vec::new();
        // Zeroed memory comes from the kernel as it is touched: a large ring costs only what
        // it holds.
        buf.try_reserve_exact(bytes)
            .map_err(|_| std::io::Error::other(format!("cannot allocate a {bytes}-byte capture ring")))?;
        buf.resize(bytes, 0);
        let pid = std::process::id();
        Ok(Ring { buf: buf.into_boxed_slice(), tail: 0, used: 0, records: 0, records_max, dropped: 0, path, pid })
    }

    /// Keeps `frame`, captured at `ts` (since the Unix epoch), overwriting the oldest
    /// records it needs room from.
    fn push(&mut self, ts: Duration, frame: &[u8]) {
        let need = RECORD_HEADER + frame.len();
        if need > self.buf.len() {
            self.dropped += 1;
            return;
        }
        // Each pass drops one record, so this ends within `records` passes: with none left,
        // `used` is 0 and the frame fits.
        while self.records > 0 && (self.records >= self.records_max || self.buf.len() - self.used < need) {
            let len = self.frame_len_at(self.tail);
            let whole = RECORD_HEADER + len;
            self.tail = (self.tail + whole) % self.buf.len();
            self.used -= whole;
            self.records -= 1;
            self.dropped += 1;
        }
        let head = (self.tail + self.used) % self.buf.len();
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let nanos = u64::try_from(ts.as_nanos()).unwrap_or(u64::MAX);
        self.put(head, &len.to_ne_bytes());
        self.put(head + 4, &nanos.to_ne_bytes());
        self.put(head + RECORD_HEADER, frame);
        self.used += need;
        self.records += 1;
    }

    /// Copies `bytes` into the ring at `at` (wrapping).
    fn put(&mut self, at: usize, bytes: &[u8]) {
        let at = at % self.buf.len();
        let first = bytes.len().min(self.buf.len() - at);
        self.buf[at..at + first].copy_from_slice(&bytes[..first]);
        self.buf[..bytes.len() - first].copy_from_slice(&bytes[first..]);
    }

    /// Copies the ring's bytes at `at` (wrapping) into `out`.
    fn get(&self, at: usize, out: &mut [u8]) {
        let at = at % self.buf.len();
        let first = out.len().min(self.buf.len() - at);
        out[..first].copy_from_slice(&self.buf[at..at + first]);
        let rest = out.len() - first;
        out[first..].copy_from_slice(&self.buf[..rest]);
    }

    fn frame_len_at(&self, at: usize) -> usize {
        let mut len = [0; 4];
        self.get(at, &mut len);
        u32::from_ne_bytes(len) as usize
    }

    /// Writes the records, oldest first, to the ring's file (replacing what it held).
    fn write_out(&self) -> std::io::Result<()> {
        if std::process::id() != self.pid {
            return Ok(());
        }
        let file = File::create(&self.path)?;
        let mut pcap = CaptureWriter::new(BufWriter::new(file)).map_err(std::io::Error::other)?;
        let mut frame = vec![0; FRAME_MAX];
        let mut at = self.tail;
        for _ in 0..self.records {
            let len = self.frame_len_at(at);
            let mut nanos = [0; 8];
            self.get(at + 4, &mut nanos);
            frame.resize(len, 0);
            self.get(at + RECORD_HEADER, &mut frame);
            let ts = Duration::from_nanos(u64::from_ne_bytes(nanos));
            pcap.write_frame(ts, &frame).map_err(std::io::Error::other)?;
            at = (at + RECORD_HEADER + len) % self.buf.len();
        }
        if self.dropped > 0 {
            tracing::info!(target: "softrdma::capture", "{}: the ring kept the last {} packets; {} before them are not in the file", self.path.display(), self.records, self.dropped);
        }
        pcap.into_inner().flush()
    }
}

/// The rings of the process, written out when it exits.
static RINGS: Mutex<Vec<Weak<Mutex<Ring>>>> = Mutex::new(Vec::new());

/// Has `ring` written out when the process exits (`exit`, or returning from `main`), as well
/// as when its device closes.
fn register_for_exit(ring: &Arc<Mutex<Ring>>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        let _ = std::panic::catch_unwind(write_out_rings);
    }
    {
        let mut rings = RINGS.lock().unwrap_or_else(PoisonError::into_inner);
        rings.retain(|r| r.strong_count() > 0);
        rings.push(Arc::downgrade(ring));
    }
    ONCE.call_once(|| {
        // SAFETY: at_exit is a C function of no arguments that never unwinds (a panic is
        // caught); atexit only records it.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(at_exit)
        };
    });
}

/// Writes out every live ring. A progress thread may be recording into one as the process
/// exits: it holds the ring's lock for one copy, so this waits a little for it, then leaves
/// that ring alone rather than hang the exit.
fn write_out_rings() {
    let rings: Vec<Arc<Mutex<Ring>>> = match RINGS.try_lock() {
        Ok(r) => r.iter().filter_map(Weak::upgrade).collect(),
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().iter().filter_map(Weak::upgrade).collect(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for ring in rings {
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        loop {
            match ring.try_lock() {
                Ok(r) => {
                    let _ = r.write_out();
                    break;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    let _ = p.into_inner().write_out();
                    break;
                }
                Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_parse_with_units_and_refuse_nonsense() {
        assert_eq!(RingSize::parse("64M"), Ok(RingSize::Bytes(64 << 20)));
        assert_eq!(RingSize::parse("512k"), Ok(RingSize::Bytes(512 << 10)));
        assert_eq!(RingSize::parse("1G"), Ok(RingSize::Bytes(1 << 30)));
        assert_eq!(RingSize::parse("100000"), Ok(RingSize::Bytes(100_000)));
        assert_eq!(RingSize::parse("10000p"), Ok(RingSize::Packets(10_000)));
        for bad in ["", "M", "64X", "-1M", "0p", "2000000p", "1K", "65G", "99999999999999999999G", "p"] {
            assert!(RingSize::parse(bad).is_err(), "{bad:?} refused");
        }
    }

    #[test]
    fn qp_lists_take_hex_and_decimal() {
        let set = parse_qps("0x11, 18,0X13 1").unwrap();
        let got: Vec<u32> = set.iter().map(|q| q.value()).collect();
        assert_eq!(got, [1, 0x11, 0x12, 0x13]);
        for bad in ["", ",", "0x1000000", "zz", "0x", "-1"] {
            assert!(parse_qps(bad).is_err(), "{bad:?} refused");
        }
    }

    fn frames(ring: &Ring) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = ring.tail;
        for _ in 0..ring.records {
            let len = ring.frame_len_at(at);
            let mut nanos = [0; 8];
            ring.get(at + 4, &mut nanos);
            let mut f = vec![0; len];
            ring.get(at + RECORD_HEADER, &mut f);
            out.push((u64::from_ne_bytes(nanos), f));
            at = (at + RECORD_HEADER + len) % ring.buf.len();
        }
        out
    }

    #[test]
    fn a_byte_ring_keeps_the_newest_frames_that_fit_across_the_wrap() {
        let mut ring = Ring::new(RingSize::Bytes(RING_BYTES_MIN), PathBuf::new()).unwrap();
        // Frames of varied sizes, so records straddle the end of the buffer in every way.
        for i in 0..1000u64 {
            let len = 60 + (i as usize * 37) % 1500;
            ring.push(Duration::from_nanos(i), &vec![i as u8; len]);
        }
        let kept = frames(&ring);
        assert!(kept.len() > 10);
        assert_eq!(kept.last().unwrap().0, 999, "the newest frame is kept");
        for (k, (ts, f)) in kept.iter().enumerate() {
            assert_eq!(*ts, 1000 - kept.len() as u64 + k as u64, "consecutive, oldest first");
            assert_eq!(f.len(), 60 + (*ts as usize * 37) % 1500);
            assert!(f.iter().all(|&b| b == *ts as u8), "frame {ts} intact");
        }
        assert!(ring.used <= ring.buf.len());
        assert_eq!(ring.dropped, 1000 - kept.len() as u64);
        // The next older frame would not have fitted.
        let oldest = kept[0].0 - 1;
        assert!(ring.used + RECORD_HEADER + 60 + (oldest as usize * 37) % 1500 > ring.buf.len());
    }

    #[test]
    fn a_packet_ring_keeps_the_last_n() {
        let mut ring = Ring::new(RingSize::Packets(5), PathBuf::new()).unwrap();
        for i in 0..12u64 {
            ring.push(Duration::from_nanos(i), &vec![i as u8; 4000]);
        }
        let kept: Vec<u64> = frames(&ring).into_iter().map(|(t, _)| t).collect();
        assert_eq!(kept, [7, 8, 9, 10, 11]);
    }

    /// A datagram whose BTH names `dest` (opcode RC SEND ONLY), with a dummy ICRC.
    fn packet(dest: u32) -> Vec<u8> {
        let mut p = vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        p[5..8].copy_from_slice(&dest.to_be_bytes()[1..]);
        p
    }

    /// The destination QPs of the packets in the capture at `path`.
    fn dests(path: &Path) -> Vec<u32> {
        softrdma_pcap::CaptureReader::open(path)
            .unwrap()
            .map(|f| {
                let f = f.unwrap();
                let ip = f.ip_packet().unwrap();
                let d = softrdma_wire::datagram::UdpDatagram::parse(ip).unwrap();
                BthPacket::new_checked(d.payload).unwrap().dest_qp().value()
            })
            .collect()
    }

    #[test]
    fn a_qp_filter_keeps_what_goes_to_the_qp_or_a_local_qp_of_it_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qp.pcap");
        let qps = parse_qps("0x11,0x40").unwrap();
        let mut c = Capture::create(&CaptureOptions { qps: Some(qps), ..CaptureOptions::new(&path) }).unwrap();
        let env = Envelope::rocev2([127, 0, 0, 1].into(), 4791, [127, 0, 0, 2].into()).unwrap();
        let q = |n| Qpn::new(n).unwrap();
        c.write(&env, &packet(0x11)); // received by local QP 0x11: kept
        c.write(&env, &packet(0x12)); // received by another: dropped
        c.write_sent(q(0x11), &env, &packet(0x99)); // sent by 0x11 to its peer 0x99: kept
        c.write_sent(q(0x13), &env, &packet(0x40)); // sent to peer 0x40 (named): kept
        c.write_sent(q(0x13), &env, &packet(0x98)); // neither end named: dropped
        c.write(&env, &packet(1)); // a CM MAD: QP1 is not in the set
        c.write_sent(Qpn::GSI, &env, &packet(1));
        c.write(&env, &[0; 3]); // no BTH: nothing to match
        drop(c);
        assert_eq!(dests(&path), [0x11, 0x99, 0x40]);
    }

    #[test]
    fn a_ring_capture_writes_nothing_until_it_closes_then_the_last_packets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring.pcap");
        let options = CaptureOptions { ring: Some(RingSize::Packets(3)), ..CaptureOptions::new(&path) };
        let mut c = Capture::create(&options).unwrap();
        let env = Envelope::rocev2([127, 0, 0, 1].into(), 4791, [127, 0, 0, 2].into()).unwrap();
        for dest in 0x20..0x30 {
            c.write(&env, &packet(dest));
        }
        c.flush();
        assert_eq!(dests(&path), [] as [u32; 0], "a pcap header only while the device is open");
        drop(c);
        assert_eq!(dests(&path), [0x2d, 0x2e, 0x2f]);
    }
}
