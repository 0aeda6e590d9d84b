//! The verbs objects: [`Context`], [`Pd`], [`Mr`], [`Mw`], [`Cq`], [`CompChannel`], [`Qp`],
//! [`Srq`], [`Ah`].
//!
//! Ownership mirrors the verbs' rules: every object keeps its parents alive (a QP its PD,
//! CQs and SRQ; an MR its PD; everything its context), so a parent can never be destroyed
//! under a child, and dropping an object destroys it on the device.

use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant as StdInstant};

use softrdma_engine::{
    Access, AddressVector, AhId, AsyncEvent, AttrMask, CqId, MrKeys, MwBind, MwBinding, MwId, MwType, PdId, QpAttr,
    QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqId, Wc, XrcdId,
};
use softrdma_wire::{Gid, Qpn, RKey};

use crate::device::{Device, DeviceAttr, PortAttr};
use crate::driver::{self, Driver, YIELD_AFTER_IDLE_TURNS};
use crate::memory::MrBuf;
use crate::{ContextOptions, Error, Result};

/// An open device (`ibv_context`): the engine, its sockets and its progress thread.
/// Cloning shares it; the device closes when the last clone and the last object made from
/// it are dropped.
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// let ctx = softrdma::device("lo")?.open()?; // port 4791, shared with other processes
/// assert_eq!(ctx.device().name(), "softrdma_lo");
/// assert_eq!(ctx.gid(0).map(|g| g.to_ip()), Some("127.0.0.1".parse().unwrap()));
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// assert!(cq.poll_one().is_none());
/// # drop((pd, cq)); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) drv: Arc<Driver>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("device", &self.drv.device.name()).finish_non_exhaustive()
    }
}

impl Device {
    /// Opens the device with default options: port 4791, a progress thread.
    pub fn open(&self) -> Result<Context> {
        self.open_with(&ContextOptions::default())
    }

    /// Opens the device with `options`.
    pub fn open_with(&self, options: &ContextOptions) -> Result<Context> {
        crate::log::init();
        let drv = Arc::new(Driver::start(self.clone(), options)?);
        Ok(Context { drv })
    }
}

impl Context {
    /// The device this context opened.
    pub fn device(&self) -> &Device {
        &self.drv.device
    }

    /// The GID at `index` (`ibv_query_gid`).
    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.drv.device.gid(index)
    }

    /// The UDP address the device receives on for GID `index`.
    pub fn local_addr(&self, index: u8) -> Option<std::net::SocketAddr> {
        self.drv.shared.port.sockets().get(usize::from(index)).map(|s| s.local_addr())
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let id = self.drv.shared.lock().nic.engine_mut().alloc_pd();
        Ok(Pd { inner: Arc::new(PdInner { ctx: self.clone(), id }) })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let fired = driver::EventQueue::new("a completion channel")?;
        let shared = Arc::downgrade(&self.drv.shared);
        let spin = crate::wait_spin::WaitSpin::new(self.drv.shared.wait_spin);
        Ok(CompChannel { inner: Arc::new(ChannelInner { fired, shared, spin }) })
    }

    /// `ibv_create_cq`: a CQ of at least `cqe` entries, whose completion events (once
    /// armed with [`Cq::req_notify`]) go to `channel`.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let sh = &self.drv.shared;
        let mut st = sh.lock();
        let id = st.nic.engine_mut().create_cq(cqe)?;
        let inner = Arc::new(CqInner { ctx: self.clone(), id, cqe: AtomicU32::new(cqe), channel: channel.cloned() });
        if let Some(ch) = channel {
            let to = ChannelOfCq { channel: Arc::clone(&ch.inner), cq: Arc::downgrade(&inner) };
            st.cq_channels.insert(id.0, Box::new(to));
        }
        Ok(Cq { inner })
    }

    /// The next asynchronous event (`ibv_get_async_event`), waiting up to `timeout`
    /// (`None`: forever). `Ok(None)` when the time passed.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let sh = &self.drv.shared;
        let deadline = timeout.map(|t| StdInstant::now() + t);
        loop {
            if let Some(e) = sh.async_events.pop() {
                return Ok(Some(e));
            }
            let left = deadline.map(|d| d.saturating_duration_since(StdInstant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            driver::wait_readable(sh.async_events.fd(), left);
        }
    }

    /// A descriptor that polls readable while an asynchronous event is waiting
    /// (`ibv_context::async_fd`).
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.drv.shared.async_events.fd().as_fd()
    }

    /// Drops the asynchronous events waiting for `cq` (`ibv_destroy_cq`: its handle may
    /// name another CQ next).
    pub fn forget_async_events_of_cq(&self, cq: CqId) {
        self.drv.shared.async_events.retain(|e| *e != AsyncEvent::CqError(cq));
    }

    /// The same for `srq` (`ibv_destroy_srq`).
    pub fn forget_async_events_of_srq(&self, srq: SrqId) {
        self.drv.shared.async_events.retain(|e| *e != AsyncEvent::SrqLimitReached(srq));
    }

    /// The device's packet and error counters (like rxe's `hw_counters`). Other processes
    /// read them with `softrdma stats` ([`crate::stats`]).
    pub fn counters(&self) -> crate::stats::Counters {
        self.drv.shared.lock().counters()
    }

    /// The device's clock, which stamps completions ([`Wc::completed_at`]): nanoseconds
    /// since the context opened, monotonic (`ibv_query_rt_values_ex`'s raw clock).
    pub fn clock(&self) -> crate::Instant {
        self.drv.shared.now()
    }

    /// `at`, on the device's clock, as wall-clock time: nanoseconds since the Unix epoch
    /// (`ibv_wc_read_completion_wallclock_ns`). The wall clock is read once, when the
    /// context opened: later steps of the system's clock do not move it.
    pub fn wallclock_ns(&self, at: crate::Instant) -> u64 {
        self.drv.shared.wallclock_ns(at)
    }

    /// `ibv_query_device`: what this device allows, from the limits its engine enforces.
    pub fn query_device(&self) -> DeviceAttr {
        let st = self.drv.shared.lock();
        DeviceAttr::new(&self.drv.device, st.nic.engine().config())
    }

    /// `ibv_query_port`: the state and attributes of port `port` (softrdma devices have
    /// one port, 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let st = self.drv.shared.lock();
        PortAttr::new(&self.drv.device, port, st.nic.engine().config())
    }

    fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.drv, &other.drv)
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Clone, Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

#[derive(Debug)]
struct PdInner {
    ctx: Context,
    id: PdId,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Children hold the PD alive, so nothing uses it any more.
        let _ = self.ctx.drv.shared.lock().nic.engine_mut().dealloc_pd(self.id);
    }
}

impl Pd {
    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// `ibv_reg_mr` of `len` fresh zeroed bytes (page aligned), which the region owns: the
    /// device can reach them while the region lives and never after.
    ///
    /// With [`Access::REMOTE_ATOMIC`] the bytes are a memfd of their own, mapped shared (a
    /// process holds at most 256 such at once; past that, private memory): a peer process of
    /// this host that the device granted the region applies its atomics on a mapping of it
    /// itself, without a packet, and never while [`Mr::read`], [`Mr::write`] or [`Mr::with`]
    /// holds the bytes or after the region is gone (docs/architecture.md, "Atomics the
    /// requester applies"). A child of `fork` shares these pages with its parent, where it
    /// gets a copy of private ones.
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<Mr> {
        // Memory a peer may apply atomics to is memory a process of the host can map.
        let buf = if access.contains(Access::REMOTE_ATOMIC) { MrBuf::zeroed_shared(len) } else { MrBuf::zeroed(len) };
        let buf = buf.ok_or(Error::NoMemory(len))?;
        let keys = self.register(buf.addr(), len as u64, buf.addr(), access)?;
        Ok(Mr { pd: Arc::clone(&self.inner), keys, access, buf: Some(buf) })
    }

    /// `ibv_reg_mr` of memory the caller owns.
    ///
    /// With [`Access::ON_DEMAND`] the range need not be mapped, now or later: the device
    /// faults its pages in as it reaches them, and an access the pages do not allow fails
    /// as a bad access would (`IBV_ACCESS_ON_DEMAND`). From address 0 with length
    /// `usize::MAX` it is the implicit on-demand region, the whole address space. Without
    /// it, a range with a page that is not mapped is refused (`EFAULT`), as the kernel's
    /// pinning refuses it.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay allocated and must not be moved or freed until the
    /// returned [`RawMr`] is dropped (unless registered on demand), and while it lives the
    /// caller must not hold Rust references to those bytes across points where the device
    /// may access them (the device writes with remote or local write access at any time;
    /// use [`Pd::reg_mr`] for memory that is safe by construction).
    #[allow(unsafe_code)] // An unsafe contract, for memory this crate does not own (the C layer's).
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<RawMr> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.reg_mr_raw_iova(addr, len, addr as usize as u64, access) }
    }

    /// [`reg_mr_raw`](Self::reg_mr_raw) of memory that work requests and peers name
    /// `iova .. iova + len` (`ibv_reg_mr_iova`; 0 for a zero-based region).
    ///
    /// # Safety
    /// As [`reg_mr_raw`](Self::reg_mr_raw).
    #[allow(unsafe_code)] // An unsafe contract, for memory this crate does not own (the C layer's).
    pub unsafe fn reg_mr_raw_iova(&self, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<RawMr> {
        let host = addr as usize as u64;
        if !access.contains(Access::ON_DEMAND) && !crate::memory::mapped(host, len as u64) {
            return Err(Error::io(
                format!(
                    "registering {len} bytes at {host:#x}: some of its pages are not mapped (register it with \
                     Access::ON_DEMAND to allow that)"
                ),
                std::io::Error::from_raw_os_error(libc::EFAULT),
            ));
        }
        let keys = self.register(host, len as u64, iova, access)?;
        let mr = RawMr {
            pd: Arc::clone(&self.inner),
            keys,
            addr: host,
            len,
            access,
            on_demand: false,
            dm: None,
            registered: true,
        };
        Ok(mr.on_demand(access.contains(Access::ON_DEMAND)))
    }

    /// `ibv_advise_mr` with a prefetch advice: the pages of every SGE (each in a region of
    /// this PD registered with [`Access::ON_DEMAND`]) faulted in now, for reading, or for
    /// writing; [`Prefetch::NoFault`] maps nothing that is not there (nothing to do: the
    /// device keeps no page table of its own). Each SGE is checked before any is faulted
    /// in. A range whose pages do not allow the access fails with `EFAULT`, naming the SGE.
    pub fn prefetch(&self, sges: &[Sge], advice: Prefetch) -> Result<()> {
        {
            let st = self.inner.ctx.drv.shared.lock();
            for (i, s) in sges.iter().enumerate() {
                st.nic
                    .engine()
                    .check_on_demand(self.inner.id, s.lkey, s.addr, u64::from(s.length))
                    .map_err(|e| softrdma_engine::VerbsError::Invalid(format!("SGE {i}: {e}")))?;
            }
        }
        let write = match advice {
            Prefetch::Read => false,
            Prefetch::Write => true,
            Prefetch::NoFault => return Ok(()),
        };
        for (i, s) in sges.iter().enumerate() {
            crate::memory::populate(s.addr, u64::from(s.length), write).map_err(|e| {
                let what = if write { "writing" } else { "reading" };
                let fault = std::io::Error::from_raw_os_error(libc::EFAULT);
                Error::io(
                    format!("SGE {i}: {} bytes at {:#x} are not mapped for {what} ({e})", s.length, s.addr),
                    fault,
                )
            })?;
        }
        Ok(())
    }

    /// `ibv_alloc_mw`: a memory window of `mw_type` in this PD, bound to nothing yet
    /// ([`Qp::bind_mw`] binds it).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let (id, rkey) = self.inner.ctx.drv.shared.lock().nic.engine_mut().alloc_mw(self.inner.id, mw_type)?;
        Ok(Mw { pd: Arc::clone(&self.inner), id, mw_type, posted_rkey: AtomicU32::new(rkey.0) })
    }

    /// Registers the `len` bytes at `addr`, named from `iova`, in this PD.
    fn register(&self, addr: u64, len: u64, iova: u64, access: Access) -> Result<MrKeys> {
        let keys =
            self.inner.ctx.drv.shared.lock().nic.engine_mut().reg_mr_iova(self.inner.id, addr, len, iova, access);
        if let Err(e) = &keys {
            tracing::info!(target: "softrdma::mr", "registration of {len} bytes at {addr:#x} ({access:?}) refused: {e}");
        }
        Ok(keys?)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let id = self.inner.ctx.drv.shared.lock().nic.engine_mut().create_srq(self.inner.id, max_wr, max_sge)?;
        Ok(Srq { inner: Arc::new(SrqInner { pd: Arc::clone(&self.inner), id, _xrc: None }) })
    }

    /// `ibv_create_ah`: where UD sends go.
    pub fn create_ah(&self, av: AddressVector) -> Result<Ah> {
        let id = self.inner.ctx.drv.shared.lock().nic.engine_mut().create_ah(self.inner.id, av)?;
        Ok(Ah { inner: Arc::new(AhInner { pd: Arc::clone(&self.inner), id, av }) })
    }

    /// `ibv_create_qp` with this PD.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        let ctx = &self.inner.ctx;
        for (cq, what) in [(init.send_cq, "the send CQ"), (init.recv_cq, "the receive CQ")] {
            if !cq.inner.ctx.same(ctx) {
                return Err(Error::WrongContext(what));
            }
        }
        if let Some(srq) = init.srq {
            if !srq.inner.pd.ctx.same(ctx) {
                return Err(Error::WrongContext("the SRQ"));
            }
        }
        let attr = QpInitAttr {
            pd: self.inner.id,
            send_cq: init.send_cq.inner.id,
            recv_cq: init.recv_cq.inner.id,
            srq: init.srq.map(|s| s.inner.id),
            qp_type: init.qp_type,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        };
        let qpn = ctx.drv.shared.lock().nic.engine_mut().create_qp(&attr)?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                ctx: ctx.clone(),
                qpn,
                qp_type: init.qp_type,
                _owner: QpOwner::Pd {
                    _pd: Arc::clone(&self.inner),
                    _send_cq: init.send_cq.clone(),
                    _recv_cq: init.recv_cq.clone(),
                    _srq: init.srq.cloned(),
                },
            }),
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of XRC domain `xrcd`, in this PD,
    /// whose receives complete to `cq`. A peer's XRC INI QP sends to it through any XRC TGT
    /// QP of the domain by naming its [`number`](Srq::number); its memory accesses are
    /// checked in this PD.
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let ctx = &self.inner.ctx;
        if !xrcd.inner.ctx.same(ctx) {
            return Err(Error::WrongContext("the XRC domain"));
        }
        if !cq.inner.ctx.same(ctx) {
            return Err(Error::WrongContext("the CQ"));
        }
        let id = ctx.drv.shared.lock().nic.engine_mut().create_xrc_srq(
            self.inner.id,
            xrcd.inner.id,
            cq.inner.id,
            max_wr,
            max_sge,
        )?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                id,
                _xrc: Some((Arc::clone(&xrcd.inner), cq.clone())),
            }),
        })
    }
}

/// An XRC domain (`ibv_xrcd`): XRC SRQs and the XRC TGT QPs that serve them. A peer's XRC
/// INI QP connected to any TGT QP of the domain reaches every SRQ of it, each message to the
/// SRQ it names, so that one connection per peer process serves all of a host's receivers.
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::*;
/// let (a, b) = (device("lo")?.open()?, device("lo")?.open()?);
/// // The target: a domain, an XRC SRQ with a receive posted, a TGT QP.
/// let pb = b.alloc_pd()?;
/// let cqb = b.create_cq(16, None)?;
/// let xrcd = b.open_xrcd()?;
/// let srq = pb.create_xrc_srq(&xrcd, &cqb, 16, 1)?;
/// let mb = pb.reg_mr(64, Access::LOCAL_WRITE)?;
/// let rsge = [mb.sge(0..64)?];
/// srq.post_recv(&[RecvWr { wr_id: 7, sg_list: &rsge }])?;
/// let tgt = xrcd.create_tgt_qp()?;
/// // The initiator: an XRC INI (XRC_SEND) QP connected to the TGT QP.
/// let pa = a.alloc_pd()?;
/// let cqa = a.create_cq(16, None)?;
/// let mut init = QpInit::new(QpType::XrcIni, &cqa);
/// init.cap.max_recv_wr = 0;
/// init.cap.max_recv_sge = 0;
/// let ini = pa.create_qp(&init)?;
/// ini.connect(1, &tgt.endpoint(0, 2)?, &ConnectOptions::default())?;
/// tgt.connect(2, &ini.endpoint(0, 1)?, &ConnectOptions::default())?;
/// let ma = pa.reg_mr(64, Access::LOCAL_WRITE)?;
/// ma.write(0, b"to the SRQ")?;
/// let sge = [ma.sge(0..10)?];
/// let wr = SendWr { wr_id: 1, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: Some(srq.number()) };
/// ini.post_send(&[wr])?;
/// let wc = cqb.wait(Duration::from_secs(5))?; // the SRQ's CQ
/// assert_eq!((wc.wr_id, wc.byte_len, wc.qp_num.value()), (7, 10, tgt.qpn()));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Xrcd {
    inner: Arc<XrcdInner>,
}

#[derive(Debug)]
struct XrcdInner {
    ctx: Context,
    id: XrcdId,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // Its SRQs and TGT QPs hold it alive, so none is left.
        let _ = self.ctx.drv.shared.lock().nic.engine_mut().dealloc_xrcd(self.id);
    }
}

impl Context {
    /// `ibv_open_xrcd`: a new XRC domain.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        let id = self.drv.shared.lock().nic.engine_mut().alloc_xrcd()?;
        Ok(Xrcd { inner: Arc::new(XrcdInner { ctx: self.clone(), id }) })
    }
}

impl Xrcd {
    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The device's handle of the domain.
    pub fn id(&self) -> XrcdId {
        self.inner.id
    }

    /// Whether XRC SRQs or XRC TGT QPs belong to the domain (`ibv_close_xrcd` is EBUSY then).
    pub fn in_use(&self) -> bool {
        self.inner.ctx.drv.shared.lock().nic.engine().xrcd_users(self.inner.id) > 0
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: an XRC TGT QP of this domain, to connect
    /// to a peer's XRC INI QP ([`Qp::connect`]). It has no queues: each message goes to the
    /// XRC SRQ of the domain it names.
    pub fn create_tgt_qp(&self) -> Result<Qp> {
        let ctx = &self.inner.ctx;
        let qpn = ctx.drv.shared.lock().nic.engine_mut().create_xrc_tgt_qp(self.inner.id)?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                ctx: ctx.clone(),
                qpn,
                qp_type: QpType::XrcTgt,
                _owner: QpOwner::Xrcd { _xrcd: Arc::clone(&self.inner) },
            }),
        })
    }
}

/// A memory region whose memory it owns (`ibv_mr`).
///
/// The device reaches the bytes by address, from its own thread, whenever a peer or a work
/// request accesses them. So the application never gets a plain reference into them that
/// outlives one call: it reads and writes through [`read`](Mr::read),
/// [`write`](Mr::write) and [`with`](Mr::with), which hold the device lock meanwhile.
/// Dropping the region deregisters it first, so nothing in flight reaches freed memory:
/// a later packet gets a remote access error, a later work request a protection error.
/// Memory windows bound to it are unbound then (the C API's `ibv_dereg_mr` refuses a
/// region with windows bound, as rxe does; a region that owns its memory cannot wait).
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use softrdma::Access;
/// let pd = softrdma::device("lo")?.open()?.alloc_pd()?;
/// let mut mr = pd.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// mr.write(0, b"hello")?;
/// let mut out = [0u8; 5];
/// mr.read(0, &mut out)?;
/// assert_eq!(&out, b"hello");
/// mr.with(|bytes| bytes[5] = b'!'); // the device is paused meanwhile
/// let sge = mr.sge(0..6)?; // for a local work request
/// let remote = mr.remote(0..4096)?; // what a peer needs to WRITE here
/// assert_eq!((sge.length, remote.len), (6, 4096));
/// assert!(mr.sge(4000..5000).is_err(), "outside the region");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Mr {
    pd: Arc<PdInner>,
    keys: MrKeys,
    access: Access,
    // Dropped after `Drop::drop` deregistered the region.
    buf: Option<MrBuf>,
}

impl Mr {
    fn buf(&self) -> &MrBuf {
        self.buf.as_ref().expect("an Mr owns its buffer until dropped")
    }

    /// The local key (`lkey`).
    pub fn lkey(&self) -> u32 {
        self.keys.lkey.0
    }

    /// The remote key (`rkey`) peers use to reach the region.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey.0
    }

    /// The address of the first byte, as peers name it in RDMA operations.
    pub fn addr(&self) -> u64 {
        self.buf().addr()
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.buf().len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the region allows.
    pub fn access(&self) -> Access {
        self.access
    }

    fn check(&self, what: &'static str, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::OutOfRange { what, start: range.start, end: range.end, len: self.len() });
        }
        Ok(())
    }

    /// A gather/scatter element for bytes `range` of the region.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge> {
        self.check("Mr::sge", &range)?;
        let length = u32::try_from(range.len()).map_err(|_| Error::OutOfRange {
            what: "Mr::sge (over 4 GiB)",
            start: range.start,
            end: range.end,
            len: self.len(),
        })?;
        Ok(Sge { addr: self.addr() + range.start as u64, length, lkey: self.keys.lkey })
    }

    /// What a peer needs to reach bytes `range` with RDMA: address, length and rkey.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteMr> {
        self.check("Mr::remote", &range)?;
        Ok(RemoteMr { addr: self.addr() + range.start as u64, len: range.len() as u64, rkey: self.keys.rkey })
    }

    /// Copies bytes from `offset` into `out`, under the device lock. A loop of reads with no
    /// other use of the device between (polling a word that a peer's RDMA WRITE sets) is a
    /// poll like [`Cq::poll`]: after its first few calls each receives first, so the WRITE
    /// lands as a CQ poll loop would see a completion, where the progress thread, which such
    /// a loop keeps out of the device lock, could take milliseconds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check("Mr::read", &(offset..offset.saturating_add(out.len())))?;
        let mut st = self.pd.ctx.drv.shared.lock_polled();
        st.paused(|| out.copy_from_slice(&self.buf().bytes()[offset..offset + out.len()]));
        Ok(())
    }

    /// Copies `data` to `offset`, under the device lock. Unlike [`read`](Self::read), a loop
    /// of writes is not taken for a poll: it fills buffers, it does not wait for a peer.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check("Mr::write", &(offset..offset.saturating_add(data.len())))?;
        let mut st = self.pd.ctx.drv.shared.lock();
        st.paused(|| self.buf().bytes_mut()[offset..offset + data.len()].copy_from_slice(data));
        Ok(())
    }

    /// Runs `f` on the region's bytes with the device paused (the device lock held, and
    /// no process of the host applying an atomic to them on its own): no peer and no work
    /// request touches them meanwhile. Keep `f` short, and call no other softrdma function
    /// inside it (the lock is not reentrant).
    ///
    /// Like [`read`](Self::read), in a loop of reads and `with` calls with no other use of
    /// the device between it receives first: such a loop moves the peers' packets on itself.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut st = self.pd.ctx.drv.shared.lock_polled();
        st.paused(|| f(self.buf().bytes_mut()))
    }

    /// The 8 bytes at `offset` in host order, read under the device lock (what an atomic
    /// left there).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Deregister under the device lock before the buffer is freed (field drop, after),
        // unbinding any memory window bound to the region: nothing reaches the memory after.
        let _ = self.pd.ctx.drv.shared.lock().nic.engine_mut().dereg_mr_unbinding(self.keys.lkey);
    }
}

/// The device memory a context may hold at once (`max_dm_size`), across its allocations.
pub const MAX_DM_SIZE: u64 = 256 * 1024;

/// Device memory (`ibv_alloc_dm`): memory of the device's, which the application reaches
/// only by copies ([`copy_to`](Self::copy_to), [`copy_from`](Self::copy_from), 4-byte
/// aligned as a NIC's) and work requests through zero-based regions over it
/// ([`reg_mr`](Self::reg_mr)). softrdma's device is software, so its memory is the
/// process's; what it keeps is the contract: no pointer to it is handed out, and every
/// access goes through the device lock. It stays while a region over it lives.
///
/// A peer's RDMA WRITE into device memory, through a zero-based region over it, and when
/// its completion was made on the device clock:
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::{Access, ConnectOptions, QpInit, QpType, SendFlags, SendOp, SendWr, WcStatus};
///
/// let (a, b) = (softrdma::device("lo")?.open()?, softrdma::device("lo")?.open()?);
/// let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
/// let (cqa, cqb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
/// let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa))?;
/// let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb))?;
/// qa.connect(100, &qb.endpoint(0, 200)?, &ConnectOptions::default())?;
/// qb.connect(200, &qa.endpoint(0, 100)?, &ConnectOptions::default())?;
///
/// let dm = b.alloc_dm(4096)?;
/// let region = dm.reg_mr(&pb, 1024, 2048, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// let src = pa.reg_mr(64, Access::LOCAL_WRITE)?;
/// src.write(0, b"into device memory")?;
/// let sge = [src.sge(0..18)?];
/// // Zero-based: the region's first byte is address 0 for the peer.
/// let op = SendOp::RdmaWrite { remote_addr: 16, rkey: softrdma::RKey(region.rkey()) };
/// let before = a.clock();
/// qa.post_send(&[SendWr { wr_id: 1, op, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
/// let wc = cqa.wait(Duration::from_secs(5))?;
/// assert_eq!(wc.status, WcStatus::Success);
/// assert!(wc.completed_at.is_some_and(|t| t >= before && t <= a.clock()));
/// let mut out = [0u8; 20];
/// dm.copy_from(1024 + 16, &mut out)?; // 4-byte aligned, as a NIC's
/// assert_eq!(&out[..18], b"into device memory");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct DeviceMemory {
    inner: Arc<DmInner>,
}

#[derive(Debug)]
struct DmInner {
    ctx: Context,
    buf: MrBuf,
}

impl Drop for DmInner {
    fn drop(&mut self) {
        self.ctx.drv.shared.dm_bytes.fetch_sub(self.buf.len() as u64, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Context {
    /// `ibv_alloc_dm`: `len` bytes of device memory, zeroed. The context holds at most
    /// [`MAX_DM_SIZE`] bytes at once: past that, `NoResources`.
    pub fn alloc_dm(&self, len: usize) -> Result<DeviceMemory> {
        use std::sync::atomic::Ordering;
        let held = &self.drv.shared.dm_bytes;
        let want = len as u64;
        held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_add(want).filter(|&t| t <= MAX_DM_SIZE))
            .map_err(|h| {
            softrdma_engine::VerbsError::NoResources(format!(
                "{len} bytes of device memory: the context holds {h} of its {MAX_DM_SIZE} (max_dm_size)"
            ))
        })?;
        let Some(buf) = MrBuf::zeroed(len) else {
            held.fetch_sub(want, Ordering::AcqRel);
            return Err(Error::NoMemory(len));
        };
        Ok(DeviceMemory { inner: Arc::new(DmInner { ctx: self.clone(), buf }) })
    }
}

impl DeviceMemory {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.inner.buf.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks a copy of `len` bytes at `offset`: inside, and 4-byte aligned (a NIC's device
    /// memory takes 32-bit accesses only).
    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>> {
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.len() as u64);
        let Some(end) = end else {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            return Err(Error::OutOfRange {
                what: "device memory",
                start,
                end: start.saturating_add(len),
                len: self.len(),
            });
        };
        if offset % 4 != 0 || len % 4 != 0 {
            return Err(softrdma_engine::VerbsError::Invalid(format!(
                "device memory copies are 4-byte aligned: offset {offset} and length {len} must be multiples of 4"
            ))
            .into());
        }
        Ok(offset as usize..end as usize)
    }

    /// `ibv_memcpy_to_dm`: `data` into the device memory at `offset`.
    pub fn copy_to(&self, offset: u64, data: &[u8]) -> Result<()> {
        let r = self.range(offset, data.len())?;
        let _device = self.inner.ctx.drv.shared.lock();
        self.inner.buf.bytes_mut()[r].copy_from_slice(data);
        Ok(())
    }

    /// `ibv_memcpy_from_dm`: the device memory at `offset` into `out` (receiving first in a
    /// loop of reads with no other use of the device between, as [`Mr::read`] does: a loop
    /// of them, polling for a peer's WRITE, makes the progress itself).
    pub fn copy_from(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let r = self.range(offset, out.len())?;
        let _device = self.inner.ctx.drv.shared.lock_polled();
        out.copy_from_slice(&self.inner.buf.bytes()[r]);
        Ok(())
    }

    /// `ibv_reg_dm_mr`: a zero-based region of `pd` over `len` bytes at `offset` (work
    /// requests and peers name them `0 .. len`), which keeps the device memory alive.
    pub fn reg_mr(&self, pd: &Pd, offset: u64, len: usize, access: Access) -> Result<RawMr> {
        if !pd.inner.ctx.same(&self.inner.ctx) {
            return Err(Error::WrongContext("the PD"));
        }
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.len() as u64);
        if end.is_none() {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            return Err(Error::OutOfRange {
                what: "device memory",
                start,
                end: start.saturating_add(len),
                len: self.len(),
            });
        }
        let at = (self.inner.buf.addr() + offset) as usize as *mut u8;
        // SAFETY: the range lies in the device memory's buffer (checked), which the region
        // keeps alive; the device touches it under its lock only, and no Rust reference to
        // it exists outside that lock.
        #[allow(unsafe_code)]
        let mut mr = unsafe { pd.reg_mr_raw_iova(at, len, 0, access)? };
        mr.dm = Some(Arc::clone(&self.inner));
        Ok(mr)
    }

    /// How many regions over it live (`ibv_free_dm` refuses while any does).
    pub fn regions(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }
}

/// What [`Pd::prefetch`] asks for (`enum ibv_advise_mr_advice`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Prefetch {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: map the pages for the device to read.
    Read,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: map them writable.
    Write,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map only what is present.
    NoFault,
}

/// A memory region over memory the caller owns ([`Pd::reg_mr_raw`]).
#[derive(Debug)]
pub struct RawMr {
    pd: Arc<PdInner>,
    keys: MrKeys,
    addr: u64,
    len: usize,
    access: Access,
    /// Registered with [`Access::ON_DEMAND`]: its range is in the process's list of ranges
    /// the device faults in before it touches them.
    on_demand: bool,
    /// The device memory it is over, kept alive.
    dm: Option<Arc<DmInner>>,
    /// Until [`RawMr::deregister`] succeeded.
    registered: bool,
}

impl RawMr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey.0
    }
    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey.0
    }
    /// First address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl RawMr {
    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`: other access rights, the keys kept.
    /// Refused while memory windows are bound to the region.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        // SAFETY: no new range.
        #[allow(unsafe_code)]
        unsafe {
            self.rereg(None, None, Some(access))
        }
    }

    /// `ibv_rereg_mr`: the region moved to another PD of the same context, another range
    /// of memory (named by its address, as [`Pd::reg_mr_raw`]'s), other access rights
    /// (each `None` keeps what it had); the keys kept. Nothing changes on an error.
    ///
    /// # Safety
    /// A new range must keep [`Pd::reg_mr_raw`]'s contract.
    #[allow(unsafe_code)] // An unsafe contract, for memory this crate does not own (the C layer's).
    pub unsafe fn rereg(
        &mut self,
        pd: Option<&Pd>,
        range: Option<(*mut u8, usize)>,
        access: Option<Access>,
    ) -> Result<()> {
        if pd.is_some_and(|p| !p.inner.ctx.same(&self.pd.ctx)) {
            return Err(Error::WrongContext("the new PD"));
        }
        let range = range.map(|(a, l)| (a as usize as u64, l));
        let access = access.unwrap_or(self.access);
        self.pd.ctx.drv.shared.lock().nic.engine_mut().rereg_mr(
            self.keys.lkey,
            pd.map(|p| p.inner.id),
            range.map(|(a, l)| (a, l as u64)),
            Some(access),
        )?;
        if self.on_demand {
            crate::memory::remove_on_demand(self.addr, self.len as u64);
            self.on_demand = false;
        }
        if let Some((addr, len)) = range {
            (self.addr, self.len) = (addr, len);
        }
        if let Some(p) = pd {
            self.pd = Arc::clone(&p.inner);
        }
        self.access = access;
        if access.contains(Access::ON_DEMAND) {
            crate::memory::add_on_demand(self.addr, self.len as u64);
            self.on_demand = true;
        }
        Ok(())
    }

    /// Puts the range in the process's list of ranges on demand, if `on`.
    fn on_demand(mut self, on: bool) -> Self {
        if on {
            crate::memory::add_on_demand(self.addr, self.len as u64);
            self.on_demand = true;
        }
        self
    }

    /// `ibv_dereg_mr` as rxe does it: refused while memory windows are bound to the region,
    /// which then stays registered. Once it succeeded, dropping the `RawMr` does nothing
    /// more; dropping one still registered deregisters it whatever is bound, unbinding the
    /// windows.
    pub fn deregister(&mut self) -> Result<()> {
        if self.registered {
            self.pd.ctx.drv.shared.lock().nic.engine_mut().dereg_mr(self.keys.lkey)?;
            self.registered = false;
            if std::mem::take(&mut self.on_demand) {
                crate::memory::remove_on_demand(self.addr, self.len as u64);
            }
        }
        Ok(())
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        // The caller's memory may be freed once this returns: windows bound to the region
        // are unbound, so that nothing reaches it.
        let _ = self.pd.ctx.drv.shared.lock().nic.engine_mut().dereg_mr_unbinding(self.keys.lkey);
        if self.on_demand {
            crate::memory::remove_on_demand(self.addr, self.len as u64);
        }
    }
}

/// A memory window (`ibv_mw`): remote access to part of a region, with rights of its own,
/// that its owner binds, rebinds and revokes without registering anything
/// ([`Pd::alloc_mw`], [`Qp::bind_mw`]). The region must allow binding
/// ([`Access::MW_BIND`]); it needs no remote right itself.
///
/// A type 2 window is bound by a work request of a QP and reached only through that QP; it
/// is freed again by a LOCAL_INV ([`Qp::invalidate`]) or by the peer's SEND_WITH_INV. A
/// type 1 window is reached through any QP of its PD, bound again at will and unbound by
/// a bind of length 0. Dropping the window deallocates it: nothing reaches the memory
/// through it after.
///
/// B lends A a window over 16 bytes of a region A could not otherwise reach, A writes
/// there and gives it back with a SEND_WITH_INV:
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::{Access, ConnectOptions, MwType, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus};
///
/// let (a, b) = (softrdma::device("lo")?.open()?, softrdma::device("lo")?.open()?);
/// let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
/// let (cqa, cqb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
/// let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa))?;
/// let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb))?;
/// qa.connect(1, &qb.endpoint(0, 2)?, &ConnectOptions::default())?;
/// qb.connect(2, &qa.endpoint(0, 1)?, &ConnectOptions::default())?;
///
/// // B: a region with no remote right, and a window over 16 of its bytes that A may write.
/// let region = pb.reg_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND)?;
/// let window = pb.alloc_mw(MwType::Type2)?;
/// let rkey = qb.bind_mw(1, &window, &region, 64..80, Access::REMOTE_WRITE, SendFlags::SIGNALED)?;
/// assert_eq!(cqb.wait(Duration::from_secs(5))?.status, WcStatus::Success);
/// let target = window.remote().expect("bound");
/// assert_eq!((target.rkey, target.len), (rkey, 16));
///
/// // A writes through it, then sends B a message that gives the window back.
/// let ma = pa.reg_mr(64, Access::LOCAL_WRITE)?;
/// ma.write(0, b"through a window")?;
/// let sge = [ma.sge(0..16)?];
/// let write = SendOp::RdmaWrite { remote_addr: target.addr, rkey };
/// qa.post_send(&[SendWr { wr_id: 2, op: write, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
/// assert_eq!(cqa.wait(Duration::from_secs(5))?.status, WcStatus::Success);
/// let mut got = [0u8; 16];
/// region.read(64, &mut got)?;
/// assert_eq!(&got, b"through a window");
///
/// let rsge = [region.sge(0..64)?];
/// qb.post_recv(&[RecvWr { wr_id: 3, sg_list: &rsge }])?;
/// let inv = SendOp::SendWithInv { rkey };
/// qa.post_send(&[SendWr { wr_id: 4, op: inv, sg_list: &[], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
/// let recv = cqb.wait(Duration::from_secs(5))?;
/// assert_eq!(recv.invalidated_rkey, Some(rkey));
/// assert!(window.remote().is_none(), "free again");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Mw {
    pd: Arc<PdInner>,
    id: MwId,
    mw_type: MwType,
    /// The R_Key the window has once the binds posted so far are done (`ibv_mw.rkey`,
    /// which rxe's `ibv_bind_mw` moves on at post time).
    posted_rkey: AtomicU32,
}

impl Mw {
    /// The device's handle.
    pub fn id(&self) -> MwId {
        self.id
    }

    /// Type 1 or type 2.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// Its R_Key now (a bind posted but not yet done has not changed it).
    pub fn rkey(&self) -> RKey {
        self.info().map_or(RKey(self.posted_rkey.load(Ordering::Relaxed)), |i| i.rkey)
    }

    /// What it is bound to now: `None` when free (type 2) or bound with length 0 (type 1).
    pub fn binding(&self) -> Option<MwBinding> {
        self.info()?.binding
    }

    /// What a peer needs to reach the whole window as it is bound now: its first address
    /// (0 for a zero-based window), length and R_Key.
    pub fn remote(&self) -> Option<RemoteMr> {
        let info = self.info()?;
        let b = info.binding?;
        let addr = if b.access.contains(Access::ZERO_BASED) { 0 } else { b.addr };
        Some(RemoteMr { addr, len: b.length, rkey: info.rkey })
    }

    fn info(&self) -> Option<softrdma_engine::MwInfo> {
        self.pd.ctx.drv.shared.lock().nic.engine().query_mw(self.id)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.pd.ctx.drv.shared.lock().nic.engine_mut().dealloc_mw(self.id);
    }
}

/// `ibv_inc_rkey`: the next key of a window's R_Key (its low 8 bits plus one).
pub fn inc_rkey(rkey: RKey) -> RKey {
    RKey((rkey.0 & !0xff) | (rkey.0.wrapping_add(1) & 0xff))
}

/// Where a peer's memory is: what one side sends the other so it can READ or WRITE there.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RemoteMr {
    /// The address of the first byte, in the peer's address space.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The peer region's rkey.
    pub rkey: RKey,
}

/// A completion queue (`ibv_cq`). Cloning shares it.
#[derive(Clone, Debug)]
pub struct Cq {
    inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    ctx: Context,
    id: CqId,
    /// Its size: asked for at creation, or by the last `resize`.
    cqe: AtomicU32,
    channel: Option<CompChannel>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let mut st = self.ctx.drv.shared.lock();
        st.cq_channels.remove(&self.id.0);
        let _ = st.nic.engine_mut().destroy_cq(self.id);
    }
}

impl Cq {
    /// The device's handle of this CQ, which an [`AsyncEvent::CqError`] names.
    pub fn id(&self) -> CqId {
        self.inner.id
    }

    /// Entries asked for at creation, or by the last [`resize`](Self::resize).
    pub fn cqe(&self) -> u32 {
        self.inner.cqe.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq`: the CQ holds up to `cqe` completions from now on; the ones it holds
    /// stay. Fails (naming why) for 0, more than the device's `max_cqe`, or fewer than it
    /// holds now. Returns the new size.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let mut st = self.inner.ctx.drv.shared.lock();
        let n = st.nic.engine_mut().resize_cq(self.inner.id, cqe)?;
        self.inner.cqe.store(n, Ordering::Relaxed);
        Ok(n)
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&CompChannel> {
        self.inner.channel.as_ref()
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`, returns how many.
    /// When none is ready it first does the device's pending work in this thread (receive,
    /// timers), so a busy-polling application needs no other thread to make progress.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let sh = &self.inner.ctx.drv.shared;
        let mut st = sh.lock();
        let mut n = 0;
        while n < out.len() {
            match st.nic.engine_mut().poll_cq(self.inner.id) {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0
            && !out.is_empty()
            && let Some((now, received)) = sh.app_receive(&mut st, Some(self.inner.id))
        {
            if let Some(wc) = st.nic.engine_mut().poll_cq(self.inner.id) {
                out[0] = wc;
                n = 1;
                sh.app_received(&mut st, now);
            } else {
                sh.app_flush_after_empty_poll(&mut st, now, received);
            }
        }
        st.app_empty_polls = if n == 0 { st.app_empty_polls.wrapping_add(1) } else { 0 };
        if st.app_empty_polls % YIELD_AFTER_IDLE_TURNS == 0 && n == 0 {
            // A long busy poll gives the CPU to whoever else can run (the peer's process,
            // whose work this poll waits for, on a host with fewer cores than busy threads).
            drop(st);
            std::thread::yield_now();
        }
        n
    }

    /// One completion, if ready.
    pub fn poll_one(&self) -> Option<Wc> {
        let mut wc = [EMPTY_WC];
        (self.poll(&mut wc) == 1).then_some(wc[0])
    }

    /// Waits up to `timeout` for one completion: polls (spinning briefly), then sleeps in
    /// growing steps up to 100 µs. For event-driven waiting use a [`CompChannel`].
    pub fn wait(&self, timeout: Duration) -> Result<Wc> {
        let start = StdInstant::now();
        let mut pause = Duration::ZERO;
        loop {
            if let Some(wc) = self.poll_one() {
                return Ok(wc);
            }
            let spent = start.elapsed();
            if spent >= timeout {
                return Err(Error::Timeout(timeout, "a completion"));
            }
            if spent > Duration::from_micros(50) {
                pause = (pause * 2).clamp(Duration::from_micros(1), Duration::from_micros(100));
                self.inner.ctx.drv.shared.app_sleeps();
                std::thread::sleep(pause);
            }
        }
    }

    /// Waits up to `timeout` for `n` completions, in order.
    pub fn wait_n(&self, n: usize, timeout: Duration) -> Result<Vec<Wc>> {
        let deadline = StdInstant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            out.push(self.wait(deadline.saturating_duration_since(StdInstant::now()))?);
        }
        Ok(out)
    }

    /// `ibv_req_notify_cq`: the next completion (or, with `solicited_only`, the next
    /// solicited or failed one) raises an event on the CQ's channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let sh = &self.inner.ctx.drv.shared;
        let mut st = sh.lock();
        st.nic.engine_mut().req_notify_cq(self.inner.id, solicited_only)?;
        drop(st);
        // The application is about to wait for the event, perhaps in its own epoll loop
        // rather than in get_cq_event: the sockets go back to the progress thread now.
        // Not where it waits in get_cq_event, in a loop (it waited there within
        // APP_POLL_WINDOW): that wait receives itself, and waking the progress thread for
        // nothing cost two context switches per message, each taking a CPU from a polling
        // thread (an event-driven ping-pong of two processes on two cores: 2.4 switches
        // per round trip). Should it wait elsewhere after all, the progress thread
        // watches the sockets again within APP_POLL_WINDOW, as after any poll.
        let looping = self
            .inner
            .channel
            .as_ref()
            .is_some_and(|c| c.inner.spin.waited_within(sh.now().as_nanos(), driver::APP_POLL_WINDOW));
        if !looping {
            sh.app_sleeps();
        }
        Ok(())
    }

    /// Whether `self` and `other` are the same CQ.
    pub fn same(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// A placeholder work completion, to size arrays for [`Cq::poll`].
pub const EMPTY_WC: Wc = Wc {
    wr_id: 0,
    status: softrdma_engine::WcStatus::Success,
    opcode: softrdma_engine::WcOpcode::Send,
    byte_len: 0,
    imm_data: None,
    invalidated_rkey: None,
    qp_num: Qpn::from_u24_truncating(0),
    src_qp: Qpn::from_u24_truncating(0),
    grh: None,
    solicited: false,
    completed_at: None,
};

/// A completion channel (`ibv_comp_channel`): a file descriptor that polls readable when
/// an armed CQ got a completion. Cloning shares it.
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// let ctx = softrdma::device("lo")?.open()?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq(16, Some(&channel))?;
/// cq.req_notify(false)?; // the next completion raises an event
/// // Nothing was posted: no event within 10 ms. (Use the fd with poll/epoll, or
/// // softrdma::asynch with tokio.)
/// assert!(channel.get_cq_event(Some(Duration::from_millis(10)))?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug)]
pub(crate) struct ChannelInner {
    /// The armed CQs that got a completion, in order.
    fired: driver::EventQueue<Weak<CqInner>>,
    /// The device, to tell it the application sleeps.
    shared: Weak<driver::Shared>,
    /// How long a wait polls before it sleeps, from how long the recent ones lasted.
    spin: crate::wait_spin::WaitSpin,
}

/// A CQ's completion channel, as the driver knows it.
struct ChannelOfCq {
    channel: Arc<ChannelInner>,
    cq: Weak<CqInner>,
}

impl driver::CompletionChannel for ChannelOfCq {
    /// An armed CQ of this channel got its completion.
    fn fire(&self) {
        self.channel.fired.push(self.cq.clone());
    }
}

impl CompChannel {
    /// `ibv_get_cq_event`: the CQ whose completion event is next, waiting up to `timeout`
    /// (`None`: forever). `Ok(None)` when the time passed. Re-arm the CQ with
    /// [`Cq::req_notify`] before polling it, as with libibverbs.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<Cq>> {
        let deadline = timeout.map(|t| StdInstant::now() + t);
        // When this call began to wait, and how long it polls first (crate::wait_spin).
        let mut waiting: Option<(StdInstant, Duration)> = None;
        let done = |waiting: Option<(StdInstant, Duration)>| {
            if let Some((began, window)) = waiting {
                self.inner.spin.record(began.elapsed(), window);
                if let Some(sh) = self.inner.shared.upgrade() {
                    self.inner.spin.ended(sh.now().as_nanos());
                }
            }
        };
        loop {
            let next = self.inner.fired.pop();
            if let Some(weak) = next {
                if let Some(inner) = weak.upgrade() {
                    done(waiting);
                    return Ok(Some(Cq { inner }));
                }
                continue;
            }
            let left = deadline.map(|d| d.saturating_duration_since(StdInstant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                done(waiting);
                return Ok(None);
            }
            // The first time round polls; after that it sleeps.
            let spin = match waiting {
                None => {
                    let window = self.inner.spin.window();
                    waiting = Some((StdInstant::now(), window));
                    window
                }
                Some(_) => Duration::ZERO,
            };
            match self.inner.shared.upgrade() {
                Some(sh) => sh.wait_channel(self.inner.fired.fd(), left, spin, || self.inner.fired.len() > 0),
                None => {
                    driver::wait_readable(self.inner.fired.fd(), left);
                }
            }
        }
    }
}

impl AsFd for CompChannel {
    /// Polls readable when an event may be waiting; then call
    /// [`get_cq_event`](CompChannel::get_cq_event) (with a zero timeout, say).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fired.fd().as_fd()
    }
}

/// A shared receive queue (`ibv_srq`). Cloning shares it.
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use softrdma::{Access, QpInit, QpType, RecvWr};
/// let ctx = softrdma::device("lo")?.open()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// let srq = pd.create_srq(32, 1)?;
/// let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
/// let sge = [mr.sge(0..4096)?];
/// srq.post_recv(&[RecvWr { wr_id: 1, sg_list: &sge }])?;
/// srq.arm_limit(1)?; // SrqLimitReached when fewer than 1 receive remains
/// let mut init = QpInit::new(QpType::Rc, &cq);
/// init.srq = Some(&srq); // its receives come from the SRQ
/// let _qp = pd.create_qp(&init)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    pd: Arc<PdInner>,
    id: SrqId,
    /// An XRC SRQ's domain and CQ, held alive.
    _xrc: Option<(Arc<XrcdInner>, Cq)>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let _ = self.pd.ctx.drv.shared.lock().nic.engine_mut().destroy_srq(self.id);
    }
}

impl Srq {
    /// The device's handle of this SRQ, which an [`AsyncEvent::SrqLimitReached`] names.
    pub fn id(&self) -> SrqId {
        self.inner.id
    }

    /// `ibv_get_srq_num`: the number a peer's XRC sends name this SRQ by (its XRCETH).
    pub fn number(&self) -> u32 {
        self.inner.id.0
    }

    /// Whether it is an XRC SRQ ([`Pd::create_xrc_srq`]).
    pub fn is_xrc(&self) -> bool {
        self.inner._xrc.is_some()
    }

    /// `ibv_post_srq_recv`: posts `wrs` in order, stopping at the first bad one.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let sh = &self.inner.pd.ctx.drv.shared;
        let mut st = sh.lock();
        st.nic.engine_mut().post_srq_recv(self.inner.id, wrs)?;
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: raise `SrqLimitReached` once when fewer than
    /// `limit` receives remain.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        Ok(self.inner.pd.ctx.drv.shared.lock().nic.engine_mut().arm_srq_limit(self.inner.id, limit)?)
    }
}

/// An address handle (`ibv_ah`): where UD sends go.
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::*;
/// let (a, b) = (device("lo")?.open()?, device("lo")?.open()?);
/// let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
/// let (cqa, cqb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
/// let (qa, qb) = (pa.create_qp(&QpInit::new(QpType::Ud, &cqa))?, pb.create_qp(&QpInit::new(QpType::Ud, &cqb))?);
/// qa.ready_ud(0x11, 0)?;
/// qb.ready_ud(0x11, 0)?;
/// let mb = pb.reg_mr(256, Access::LOCAL_WRITE)?;
/// let rsge = [mb.sge(0..256)?];
/// qb.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }])?;
/// let av = AddressVector { dgid: b.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
/// let ah = pa.create_ah(av)?;
/// let ma = pa.reg_mr(16, Access::LOCAL_WRITE)?;
/// ma.write(0, b"datagram")?;
/// let sge = [ma.sge(0..8)?];
/// let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(qb.qpn()), remote_qkey: QKey(0x11) };
/// qa.post_send(&[SendWr { wr_id: 2, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ud: Some(dest), xrc_srqn: None }])?;
/// let wc = cqb.wait(Duration::from_secs(5))?;
/// assert_eq!(wc.byte_len, 40 + 8); // the GRH first, then the payload
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Ah {
    inner: Arc<AhInner>,
}

#[derive(Debug)]
struct AhInner {
    pd: Arc<PdInner>,
    id: AhId,
    av: AddressVector,
}

impl Drop for AhInner {
    fn drop(&mut self) {
        let _ = self.pd.ctx.drv.shared.lock().nic.engine_mut().destroy_ah(self.id);
    }
}

impl Ah {
    /// The handle to put in a UD [`SendWr`]'s destination.
    pub fn id(&self) -> AhId {
        self.inner.id
    }

    /// The address vector.
    pub fn av(&self) -> AddressVector {
        self.inner.av
    }
}

/// What a new QP is (`ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInit<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: &'a Cq,
    /// Where receive completions go.
    pub recv_cq: &'a Cq,
    /// A shared receive queue instead of the QP's own.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send completes, whatever its flags.
    pub sq_sig_all: bool,
}

impl<'a> QpInit<'a> {
    /// A QP of `qp_type` with one CQ for both queues and default sizes.
    pub fn new(qp_type: QpType, cq: &'a Cq) -> Self {
        Self { qp_type, send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false }
    }
}

/// A queue pair (`ibv_qp`).
///
/// Two contexts on 127.0.0.1 (as two processes would be), an RC QP each, connected by
/// hand, then a SEND into a posted receive and an RDMA WRITE:
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::{Access, ConnectOptions, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus};
///
/// let (a, b) = (softrdma::device("lo")?.open()?, softrdma::device("lo")?.open()?);
/// let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
/// let (cqa, cqb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
/// let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa))?;
/// let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb))?;
/// // Each side tells the other its QPN, GID and first PSN (out of band, or by rdma_cm).
/// qa.connect(100, &qb.endpoint(0, 200)?, &ConnectOptions::default())?;
/// qb.connect(200, &qa.endpoint(0, 100)?, &ConnectOptions::default())?;
///
/// let (ma, mb) = (pa.reg_mr(64, Access::ALL)?, pb.reg_mr(64, Access::ALL)?);
/// let rsge = [mb.sge(0..32)?];
/// qb.post_recv(&[RecvWr { wr_id: 7, sg_list: &rsge }])?;
/// ma.write(0, b"a send")?;
/// let sge = [ma.sge(0..6)?];
/// qa.post_send(&[SendWr { wr_id: 1, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
/// assert_eq!(cqb.wait(Duration::from_secs(5))?.wr_id, 7);
///
/// let target = mb.remote(32..64)?;
/// let write = SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey };
/// qa.post_send(&[SendWr { wr_id: 2, op: write, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
/// let wcs = cqa.wait_n(2, Duration::from_secs(5))?;
/// assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success));
/// let mut got = [0u8; 6];
/// mb.read(32, &mut got)?;
/// assert_eq!(&got, b"a send");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Qp {
    inner: Arc<QpInner>,
}

#[derive(Debug)]
struct QpInner {
    ctx: Context,
    qpn: Qpn,
    qp_type: QpType,
    /// What it holds alive: its PD, CQs and SRQ, or an XRC TGT QP's domain.
    _owner: QpOwner,
}

#[derive(Debug)]
enum QpOwner {
    Pd { _pd: Arc<PdInner>, _send_cq: Cq, _recv_cq: Cq, _srq: Option<Srq> },
    Xrcd { _xrcd: Arc<XrcdInner> },
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let sh = &self.ctx.drv.shared;
        let mut st = sh.lock();
        sh.app_flush(&mut st);
        let _ = st.nic.engine_mut().destroy_qp(self.qpn);
        if let Some(local) = st.same_host.as_mut() {
            local.forget_qp(self.qpn.value());
        }
        // Its multicast groups: those it was the device's last member of are left.
        let _ = st.sync_groups(sh);
        drop(st);
        // As the kernel's destroy (ib_uverbs_release_uevent): its events are gone with it,
        // and its QPN may name another QP next. Those the engine queued before the destroy
        // and the driver has not dispatched yet are dropped there.
        sh.async_events.retain(|e| e.qpn() != Some(self.qpn));
    }
}

/// What a peer needs to know about a QP to connect to it (exchanged out of band, or by
/// rdma_cm).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Endpoint {
    /// The QP number.
    pub qpn: u32,
    /// The GID (IP address) it sends from.
    pub gid: Gid,
    /// The first PSN it sends.
    pub psn: u32,
}

/// How to connect an RC or UC QP ([`Qp::connect`]); the defaults are rdma_cm's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConnectOptions {
    /// Local GID index (source address).
    pub sgid_index: u8,
    /// Path MTU; `None` takes the device's active MTU.
    pub mtu: Option<softrdma_engine::Mtu>,
    /// What the peer may do here.
    pub access: Access,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retries after a timeout.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code sent to the peer.
    pub min_rnr_timer: u8,
    /// READs/atomics outstanding each way.
    pub rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            sgid_index: 0,
            mtu: None,
            access: Access::ALL,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
        }
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn.value()
    }

    /// Its transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    fn shared(&self) -> &driver::Shared {
        &self.inner.ctx.drv.shared
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        // ACKs a poll deferred leave before a state change could discard them.
        sh.app_flush(&mut st);
        st.nic.engine_mut().modify_qp(self.inner.qpn, attr, mask)?;
        sh.after_verb(&mut st);
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<(QpAttr, QpCap)> {
        self.shared()
            .lock()
            .nic
            .engine()
            .query_qp(self.inner.qpn)
            .ok_or(Error::Verbs(softrdma_engine::VerbsError::NotFound { kind: "QP", id: self.qpn() }))
    }

    /// The QP's state.
    pub fn state(&self) -> Option<QpState> {
        self.shared().lock().nic.engine().qp_state(self.inner.qpn)
    }

    /// Whether the QP is in authenticated mode ([`ContextOptions::authenticate`](crate::ContextOptions::authenticate)):
    /// every packet it sends and accepts carries a MAC of the connection's keys.
    pub fn authenticated(&self) -> bool {
        self.shared().lock().nic.engine().qp_authenticated(self.inner.qpn)
    }

    /// This QP as a peer must see it, sending from GID `sgid_index` and starting at `psn`.
    pub fn endpoint(&self, sgid_index: u8, psn: u32) -> Result<Endpoint> {
        let gid = self.inner.ctx.gid(sgid_index).ok_or_else(|| {
            Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "GID index {sgid_index}: the device has {} GIDs",
                self.inner.ctx.device().addresses().len()
            )))
        })?;
        Ok(Endpoint { qpn: self.qpn(), gid, psn })
    }

    /// Connects an RC, UC or XRC QP to `remote`: RESET → INIT → RTR → RTS with `options`, the
    /// local side starting at `local_psn` (what [`endpoint`](Qp::endpoint) told the peer).
    /// A UD QP has no peer: use [`Qp::ready_ud`] for it.
    pub fn connect(&self, local_psn: u32, remote: &Endpoint, options: &ConnectOptions) -> Result<()> {
        let mtu = options.mtu.unwrap_or_else(|| self.inner.ctx.device().active_mtu());
        let init = QpAttr { qp_state: QpState::Init, qp_access_flags: options.access, ..QpAttr::default() };
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        self.modify(&init, mask)?;
        let av = AddressVector {
            dgid: remote.gid,
            sgid_index: options.sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: Some(av),
            path_mtu: mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: options.rd_atomic,
            min_rnr_timer: options.min_rnr_timer,
            ..QpAttr::default()
        };
        mask = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        if matches!(self.inner.qp_type, QpType::Rc | QpType::XrcTgt) {
            mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        self.modify(&rtr, mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: local_psn,
            timeout: options.timeout,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            max_rd_atomic: options.rd_atomic,
            ..QpAttr::default()
        };
        mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if matches!(self.inner.qp_type, QpType::Rc | QpType::XrcIni) {
            mask = mask | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
        } else if self.inner.qp_type == QpType::XrcTgt {
            mask |= AttrMask::TIMEOUT;
        }
        self.modify(&rts, mask)
    }

    /// Brings a UD QP to RTS with Q_Key `qkey`, sending from PSN `psn`.
    pub fn ready_ud(&self, qkey: u32, psn: u32) -> Result<()> {
        let init = QpAttr { qp_state: QpState::Init, qkey: softrdma_wire::QKey(qkey), ..QpAttr::default() };
        self.modify(&init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY)?;
        self.modify(&QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() }, AttrMask::STATE)?;
        self.modify(
            &QpAttr { qp_state: QpState::Rts, sq_psn: psn, ..QpAttr::default() },
            AttrMask::STATE | AttrMask::SQ_PSN,
        )
    }

    /// `ibv_attach_mcast`: this UD QP receives, from now on, the datagrams sent to
    /// multicast group `gid` (an IPv4-mapped `::ffff:224.0.0.0/4` GID, or an `ff00::/8`
    /// one) with remote QPN 0xFFFFFF ([`Qpn::MULTICAST`](crate::Qpn::MULTICAST)) and its
    /// Q_Key, a copy for each QP attached, on this host or any other on the link. The first
    /// QP of the device to attach joins the group on the device's interface (IGMP / MLD,
    /// by the kernel); the last to detach, or be destroyed, leaves it. What the QP sends to
    /// the group loops back to the members on this host, itself included.
    ///
    /// Fails (EINVAL) for a GID that is no multicast group, a QP that is not UD; (ENOMEM)
    /// past the device's `max_mcast_grp`, `max_mcast_qp_attach`,
    /// `max_total_mcast_qp_attach` ([`DeviceAttr`](crate::DeviceAttr)); or when the group
    /// cannot be joined on the interface.
    ///
    /// ```
    /// # fn main() -> softrdma::Result<()> {
    /// use std::time::Duration;
    /// use softrdma::*;
    /// let group = Gid::from_ip("230.0.45.67".parse().unwrap());
    /// let (a, b) = (device("lo")?.open()?, device("lo")?.open()?);
    /// let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    /// let (cqa, cqb) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
    /// let (qa, qb) = (pa.create_qp(&QpInit::new(QpType::Ud, &cqa))?, pb.create_qp(&QpInit::new(QpType::Ud, &cqb))?);
    /// qa.ready_ud(0x11, 0)?;
    /// qb.ready_ud(0x11, 0)?;
    /// qb.attach_mcast(group)?; // b joins the group
    /// let mb = pb.reg_mr(256, Access::LOCAL_WRITE)?;
    /// let rsge = [mb.sge(0..256)?];
    /// qb.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }])?;
    ///
    /// // a sends to the group: an AH with the group's GID, remote QPN 0xFFFFFF.
    /// let av = AddressVector { dgid: group, sgid_index: 0, hop_limit: 1, traffic_class: 0, flow_label: 0 };
    /// let ah = pa.create_ah(av)?;
    /// let ma = pa.reg_mr(16, Access::LOCAL_WRITE)?;
    /// ma.write(0, b"to all")?;
    /// let sge = [ma.sge(0..6)?];
    /// let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::MULTICAST, remote_qkey: QKey(0x11) };
    /// qa.post_send(&[SendWr { wr_id: 2, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ud: Some(dest), xrc_srqn: None }])?;
    /// let wc = cqb.wait(Duration::from_secs(5))?;
    /// assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 6));
    /// let mut got = [0u8; 6];
    /// mb.read(40, &mut got)?;
    /// assert_eq!(&got, b"to all");
    /// qb.detach_mcast(group)?; // and leaves it
    /// # Ok(()) }
    /// ```
    pub fn attach_mcast(&self, gid: Gid) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        st.nic.engine_mut().attach_mcast(self.inner.qpn, gid)?;
        match st.sync_groups(sh) {
            Err((failed, e)) if failed == gid => {
                // Not joined on the network: the table must not claim it is.
                let _ = st.nic.engine_mut().detach_mcast(self.inner.qpn, gid);
                let _ = st.sync_groups(sh);
                Err(Error::io(format!("joining multicast group {gid} on {}", self.inner.ctx.drv.device.interface()), e))
            }
            _ => Ok(()),
        }
    }

    /// `ibv_detach_mcast`: this QP no longer receives group `gid` (EINVAL if it was not
    /// attached). The device's last QP to detach leaves the group.
    pub fn detach_mcast(&self, gid: Gid) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        st.nic.engine_mut().detach_mcast(self.inner.qpn, gid)?;
        let _ = st.sync_groups(sh);
        Ok(())
    }

    /// `ibv_post_send`: posts `wrs` in order and sends what it can at once from this thread.
    /// On error, every WR before [`Error::Post::index`](Error::Post) was posted and none from
    /// it on (`*bad_wr`).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        let posted = st.post_send(self.inner.qpn, wrs);
        // WRs before a bad one were posted: send them either way.
        sh.after_verb(&mut st);
        Ok(posted?)
    }

    /// `ibv_wr_complete`: posts all of `wrs`, or none of them if one could not be posted
    /// (the error's index names it).
    pub fn post_send_all(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        let posted = st.nic.engine_mut().post_send_all(self.inner.qpn, wrs, &crate::memory::ProcessMemory);
        if posted.is_ok() {
            sh.after_verb(&mut st);
        }
        Ok(posted?)
    }

    /// Posts a BIND_MW that binds `mw` to bytes `range` of `region` with `access` (remote
    /// rights, and [`Access::ZERO_BASED`] for a type 2 window that peers address from 0),
    /// its R_Key's low 8 bits moved on (`ibv_inc_rkey`), as `ibv_bind_mw` does for type 1
    /// and `IBV_WR_BIND_MW` for type 2. Returns the R_Key the window has once bound. The
    /// bind is done when the send queue reaches it and completes in order
    /// (`IBV_WC_BIND_MW`); one the device refuses completes with `IBV_WC_MW_BIND_ERR` and
    /// fails the QP. An empty `range` unbinds a type 1 window.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        mw: &Mw,
        region: &Mr,
        range: Range<usize>,
        access: Access,
        flags: SendFlags,
    ) -> Result<RKey> {
        let ctx = &self.inner.ctx;
        for (same, what) in [(mw.pd.ctx.same(ctx), "the memory window"), (region.pd.ctx.same(ctx), "the region")] {
            if !same {
                return Err(Error::WrongContext(what));
            }
        }
        region.check("Qp::bind_mw", &range)?;
        let bind = MwBind {
            mr: region.keys.lkey,
            addr: region.addr() + range.start as u64,
            length: range.len() as u64,
            access,
        };
        let sh = self.shared();
        let mut st = sh.lock();
        // Under the device lock: binds of one window from several threads chain their keys.
        let from = RKey(mw.posted_rkey.load(Ordering::Relaxed));
        let to = inc_rkey(from);
        let wr = SendWr {
            wr_id,
            op: SendOp::BindMw { mw: mw.id, rkey: to, bind },
            sg_list: &[],
            flags,
            ud: None,
            xrc_srqn: None,
        };
        let posted = st.nic.engine_mut().post_send(self.inner.qpn, &[wr], &crate::memory::ProcessMemory);
        sh.after_verb(&mut st);
        posted?;
        mw.posted_rkey.store(to.0, Ordering::Relaxed);
        Ok(to)
    }

    /// Posts a LOCAL_INV of `rkey`: the type 2 window it names is free again once every
    /// work request posted before it has completed.
    pub fn invalidate(&self, wr_id: u64, rkey: RKey, flags: SendFlags) -> Result<()> {
        self.post_send(&[SendWr {
            wr_id,
            op: SendOp::LocalInv { rkey },
            sg_list: &[],
            flags,
            ud: None,
            xrc_srqn: None,
        }])
    }

    /// `ibv_post_recv`: posts `wrs` in order, stopping at the first bad one.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let sh = self.shared();
        let mut st = sh.lock();
        st.nic.engine_mut().post_recv(self.inner.qpn, wrs)?;
        Ok(())
    }
}
