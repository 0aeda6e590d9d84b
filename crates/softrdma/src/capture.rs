//! Packet capture: `SOFTRDMA_PCAP=path`, or [`crate::ContextOptions::capture`], writes every
//! packet a device sends and receives to a pcap file that Wireshark and tshark decode as
//! RoCEv2 (Ethernet framing with made-up MAC addresses, the IP and UDP headers Linux sends).
//!
//! All the devices a process opens with the environment variable share one file, so one
//! capture shows both ends of a loopback run.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use softrdma_pcap::CaptureWriter;
use softrdma_wire::Envelope;

use crate::Error;

/// The environment variable naming the capture file.
pub const CAPTURE_ENV: &str = "SOFTRDMA_PCAP";

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

/// Buffered (an unbuffered capture made every packet cost two more system calls, and a busy
/// multi-process run 25 times slower); the progress thread flushes whenever the device goes
/// idle, and dropping the device flushes, so a capture lags the traffic by at most one burst.
#[derive(Clone)]
struct Writer {
    pcap: Arc<Mutex<CaptureWriter<Shared>>>,
    file: Shared,
}

/// A capture file, possibly shared by several devices.
pub(crate) struct Capture {
    writer: Writer,
}

static FROM_ENV: OnceLock<Option<Writer>> = OnceLock::new();

impl Capture {
    /// A new capture file at `path` (truncated).
    pub(crate) fn create(path: &Path) -> Result<Capture, Error> {
        let what = || format!("creating capture file {}", path.display());
        let file = File::create(path).map_err(|e| Error::io(what(), e))?;
        let file = Shared(Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file))));
        let pcap = CaptureWriter::new(file.clone()).map_err(|e| Error::io(what(), std::io::Error::other(e)))?;
        Ok(Capture { writer: Writer { pcap: Arc::new(Mutex::new(pcap)), file } })
    }

    /// The process's capture file named by `SOFTRDMA_PCAP`, created on first use.
    pub(crate) fn from_env() -> Result<Option<Capture>, Error> {
        let Some(path) = std::env::var_os(CAPTURE_ENV) else { return Ok(None) };
        let shared = FROM_ENV.get_or_init(|| Capture::create(Path::new(&path)).ok().map(|c| c.writer));
        match shared {
            Some(w) => Ok(Some(Capture { writer: w.clone() })),
            None => Err(Error::io(
                format!("{CAPTURE_ENV}={}: cannot create the capture file", Path::new(&path).display()),
                std::io::Error::other("check that its directory exists and is writable"),
            )),
        }
    }

    /// Records one datagram (a UDP payload) in its envelope.
    pub(crate) fn write(&mut self, envelope: &Envelope, payload: &[u8]) {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut w = self.writer.pcap.lock().unwrap_or_else(PoisonError::into_inner);
        // A capture that cannot be written (disk full) must not stop the device.
        let _ = w.write_roce(ts, envelope, payload);
    }

    /// Pushes what is buffered to the file.
    pub(crate) fn flush(&mut self) {
        let _ = self.writer.file.flush();
    }
}
