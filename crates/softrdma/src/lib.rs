//! # softrdma
//!
//! RDMA in software: the verbs (`ibv_*`) as a safe Rust API over softrdma's RoCEv2 engine,
//! with the runtime that owns its threads, clock and sockets. No RDMA NIC, no kernel module
//! and no root: the "NIC" is [`softrdma_engine`], and its packets are real RoCEv2 (IB
//! transport headers and ICRC in UDP, port 4791) that Wireshark decodes and a Linux
//! Soft-RoCE peer understands.
//!
//! ```no_run
//! use std::time::Duration;
//! use softrdma::{Access, QpInit, QpType, SendFlags, SendOp, SendWr, WcStatus};
//!
//! let ctx = softrdma::device("lo")?.open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//! let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq))?;
//! let mr = pd.reg_mr(4096, Access::ALL)?;
//! mr.write(0, b"hello")?;
//! # let (peer, peer_buf) = (qp.endpoint(0, 0)?, mr.remote(0..4096)?);
//! // `peer` and `peer_buf` came from the other side, out of band or by rdma_cm.
//! qp.connect(0, &peer, &Default::default())?;
//! let sge = [mr.sge(0..5)?];
//! qp.post_send(&[SendWr {
//!     wr_id: 1,
//!     op: SendOp::RdmaWrite { remote_addr: peer_buf.addr, rkey: peer_buf.rkey },
//!     sg_list: &sge,
//!     flags: SendFlags::SIGNALED,
//!     ..SendWr::default() // no UD destination, no XRC SRQ
//! }])?;
//! assert_eq!(cq.wait(Duration::from_secs(5))?.status, WcStatus::Success);
//! # Ok::<(), softrdma::Error>(())
//! ```
//!
//! ## Memory safety
//!
//! The device writes into registered memory from its own thread whenever a peer sends. A
//! [`Mr`] therefore owns its memory, hands out no reference that outlives a call, and
//! deregisters before freeing it; work requests name memory by key and address, which the
//! device checks against live registrations on every access. A peer on the network can
//! reach only what a registration with the right rkey and access allows.
//!
//! ## Progress
//!
//! Each open [`Context`] has a progress thread (see the `driver` module documentation):
//! one-sided operations complete while the application sleeps, idle costs no CPU, and a
//! polling application does the work itself without a thread hop.
#![deny(unsafe_code)]

#[cfg(feature = "tokio")]
pub mod asynch;
mod capture;
mod cm;
mod device;
mod driver;
mod error;
mod faults;
pub mod log;
#[allow(unsafe_code)]
mod memory;
pub mod res;
pub mod rsocket;
mod same_host;
mod slice;
pub mod stats;
pub mod sysfs;
mod verbs;
mod wait_spin;

use std::time::Duration;

pub use capture::{CAPTURE_ENV, CAPTURE_QP_ENV, CAPTURE_RING_ENV, CaptureOptions, RingSize};
pub use cm::{CmEndpoint, CmEvent, CmId, EventChannel};
pub use device::{AtomicCap, Device, DeviceAttr, PhysState, PortAttr, PortState, device, devices};
pub use driver::{APP_POLL_WINDOW, disconnect_all};
pub use error::{Error, Result};
pub use faults::{FAULTS_ENV, FaultCounters};
pub use memory::MR_ALIGN;
pub use same_host::SAME_HOST_ENV;
pub use softrdma_cm::{CmError, CmEventKind, CmStatus, ConnParam, UdParam};
pub use softrdma_engine::{
    Access, AddressVector, AsyncEvent, AttrMask, CqId, LKey, Mtu, MwBind, MwBinding, MwId, MwInfo, MwType, NetworkHdr,
    PostErrorKind, QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqId, UdDest, VerbsError,
    Wc, WcOpcode, WcStatus, XrcdId,
};
pub use softrdma_sim::FaultSpec;
pub use softrdma_wire::cma::PortSpace;
pub use softrdma_wire::time::Instant;
pub use softrdma_wire::{Gid, QKey, Qpn, RKey};
pub use stats::Counters;
pub use verbs::{
    Ah, CompChannel, ConnectOptions, Context, Cq, DeviceMemory, EMPTY_WC, Endpoint, MAX_DM_SIZE, Mr, Mw, Pd, Prefetch,
    Qp, QpInit, RawMr, RemoteMr, Srq, Xrcd, inc_rkey,
};
pub use wait_spin::WAIT_SPIN_ENV;

/// How to open a device ([`Device::open_with`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ContextOptions {
    /// The UDP port: 4791, RoCEv2's. Tests that must not meet other devices on the host
    /// pick another one for all their devices.
    pub port: u16,
    /// How long the progress thread keeps polling after work before it blocks: lower
    /// latency when traffic is steady, at the cost of that much CPU after each burst.
    pub spin: Duration,
    /// How long, at most, a thread waiting on a completion channel
    /// ([`CompChannel::get_cq_event`], `ibv_get_cq_event`) polls before it sleeps. The
    /// channel's polling window opens (from 10 µs, doubling up to this) while its waits
    /// last no longer than this, and closes (halving) while they last longer, as KVM's halt
    /// polling does: an answer then comes in the 2 µs of a polled one rather than after a
    /// wake-up's 10–20 µs, and an idle application sleeps at once. `Duration::ZERO` never
    /// polls; `SOFTRDMA_WAIT_SPIN_US` ([`WAIT_SPIN_ENV`]) replaces it for any program.
    /// 200 µs by default (KVM's `halt_poll_ns`).
    pub wait_spin: Duration,
    /// Write the packets sent and received to a pcap file: all of them, or those of some
    /// QPs, as they go or the last ones from a ring at close ([`CaptureOptions`];
    /// `Some(path.into())` captures everything). Without it, the environment decides
    /// ([`CAPTURE_ENV`], [`CAPTURE_QP_ENV`], [`CAPTURE_RING_ENV`]).
    pub capture: Option<CaptureOptions>,
    /// The CM's response timeout exponent: a REQ, REP or DREQ is resent after
    /// 4.096 µs × 2^this without an answer (the kernel's rdma_cm uses 20: 4.3 s).
    pub cm_response_timeout: u8,
    /// How many times the CM resends before giving up (`UNREACHABLE`); the kernel's 15.
    pub cm_max_retries: u8,
    /// UDP GSO and GRO: runs of equal packets to one QP leave in one send, each IPv4
    /// segment with the ICRC for the identification the kernel gives it (receivers that
    /// cannot see it recover it, as softrdma's do), and arrive coalesced. Off, or where the kernel lacks `UDP_GRO`, every packet is a
    /// datagram of its own.
    pub gso: bool,
    /// Authenticated mode for every RC and UC connection this context's CM IDs make, and
    /// required of every one they accept (`softrdma_cm::auth`): keys agreed with an X25519
    /// exchange beside the REQ and REP, and a keyed MAC on every packet, so that a host on
    /// the path cannot forge a packet the QP accepts. Both ends must be softrdma. Also on
    /// with `SOFTRDMA_AUTH=1` ([`AUTH_ENV`]).
    pub authenticate: bool,
    /// A passphrase both ends share, mixed into authenticated mode's keys (which it turns
    /// on): with it, even a host that rewrites the CM exchange as it passes gets keys the
    /// two ends do not use. Also `SOFTRDMA_AUTH_PSK` ([`AUTH_PSK_ENV`]).
    pub auth_passphrase: Option<String>,
    /// RoCEv2 congestion control (`softrdma_engine::congestion`, DCQCN): packets leave
    /// marked ECN-capable; packets that arrive marked Congestion Experienced, and datagrams
    /// the kernel drops for a full receive buffer, are answered with CNPs; and each QP paces
    /// what it sends at the rate the CNPs it gets leave it. On by default;
    /// `SOFTRDMA_CONGESTION_CONTROL=0` turns it off for any program.
    pub congestion_control: bool,
    /// The same-host path: packets to another process of this host on the same device go
    /// through its shared-memory inbox, not through the kernel's UDP stack (the same
    /// packets, checked and retried by the engine as on the wire; see
    /// docs/architecture.md, "A same-host path"). On by default; `SOFTRDMA_SAME_HOST=0`
    /// ([`SAME_HOST_ENV`]) turns it off for any program. Processes of different users use
    /// the sockets.
    pub same_host: bool,
    /// Faults injected into what the device receives: loss, duplication, reordering,
    /// corruption, delay, a rate limit, partitions, each optionally for one peer, QP or
    /// kind of operation (`"loss 5%; reorder 10% 200us".parse()`; the syntax is
    /// [`FaultSpec`]'s). `SOFTRDMA_FAULTS` ([`FAULTS_ENV`]) replaces it for any program.
    /// See the `faults` section of the README.
    pub faults: Option<FaultSpec>,
}

/// Turns authenticated mode on (`1`) or off (`0`) for the contexts a process opens
/// ([`ContextOptions::authenticate`]), C programs included.
pub const AUTH_ENV: &str = "SOFTRDMA_AUTH";
/// `0` turns congestion control off (`1` on) for the devices a process opens, whatever
/// [`ContextOptions::congestion_control`] says, C programs included.
pub const CONGESTION_CONTROL_ENV: &str = "SOFTRDMA_CONGESTION_CONTROL";
/// Authenticated mode's shared passphrase ([`ContextOptions::auth_passphrase`]).
pub const AUTH_PSK_ENV: &str = "SOFTRDMA_AUTH_PSK";

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            port: softrdma_udp::ROCEV2_PORT,
            spin: Duration::from_micros(50),
            wait_spin: Duration::from_micros(200),
            capture: None,
            cm_response_timeout: softrdma_cm::CMA_CM_RESPONSE_TIMEOUT,
            cm_max_retries: softrdma_cm::CMA_MAX_CM_RETRIES,
            gso: true,
            authenticate: false,
            auth_passphrase: None,
            congestion_control: true,
            same_host: true,
            faults: None,
        }
    }
}

/// The API's objects may be shared between threads, as libibverbs' are (any thread may post,
/// poll, modify or destroy): each is `Send + Sync`. A type that stops being so (an `Rc`, a
/// raw pointer, a `Cell` inside) fails this at compile time.
#[cfg(test)]
#[test]
fn the_api_objects_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Context>();
    both::<Pd>();
    both::<Mr>();
    both::<RawMr>();
    both::<Mw>();
    both::<Cq>();
    both::<CompChannel>();
    both::<Qp>();
    both::<Srq>();
    both::<Ah>();
    both::<Xrcd>();
    both::<DeviceMemory>();
    both::<EventChannel>();
    both::<CmId>();
    both::<CmEndpoint>();
    both::<Device>();
    both::<Error>();
}
