//! The out-of-band control channel between the perf client and server: one JSON message per
//! line over TCP, as perftest exchanges its parameters over port 18515.
//!
//! A reader thread parses what the peer sends. `Finished` (the peer is done sending for this
//! run) only raises a flag that the measurement loops check without a system call; every
//! other message waits in a queue for [`Control::recv`].

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::PerfError;
use super::spec::Spec;

/// The protocol's version: a client and a server of different versions refuse each other.
pub(crate) const VERSION: u32 = 1;

/// One QP as its peer must know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QpInfo {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
}

/// One side of a test: its address, QPs and the memory the peer may access.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SideInfo {
    /// The device and GID.
    pub(crate) device: String,
    pub(crate) ip: IpAddr,
    pub(crate) qps: Vec<QpInfo>,
    /// The Q_Key of its UD QPs.
    pub(crate) qkey: u32,
    /// The memory region: first address, length, rkey.
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
    /// Each QP's part of the region is `slots` buffers of `stride` bytes.
    pub(crate) stride: u64,
    pub(crate) slots: u64,
}

impl SideInfo {
    /// The address of buffer `slot` (below `slots`) of QP `qp`.
    pub(crate) fn buffer(&self, qp: usize, slot: u64) -> u64 {
        debug_assert!(slot < self.slots);
        self.addr + (qp as u64 * self.slots + slot) * self.stride
    }
}

/// What one side measured in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SideStats {
    /// Operations it completed as the requester.
    pub(crate) ops: u64,
    /// Seconds from its first post to its last completion.
    pub(crate) seconds: f64,
    /// Messages its receive queues took (SEND, WRITE with immediate).
    pub(crate) received: u64,
    /// Latency pings over UC or UD whose answer never came (counted lost, not timed).
    #[serde(default)]
    pub(crate) lost: u64,
    /// Packets it resent in this run.
    pub(crate) retransmitted: u64,
    /// Packets it sent and received in this run.
    pub(crate) packets_sent: u64,
    pub(crate) packets_received: u64,
    /// Of the packets it sent, those that went through the same-host path's shared memory
    /// rather than the sockets.
    #[serde(default)]
    pub(crate) packets_same_host: u64,
    /// Of the packets it received, those whose data it copied from the other side's
    /// memory (carried by reference: the same-host path's one copy, for messages of 16 KiB
    /// and up).
    #[serde(default)]
    pub(crate) packets_by_reference: u64,
    /// With `-e`: waits on the completion channel whose event came while the thread
    /// polled, and those that slept (or timed out).
    #[serde(default)]
    pub(crate) channel_waits_polled: u64,
    #[serde(default)]
    pub(crate) channel_waits_slept: u64,
    /// With `-e`: events it took from its completion channel, as `softrdma perf` counts
    /// them. A wait counts only when the event was not there yet: one that the device
    /// delivered before the side asked is an event taken and no wait.
    #[serde(default)]
    pub(crate) channel_events: u64,
}

/// The messages, in the order they come: `Hello` → `Accept` (or `Refuse`), then per size
/// `Run` → `Ready` → both `Finished` → both `Report`, and `Bye`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(crate) enum Msg {
    Hello { version: u32, spec: Spec, side: SideInfo },
    Accept { side: SideInfo },
    Refuse { reason: String },
    Run { size: u64 },
    Ready,
    Finished,
    Report { stats: SideStats },
    Bye,
}

/// The control connection.
pub(crate) struct Control {
    writer: Mutex<BufWriter<TcpStream>>,
    messages: Receiver<Result<Msg, String>>,
    finished: Arc<AtomicBool>,
    /// The control connection ended (the peer closed it, or it broke).
    gone: Arc<AtomicBool>,
    peer: SocketAddr,
    local: SocketAddr,
}

impl Control {
    /// Starts reading `stream` in a thread.
    pub(crate) fn new(stream: TcpStream) -> Result<Control, PerfError> {
        let io = |e: std::io::Error| PerfError::Io(format!("the control connection: {e}"));
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().map_err(io)?;
        let local = stream.local_addr().map_err(io)?;
        let reader = stream.try_clone().map_err(io)?;
        let (tx, messages) = channel();
        let finished = Arc::new(AtomicBool::new(false));
        let gone = Arc::new(AtomicBool::new(false));
        let (flag, gone_flag) = (Arc::clone(&finished), Arc::clone(&gone));
        std::thread::Builder::new()
            .name("perf-control".into())
            .spawn(move || {
                let read = || {
                    for line in BufReader::new(reader).lines() {
                        let item = match line {
                            Ok(line) => serde_json::from_str::<Msg>(&line)
                                .map_err(|e| format!("the peer sent a message this version does not understand: {e}")),
                            Err(e) => Err(format!("reading from the peer: {e}")),
                        };
                        if matches!(item, Ok(Msg::Finished)) {
                            flag.store(true, Ordering::Release);
                            continue;
                        }
                        let stop = item.is_err();
                        if tx.send(item).is_err() || stop {
                            return;
                        }
                    }
                    let _ = tx.send(Err("the peer closed the control connection".into()));
                };
                read();
                // However the reading ended, nothing more comes from the peer.
                gone_flag.store(true, Ordering::Release);
            })
            .map_err(io)?;
        Ok(Control { writer: Mutex::new(BufWriter::new(stream)), messages, finished, gone, peer, local })
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This side's address on the connection: it picks the device.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// Sends `msg`.
    pub(crate) fn send(&self, msg: &Msg) -> Result<(), PerfError> {
        let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let line = serde_json::to_string(msg).map_err(|e| PerfError::Io(format!("encoding a message: {e}")))?;
        w.write_all(line.as_bytes())
            .and_then(|()| w.write_all(b"\n"))
            .and_then(|()| w.flush())
            .map_err(|e| PerfError::Io(format!("sending to the peer {}: {e}", self.peer)))
    }

    /// The next message, within `timeout`.
    pub(crate) fn recv(&self, timeout: Duration) -> Result<Msg, PerfError> {
        match self.messages.recv_timeout(timeout) {
            Ok(Ok(msg)) => Ok(msg),
            Ok(Err(e)) => Err(PerfError::Peer(e)),
            Err(RecvTimeoutError::Timeout) => {
                Err(PerfError::Peer(format!("the peer {} said nothing for {timeout:?}", self.peer)))
            }
            Err(RecvTimeoutError::Disconnected) => Err(PerfError::Peer("the control connection closed".into())),
        }
    }

    /// The next message, which must be what `want` accepts.
    pub(crate) fn expect<T>(
        &self,
        what: &str,
        timeout: Duration,
        want: impl FnOnce(Msg) -> Option<T>,
    ) -> Result<T, PerfError> {
        let msg = self.recv(timeout)?;
        if let Msg::Refuse { reason } = &msg {
            return Err(PerfError::Peer(format!("the peer refused: {reason}")));
        }
        let shown = format!("{msg:?}");
        want(msg).ok_or_else(|| PerfError::Peer(format!("expected {what} from the peer, got {shown}")))
    }

    /// Whether the peer said `Finished` in this run; an error once the control connection
    /// ended without it (the peer is gone: a run waiting for it would wait for ever).
    pub(crate) fn peer_finished(&self) -> Result<bool, PerfError> {
        if self.finished.load(Ordering::Acquire) {
            return Ok(true);
        }
        if self.gone.load(Ordering::Acquire) && !self.finished.load(Ordering::Acquire) {
            return Err(PerfError::Peer(format!(
                "the peer {} closed the control connection in the middle of the run (it ended, or was killed)",
                self.peer
            )));
        }
        Ok(false)
    }

    /// Forgets the last run's `Finished` (before `Ready` of the next).
    pub(crate) fn reset_finished(&self) {
        self.finished.store(false, Ordering::Release);
    }
}
