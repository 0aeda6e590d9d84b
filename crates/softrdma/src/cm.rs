//! The connection manager (librdmacm's `rdma_*` calls): [`EventChannel`] and [`CmId`].
//!
//! A [`CmId`] is created unbound; `bind_addr` or `resolve_addr` attaches it to the device
//! that owns the address (opening that device once per process and port, as librdmacm
//! opens every device at start-up). The protocol, IB CM over MADs on QP1 with rdma_cm's
//! addressing, is [`softrdma_cm::Cm`], one per open device; the device's progress thread
//! carries its MADs, fires its timers and delivers its events to each ID's channel.
//!
//! As with librdmacm, a QP attached to an ID ([`CmId::create_qp`]) is driven through its
//! states by the connection: INIT at creation, RTR and RTS before `accept` sends the REP or
//! when the REP arrives (the application sees `ESTABLISHED`, not `CONNECT_RESPONSE`), and
//! ERR on `disconnect`, when the peer disconnects or when the connection is rejected, so
//! that outstanding work flushes.
//!
//! The verbs helpers of `<rdma/rdma_verbs.h>` (`rdma_post_recv`, `rdma_post_recvv`,
//! `rdma_post_send`, `rdma_post_read`, `rdma_post_write` with inline data and no MR,
//! `rdma_reg_msgs`/`_read`/`_write`, `rdma_get_send_comp`/`_recv_comp`) are methods of
//! [`CmId`].

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant as StdInstant};

use softrdma_cm::{CmError, CmEventKind, CmStatus, ConnParam, NicError, UdParam};
use softrdma_engine::{Access, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, Wc};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::{Gid, QKey, Qpn, RKey};

use crate::driver::{self, CmDelivery, Driver, State};
use crate::verbs::{Cq, Mr, Pd, Qp, QpInit};
use crate::{Context, ContextOptions, Device, Error, Result};
use softrdma_cm::auth::AuthPolicy;

/// Authenticated mode for the IDs of a channel opened with `options`: on with
/// [`ContextOptions::authenticate`], a passphrase, or `SOFTRDMA_AUTH=1`.
fn auth_policy(options: &ContextOptions) -> Result<AuthPolicy> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let on = match env(crate::AUTH_ENV).as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "{}={other}: set it to 1 (authenticate every RC and UC connection) or 0",
                crate::AUTH_ENV
            ))));
        }
    };
    let passphrase = options.auth_passphrase.clone().or_else(|| env(crate::AUTH_PSK_ENV));
    let psk = passphrase.map(|p| softrdma_cm::auth::psk_from_passphrase(p.as_bytes()));
    Ok(AuthPolicy { required: options.authenticate || on || psk.is_some(), psk })
}

/// The devices the connection manager opened, by (device name, port): one context each per
/// process, shared by every ID on it.
fn cm_context(device: &Device, options: &ContextOptions) -> Result<Context> {
    type Open = BTreeMap<(String, u16), Weak<Driver>>;
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    let mut open = OPEN.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner);
    let key = (device.name().to_string(), options.port);
    if let Some(drv) = open.get(&key).and_then(Weak::upgrade) {
        return Ok(Context { drv });
    }
    let ctx = device.open_with(options)?;
    open.insert(key, Arc::downgrade(&ctx.drv));
    Ok(ctx)
}

impl Device {
    /// The context the connection manager's IDs use on this device with the default
    /// options, opened if none is (librdmacm's `rdma_get_devices`): a PD or CQ made on it
    /// serves the QP of any ID bound to the device, as long as the caller keeps it.
    pub fn cm_context(&self) -> Result<Context> {
        cm_context(self, &ContextOptions::default())
    }
}

/// The device that owns `addr`'s IP (an address of one of its GIDs). A link-local
/// address is an interface's only in its scope (`sin6_scope_id`): the device of that
/// interface; without one, the only device with that address.
fn device_of(addr: SocketAddr) -> Result<Device> {
    let ip = addr.ip().to_canonical();
    let scope = match addr {
        SocketAddr::V6(a) if a.ip().is_unicast_link_local() => a.scope_id(),
        _ => 0,
    };
    let all = crate::devices()?;
    let names: Vec<String> = all.iter().map(|d| format!("{} {:?}", d.name(), d.addresses())).collect();
    let mut owners: Vec<Device> = all
        .into_iter()
        .filter(|d| d.addresses().contains(&ip) && (scope == 0 || d.interface_index() == scope))
        .collect();
    match owners.len() {
        0 => {
            let name = match scope {
                0 => format!("(the device with address {ip})"),
                s => format!("(the device with address {ip} on interface index {s})"),
            };
            Err(Error::NoDevice { name, available: names.join(", ") })
        }
        1 => Ok(owners.remove(0)),
        _ => Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
            "link-local {ip} is an address of {}: name the interface in sin6_scope_id (\"{ip}%eth0\")",
            owners.iter().map(|d| d.name()).collect::<Vec<_>>().join(" and ")
        )))),
    }
}

impl From<CmError> for Error {
    fn from(e: CmError) -> Self {
        Error::Cm(e)
    }
}

impl From<NicError> for Error {
    fn from(e: NicError) -> Self {
        match e {
            NicError::Cm(e) => Error::Cm(e),
            NicError::Verbs(e) => Error::Verbs(e),
        }
    }
}

/// An event channel (`rdma_event_channel`): where the events of its IDs queue, with a file
/// descriptor that polls readable when one may be waiting. Cloning shares it.
///
/// A listener and a client in one process, the way `rdma_server` and `rdma_client` meet:
///
/// ```
/// # fn main() -> softrdma::Result<()> {
/// use std::time::Duration;
/// use softrdma::*;
/// let t = Duration::from_secs(5);
/// let (server, client) = (EventChannel::new()?, EventChannel::new()?);
/// let listen = server.create_id(PortSpace::TCP, QpType::Rc)?;
/// listen.bind_addr("127.0.0.1:7900".parse().unwrap())?;
/// listen.listen(8)?;
///
/// let id = client.create_id(PortSpace::TCP, QpType::Rc)?;
/// id.resolve_addr(None, "127.0.0.1:7900".parse().unwrap())?;
/// client.expect(CmEventKind::AddrResolved, t)?;
/// id.resolve_route()?;
/// client.expect(CmEventKind::RouteResolved, t)?;
/// let pd = id.context().unwrap().alloc_pd()?;
/// id.create_qp(&pd, QpCap::default())?; // driven through INIT, RTR, RTS by the CM
/// id.connect(&ConnParam { private_data: b"hi".to_vec(), ..ConnParam::default() })?;
///
/// let request = server.expect(CmEventKind::ConnectRequest, t)?;
/// assert!(request.private_data.starts_with(b"hi"));
/// let pd2 = request.id.context().unwrap().alloc_pd()?;
/// request.id.create_qp(&pd2, QpCap::default())?;
/// request.id.accept(&ConnParam::default())?;
/// client.expect(CmEventKind::Established, t)?;
/// server.expect(CmEventKind::Established, t)?;
/// id.disconnect()?; // a DREQ
/// server.expect(CmEventKind::Disconnected, t)?;
/// request.id.disconnect()?; // the DREP, as rdma_disconnect after DISCONNECTED
/// client.expect(CmEventKind::Disconnected, t)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug)]
pub(crate) struct ChannelInner {
    events: driver::EventQueue<CmEvent>,
    options: ContextOptions,
    /// Authenticated mode of its IDs, from `options` and the environment.
    auth: AuthPolicy,
}

impl ChannelInner {
    fn push(&self, event: CmEvent) {
        self.events.push(event);
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`: devices its IDs open use the default options (port 4791).
    pub fn new() -> Result<EventChannel> {
        Self::with_options(ContextOptions::default())
    }

    /// An event channel whose IDs open devices with `options` (a test's own port, say).
    pub fn with_options(options: ContextOptions) -> Result<EventChannel> {
        let events = driver::EventQueue::new("an event channel")?;
        let auth = auth_policy(&options)?;
        Ok(EventChannel { inner: Arc::new(ChannelInner { events, options, auth }) })
    }

    /// `rdma_create_id`: an unbound ID of port space `ps` (TCP for RC, UDP for UD) whose
    /// events come to this channel.
    pub fn create_id(&self, ps: PortSpace, qp_type: QpType) -> Result<CmId> {
        let inner =
            CmIdInner::new(Arc::downgrade(&self.inner), self.inner.options.clone(), self.inner.auth, ps, qp_type);
        Ok(CmId { inner: Arc::new(inner) })
    }

    /// `rdma_get_cm_event`: the next event, waiting up to `timeout` (`None`: forever);
    /// `Ok(None)` when the time passed. Events need no acknowledgement: dropping one is
    /// `rdma_ack_cm_event`.
    pub fn get_cm_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| StdInstant::now() + t);
        loop {
            if let Some(e) = self.inner.events.pop() {
                if e.kind == CmEventKind::ConnectRequest {
                    e.id.request_taken();
                }
                return Ok(Some(e));
            }
            let left = deadline.map(|d| d.saturating_duration_since(StdInstant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            driver::wait_readable(self.inner.events.fd(), left);
        }
    }

    /// Waits up to `timeout` for the next event and checks it is `kind`.
    pub fn expect(&self, kind: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        match self.get_cm_event(Some(timeout))? {
            Some(e) if e.kind == kind => Ok(e),
            Some(e) => Err(Error::UnexpectedEvent { expected: kind, got: e.kind, status: e.status }),
            None => Err(Error::Timeout(timeout, "a CM event")),
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.events.fd().as_fd()
    }
}

/// A connection-manager event (`rdma_cm_event`).
#[derive(Clone, Debug)]
pub struct CmEvent {
    /// The ID it happened to; for `CONNECT_REQUEST` a new ID for the connection.
    pub id: CmId,
    /// What happened (librdmacm's numbering).
    pub kind: CmEventKind,
    /// Why, for failures (rejection reason, timeout, ...).
    pub status: CmStatus,
    /// The peer's private data (the whole fixed-size area, zero-padded, as the kernel
    /// reports it).
    pub private_data: Vec<u8>,
    /// The peer's connection parameters (`CONNECT_REQUEST`, `ESTABLISHED`).
    pub param: Option<ConnParam>,
    /// The listener, for `CONNECT_REQUEST`.
    pub listen_id: Option<CmId>,
    /// For a UD ID's `ESTABLISHED`: the remote QP, its Q_Key and the address to reach it.
    pub ud: Option<UdParam>,
}

/// A connection-manager ID (`rdma_cm_id`). Cloning shares it; the ID is destroyed (with a
/// DREQ or REJ as its state needs) when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct CmId {
    inner: Arc<CmIdInner>,
}

#[derive(Debug)]
pub(crate) struct CmIdInner {
    /// Weak: a queued event holds its ID, which must not keep its channel alive in turn.
    /// Behind a lock for `migrate` (`rdma_migrate_id`).
    channel: Mutex<Weak<ChannelInner>>,
    options: ContextOptions,
    auth: AuthPolicy,
    ps: PortSpace,
    qp_type: QpType,
    /// The device(s) it is bound to and its ID in each one's CM (several for a wildcard
    /// listener, one otherwise).
    bindings: Mutex<Vec<Binding>>,
    qp: Mutex<Option<IdQp>>,
    /// The multicast groups joined (`rdma_join_multicast`), in join order.
    mcast: Mutex<Vec<Joined>>,
    /// `rdma_set_option`'s ID options, given to each device's CM ID as it is made.
    id_options: Mutex<IdOptions>,
}

/// A multicast group an ID joined.
#[derive(Debug, Clone, Copy)]
struct Joined {
    addr: SocketAddr,
    mgid: Gid,
    /// The ID's QP was attached to it by the join (a full member's, with a QP then).
    attached: bool,
}

/// What `rdma_set_option` sets on an ID (`RDMA_OPTION_ID_*`).
#[derive(Debug, Clone, Copy, Default)]
struct IdOptions {
    tos: Option<u8>,
    ack_timeout: Option<u8>,
}

#[derive(Debug, Clone)]
struct Binding {
    ctx: Context,
    id: softrdma_cm::CmId,
    service: Option<u64>,
}

#[derive(Debug, Clone)]
struct IdQp {
    qp: Qp,
    /// Its PD and CQs; an XRC TGT QP has none (its XRC SRQs do).
    parts: Option<(Pd, Cq, Cq)>,
}

impl IdQp {
    fn parts(&self, what: &'static str) -> Result<&(Pd, Cq, Cq)> {
        self.parts.as_ref().ok_or_else(|| {
            Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "{what}: the ID's QP is an XRC TGT QP, which has no PD or CQ (its XRC SRQs have them)"
            )))
        })
    }
}

impl CmIdInner {
    fn new(
        channel: Weak<ChannelInner>,
        options: ContextOptions,
        auth: AuthPolicy,
        ps: PortSpace,
        qp_type: QpType,
    ) -> Self {
        driver::disconnect_at_exit();
        Self {
            channel: Mutex::new(channel),
            options,
            auth,
            ps,
            qp_type,
            bindings: Mutex::new(Vec::new()),
            qp: Mutex::new(None),
            mcast: Mutex::new(Vec::new()),
            id_options: Mutex::new(IdOptions::default()),
        }
    }

    fn bindings(&self) -> Vec<Binding> {
        self.bindings.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Makes this ID's CM ID on one device, with its authentication policy and options.
    fn create_in(&self, cm: &mut softrdma_cm::Cm) -> Result<softrdma_cm::CmId> {
        let id = cm.create_id(self.ps, self.qp_type)?;
        let options = *self.id_options.lock().unwrap_or_else(PoisonError::into_inner);
        let configured = cm.set_auth_policy(id, self.auth).and_then(|()| {
            options.tos.map_or(Ok(()), |t| cm.set_tos(id, t))?;
            options.ack_timeout.map_or(Ok(()), |t| cm.set_ack_timeout(id, t))
        });
        if let Err(e) = configured {
            let _ = cm.destroy_id(softrdma_engine::Instant::ZERO, id);
            return Err(e.into());
        }
        Ok(id)
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // No device lock here: the last reference may go in the progress thread, which
        // holds it. The device destroys the CM's ID on its next pass (with the DREQ or REJ
        // its state needs).
        for b in self.bindings.get_mut().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let sh = &b.ctx.drv.shared;
            if let Some(service) = b.service {
                let _ = sh.port.member.unlisten(service);
            }
            sh.bury_cm_id(b.id);
        }
    }
}

/// The IDs of one device, by the CM's handle: where the driver delivers their events
/// ([`CmDelivery`]). Its lock is taken inside the device lock, never around it.
struct IdRegistry {
    /// The device, for the IDs of connection requests.
    drv: Weak<Driver>,
    ids: Mutex<BTreeMap<u32, Weak<CmIdInner>>>,
}

impl IdRegistry {
    /// The registry of `drv`'s IDs (made with the first), under its device lock `st`.
    fn of<'a>(st: &'a mut State, drv: &Arc<Driver>) -> &'a IdRegistry {
        let d = st
            .cm_delivery
            .get_or_insert_with(|| Arc::new(IdRegistry { drv: Arc::downgrade(drv), ids: Mutex::new(BTreeMap::new()) }));
        d.as_any().downcast_ref().expect("the device's CM IDs are this module's")
    }

    fn insert(&self, id: softrdma_cm::CmId, inner: &Arc<CmIdInner>) {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner).insert(id.0, Arc::downgrade(inner));
    }

    fn get(&self, id: softrdma_cm::CmId) -> Option<Arc<CmIdInner>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner).get(&id.0).and_then(Weak::upgrade)
    }
}

impl CmDelivery for IdRegistry {
    /// Delivers a CM event to its ID's channel, making the ID of a connection request on
    /// the way (the NIC drove the ID's QP already).
    fn deliver(&self, ev: softrdma_cm::CmEvent, later: &mut Vec<Box<dyn std::any::Any + Send>>) {
        let (owner, listen) = match ev.listen_id {
            Some(l) => (None, self.get(l)),
            None => (self.get(ev.id), None),
        };
        let target = match (&owner, &listen) {
            (Some(o), _) => CmId { inner: o.clone() },
            (None, Some(l)) => {
                // A connection request: a new ID on the listener's channel, bound here.
                let Some(drv) = self.drv.upgrade() else { return };
                let channel = l.channel.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let inner = Arc::new(CmIdInner::new(channel, l.options.clone(), l.auth, l.ps, l.qp_type));
                self.insert(ev.id, &inner);
                let binding = Binding { ctx: Context { drv }, id: ev.id, service: None };
                inner.bindings.lock().unwrap_or_else(PoisonError::into_inner).push(binding);
                CmId { inner }
            }
            (None, None) => return, // its ID is gone: nothing to tell
        };
        if let Some(o) = owner {
            later.push(Box::new(o));
        }
        let listen_id = listen.map(|inner| CmId { inner });
        let event = CmEvent {
            id: target.clone(),
            kind: ev.kind,
            status: ev.status,
            private_data: ev.private_data,
            param: ev.param,
            listen_id,
            ud: ev.ud,
        };
        let channel = target.inner.channel.lock().unwrap_or_else(PoisonError::into_inner).upgrade();
        match channel {
            Some(channel) => channel.push(event),
            None => later.push(Box::new(event)),
        }
        // Possibly the last reference (the application let go meanwhile): dropping it
        // destroys QPs and CQs, which takes the lock the caller holds.
        later.push(Box::new(target));
    }

    fn forget(&self, id: softrdma_cm::CmId) {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner).remove(&id.0);
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl CmId {
    /// The application took this ID's `CONNECT_REQUEST`: it leaves its listener's backlog.
    fn request_taken(&self) {
        if let Some(b) = self.inner.bindings().into_iter().next() {
            b.ctx.drv.shared.lock().nic.cm_mut().request_taken(b.id);
        }
    }

    fn binding(&self, what: &'static str) -> Result<Binding> {
        self.inner.bindings().into_iter().next().ok_or(Error::Unbound(what))
    }

    fn attach(&self, ctx: &Context, id: softrdma_cm::CmId) {
        IdRegistry::of(&mut ctx.drv.shared.lock(), &ctx.drv).insert(id, &self.inner);
        let b = Binding { ctx: ctx.clone(), id, service: None };
        self.inner.bindings.lock().unwrap_or_else(PoisonError::into_inner).push(b);
    }

    /// `rdma_bind_addr`: binds to a local address and port (port 0: an ephemeral one). A
    /// wildcard address (`0.0.0.0`, `::`) binds on every device with an address of that
    /// family, for `listen`.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        if !self.inner.bindings().is_empty() {
            return Err(Error::AlreadyBound);
        }
        let devices: Vec<Device> = if addr.ip().is_unspecified() {
            crate::devices()?
                .into_iter()
                .filter(|d| d.addresses().iter().any(|a| a.is_ipv4() == addr.is_ipv4()))
                .collect()
        } else {
            vec![device_of(addr)?]
        };
        // All devices or none: a wildcard bind that fails on one leaves no binding behind.
        let mut made: Vec<(Context, softrdma_cm::CmId)> = Vec::new();
        let undo = |made: Vec<(Context, softrdma_cm::CmId)>| {
            for (ctx, id) in made {
                let _ = ctx.drv.shared.lock().nic.destroy_id(ctx.drv.shared.now(), id);
            }
        };
        for device in devices {
            let bound = cm_context(&device, &self.inner.options).and_then(|ctx| {
                let sh = &ctx.drv.shared;
                let mut st = sh.lock();
                // An ID just destroyed on this port must not hold it (EADDRINUSE) until
                // the progress thread's next pass.
                if st.bury_dead_cm_ids(sh, sh.now()) {
                    sh.after_verb(&mut st); // their DREQs and REJs
                }
                let id = self.inner.create_in(st.nic.cm_mut())?;
                if let Err(e) = st.nic.cm_mut().bind_addr(id, addr) {
                    let _ = st.nic.cm_mut().destroy_id(sh.now(), id);
                    return Err(e.into());
                }
                drop(st);
                Ok((ctx, id))
            });
            match bound {
                Ok(b) => made.push(b),
                Err(e) => {
                    undo(made);
                    return Err(e);
                }
            }
        }
        for (ctx, id) in made {
            self.attach(&ctx, id);
        }
        Ok(())
    }

    /// `rdma_resolve_addr`: finds the local address that reaches `dst` (the kernel's route,
    /// or `src`), binds to its device; `ADDR_RESOLVED` or `ADDR_ERROR` follows.
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        let src_addr = match src {
            Some(s) if !s.ip().is_unspecified() => s,
            _ => route_source(dst)?,
        };
        let src_ip = src_addr.ip();
        let binding = match self.inner.bindings().into_iter().next() {
            Some(b) => b,
            None => {
                let ctx = cm_context(&device_of(src_addr)?, &self.inner.options)?;
                let mut st = ctx.drv.shared.lock();
                let id = self.inner.create_in(st.nic.cm_mut())?;
                drop(st);
                self.attach(&ctx, id);
                self.binding("resolve_addr")?
            }
        };
        let port = src.map_or(0, |s| s.port());
        self.with_cm(&binding, |st, now| {
            Ok(st.nic.cm_mut().resolve_addr(now, binding.id, Some(SocketAddr::new(src_ip, port)), dst)?)
        })
    }

    /// `rdma_resolve_route`: `ROUTE_RESOLVED` follows (RoCE needs no path query).
    pub fn resolve_route(&self) -> Result<()> {
        let b = self.binding("resolve_route (call resolve_addr first)")?;
        self.with_cm(&b, |st, now| Ok(st.nic.cm_mut().resolve_route(now, b.id)?))
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)`: the traffic class (DSCP and
    /// ECN bits) of the route `resolve_route` makes, and so of the packets of the QP the
    /// connection moves; set it before `resolve_route`, as `rping -T` does.
    pub fn set_tos(&self, tos: u8) -> Result<()> {
        self.set_id_option(|o| o.tos = Some(tos), |cm, id| cm.set_tos(id, tos))
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK timeout
    /// exponent (4.096 µs · 2^`timeout`) of the ID's QP at RTS, instead of the path's. RC only.
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        if self.inner.qp_type != QpType::Rc || timeout > 31 {
            return Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "set_ack_timeout({timeout}) on a {:?} ID: only an RC ID's QP has an ACK timeout, a 5-bit exponent (0..=31)",
                self.inner.qp_type
            ))));
        }
        self.set_id_option(|o| o.ack_timeout = Some(timeout), |cm, id| cm.set_ack_timeout(id, timeout))
    }

    /// Records an option for the CM IDs to come and gives it to those made already.
    fn set_id_option(
        &self,
        record: impl FnOnce(&mut IdOptions),
        apply: impl Fn(&mut softrdma_cm::Cm, softrdma_cm::CmId) -> Result<(), softrdma_cm::CmError>,
    ) -> Result<()> {
        record(&mut self.inner.id_options.lock().unwrap_or_else(PoisonError::into_inner));
        for b in self.inner.bindings() {
            apply(b.ctx.drv.shared.lock().nic.cm_mut(), b.id)?;
        }
        Ok(())
    }

    /// `rdma_listen`: `CONNECT_REQUEST` events follow, each with a new ID. Registers the
    /// service with the host so that requests reach this process.
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let mut bindings = self.inner.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        if bindings.is_empty() {
            return Err(Error::Unbound("listen (call bind_addr first)"));
        }
        // Every device's CM listens first, then the services are registered with the hosts
        // (a round trip to each coordinator, which installs a steering program: up to
        // milliseconds): a REQ that reaches this process meanwhile (it is the host's only
        // one, say) finds the listener, as it would in the kernel, where rdma_listen
        // listens on every device at once. Registered one device after the other, the last
        // device listened milliseconds late, and perftest -R's client, which connects as
        // soon as its server has answered over the exchange connection, met REJ 8.
        let mut services = Vec::with_capacity(bindings.len());
        for b in bindings.iter() {
            let mut st = b.ctx.drv.shared.lock();
            st.nic.cm_mut().listen(b.id, backlog)?;
            services.push(st.nic.cm_mut().listen_service_id(b.id));
        }
        for (b, service) in bindings.iter_mut().zip(services) {
            if let Some(service) = service {
                // Outside the device lock: the host's coordinator may need this process's
                // progress thread meanwhile.
                b.ctx.drv.shared.port.member.listen(service).map_err(|e| {
                    Error::io(format!("registering service {service:#x} with the host (is the port taken?)"), e)
                })?;
                b.service = Some(service);
            }
        }
        Ok(())
    }

    /// `rdma_create_qp` with new send and receive CQs of `cap`'s depths: the QP moves to
    /// INIT with the attributes the connection dictates.
    pub fn create_qp(&self, pd: &Pd, cap: softrdma_engine::QpCap) -> Result<Qp> {
        let b = self.binding_for_qp(pd.context(), "the PD (use the ID's context())", self.inner.qp_type)?;
        let send_cq = b.ctx.create_cq(cap.max_send_wr.max(1), None)?;
        let recv_cq = b.ctx.create_cq(cap.max_recv_wr.max(1), None)?;
        self.create_qp_with(
            pd,
            &QpInit {
                qp_type: self.inner.qp_type,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                srq: None,
                cap,
                sq_sig_all: false,
            },
        )
    }

    /// `rdma_create_qp` with the caller's CQs (and SRQ) in `init`, as librdmacm does when
    /// `ibv_qp_init_attr` names them: one CQ may serve many IDs' QPs. `init.qp_type` must
    /// be the ID's; the QP moves to INIT with the attributes the connection dictates (a UD
    /// QP on to RTS, as librdmacm's).
    pub fn create_qp_with(&self, pd: &Pd, init: &QpInit<'_>) -> Result<Qp> {
        let b = self.binding_for_qp(pd.context(), "the PD (use the ID's context())", init.qp_type)?;
        let qp = pd.create_qp(init)?;
        let parts = Some((pd.clone(), init.send_cq.clone(), init.recv_cq.clone()));
        self.attach_qp(&b, IdQp { qp, parts })
    }

    /// `rdma_create_qp` for an ID of an XRC TGT QP (`IBV_QPT_XRC_RECV`): a TGT QP of domain
    /// `xrcd`, attached to the ID. Its messages go to the XRC SRQs of the domain the peer's
    /// XRC INI QP names (told it in the accept's private data, as `rdma_xserver` does).
    pub fn create_xrc_tgt_qp(&self, xrcd: &crate::Xrcd) -> Result<Qp> {
        let b = self.binding_for_qp(xrcd.context(), "the XRC domain (use the ID's context())", QpType::XrcTgt)?;
        self.attach_qp(&b, IdQp { qp: xrcd.create_tgt_qp()?, parts: None })
    }

    /// The ID's binding, if a QP of `qp_type` made in `ctx` (where `made_in` is) may be
    /// attached to it: the ID was created for that type, and `ctx` is the ID's context.
    fn binding_for_qp(&self, ctx: &Context, made_in: &'static str, qp_type: QpType) -> Result<Binding> {
        let b = self.binding("create_qp (resolve or accept first)")?;
        if !Arc::ptr_eq(&ctx.drv, &b.ctx.drv) {
            return Err(Error::WrongContext(made_in));
        }
        if qp_type != self.inner.qp_type {
            return Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "qp_type {qp_type:?}: this ID was created for {:?} QPs",
                self.inner.qp_type
            ))));
        }
        Ok(b)
    }

    /// Attaches `q` to the ID: the NIC moves it to INIT (a UD QP on to RTS at once, as
    /// librdmacm's `ucma_init_ud_qp`: it has no connection to wait for, and programs post to
    /// it as soon as they have an AH) and through the connection's states after.
    fn attach_qp(&self, b: &Binding, q: IdQp) -> Result<Qp> {
        b.ctx.drv.shared.lock().nic.attach_qp(b.id, Qpn::from_u24_truncating(q.qp.qpn()))?;
        let qp = q.qp.clone();
        *self.inner.qp.lock().unwrap_or_else(PoisonError::into_inner) = Some(q);
        Ok(qp)
    }

    fn id_qp(&self, what: &'static str) -> Result<IdQp> {
        self.inner.qp.lock().unwrap_or_else(PoisonError::into_inner).clone().ok_or(Error::NoQp(what))
    }

    fn param_with_qp(&self, param: &ConnParam) -> ConnParam {
        let mut p = param.clone();
        if let Some(q) = self.inner.qp.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            p.qp_num = q.qp.qpn();
        }
        p
    }

    /// `rdma_connect`: REQ (RC, UC) or SIDR_REQ (UD); `ESTABLISHED` follows, or
    /// `REJECTED` / `UNREACHABLE`. The attached QP's number goes into `param`.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let b = self.binding("connect (resolve_addr and resolve_route first)")?;
        let p = self.param_with_qp(param);
        self.with_cm(&b, |st, now| Ok(st.nic.cm_mut().connect(now, b.id, &p)?))
    }

    /// `rdma_accept`, for the ID of a `CONNECT_REQUEST`: moves the attached QP to RTR and
    /// RTS, then sends the REP (or the SIDR_REP for UD); `ESTABLISHED` follows the RTU.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let b = self.binding("accept")?;
        let p = self.param_with_qp(param);
        self.with_cm(&b, |st, now| Ok(st.nic.accept(now, b.id, &p)?))
    }

    /// `rdma_reject`, for the ID of a `CONNECT_REQUEST`, with private data for the peer.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let b = self.binding("reject")?;
        self.with_cm(&b, |st, now| Ok(st.nic.cm_mut().reject(now, b.id, private_data)?))
    }

    /// `rdma_disconnect`: the attached QP goes to ERR (its work flushes), then a DREQ (or
    /// the DREP to the peer's DREQ); `DISCONNECTED` follows.
    pub fn disconnect(&self) -> Result<()> {
        let b = self.binding("disconnect")?;
        self.with_cm(&b, |st, now| Ok(st.nic.disconnect(now, b.id)?))
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move a QP of this connection to
    /// `target` (INIT, RTR or RTS), for programs that drive a QP of their own rather than
    /// one attached to the ID (UCX).
    pub fn init_qp_attr(&self, target: QpState) -> Result<(softrdma_engine::QpAttr, softrdma_engine::AttrMask)> {
        let b = self.binding("init_qp_attr (resolve or bind the address first)")?;
        self.with_cm(&b, |st, _| Ok(st.nic.cm_mut().qp_attr(b.id, target)?))
    }

    /// `rdma_establish`, active side, when no QP is attached to the ID: after
    /// `CONNECT_RESPONSE` (and moving its own QP to RTS) the program completes the
    /// connection: the RTU goes out, and the passive side gets `ESTABLISHED` (this side
    /// gets no event, as from the kernel).
    pub fn establish(&self) -> Result<()> {
        let b = self.binding("establish")?;
        // The kernel reports no ESTABLISHED to the side that sends the RTU: the NIC does
        // not report the CM's, which follows (as after a CONNECT_RESPONSE with a QP).
        self.with_cm(&b, |st, now| Ok(st.nic.establish(now, b.id)?))
    }

    /// Runs one CM command under the device lock, then sends what it queued.
    fn with_cm<T>(
        &self,
        b: &Binding,
        f: impl FnOnce(&mut State, softrdma_engine::Instant) -> Result<T, Error>,
    ) -> Result<T> {
        let sh = &b.ctx.drv.shared;
        let mut st = sh.lock();
        // ACKs a poll deferred leave before the command can move the QP to ERR.
        sh.app_flush(&mut st);
        let now = sh.now();
        let out = f(&mut st, now);
        sh.after_verb(&mut st);
        out
    }

    /// The device context the ID is bound to (`id->verbs`).
    pub fn context(&self) -> Option<Context> {
        self.inner.bindings().into_iter().next().map(|b| b.ctx)
    }

    /// Every device context the ID is bound to: one, or for a wildcard `bind_addr` one per
    /// device it listens on.
    pub fn contexts(&self) -> Vec<Context> {
        self.inner.bindings().into_iter().map(|b| b.ctx).collect()
    }

    /// `rdma_join_multicast` (`rdma_join_multicast_ex` with `send_only` for
    /// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`): joins multicast group `addr` (an IPv4 or IPv6
    /// multicast address) on the ID's device, as the kernel's rdma_cm joins one on RoCE
    /// (`cma_iboe_join_multicast`): the group's GID is the address (IPv4-mapped for IPv4),
    /// the ID's QP, if it has one and the join is not send-only, is attached to it
    /// ([`Qp::attach_mcast`], as librdmacm's `ucma_process_join` does), and
    /// `MULTICAST_JOIN` follows on the ID's channel with [`CmEvent::ud`]: the address
    /// vector to the group (its GID, the ID's source GID, hop limit 64), remote QPN
    /// 0xFFFFFF and the Q_Key `RDMA_UDP_QKEY`.
    ///
    /// The ID must be UD (port space UDP or IPoIB) and bound to a device (`bind_addr` or
    /// `resolve_addr`); `addr` a multicast address it has not joined yet; EINVAL otherwise.
    pub fn join_multicast(&self, addr: SocketAddr, send_only: bool) -> Result<()> {
        let invalid = |msg: String| Error::Verbs(softrdma_engine::VerbsError::Invalid(msg));
        if self.inner.qp_type != QpType::Ud {
            return Err(invalid(format!(
                "join_multicast on a {:?} ID: only UD IDs (port space UDP or IPoIB) join multicast groups",
                self.inner.qp_type
            )));
        }
        let ip = addr.ip().to_canonical();
        if !ip.is_multicast() {
            return Err(invalid(format!("join_multicast: {ip} is not a multicast address")));
        }
        let b = self.binding("join_multicast (bind_addr or resolve_addr first)")?;
        let local = self.local_addr().ok_or(Error::Unbound("join_multicast (bind_addr or resolve_addr first)"))?;
        let source = Gid::from_ip(local.ip().to_canonical());
        let sgid_index = (0..=u8::MAX)
            .map_while(|i| b.ctx.gid(i).map(|g| (i, g)))
            .find(|&(_, g)| g == source)
            .map(|(i, _)| i)
            .ok_or_else(|| invalid(format!("join_multicast: the ID's address {local} is no GID of its device")))?;
        let mgid = Gid::from_ip(ip);
        let mut joined = self.inner.mcast.lock().unwrap_or_else(PoisonError::into_inner);
        if joined.iter().any(|j| j.addr == addr) {
            return Err(invalid(format!("join_multicast: the ID has joined {addr} already")));
        }
        let qp = if send_only { None } else { self.qp() };
        if let Some(qp) = &qp {
            qp.attach_mcast(mgid)?;
        }
        joined.push(Joined { addr, mgid, attached: qp.is_some() });
        drop(joined);
        let ah =
            softrdma_engine::AddressVector { dgid: mgid, sgid_index, hop_limit: 64, traffic_class: 0, flow_label: 0 };
        let ud = UdParam { remote_qpn: Qpn::MULTICAST.value(), qkey: QKey::RDMA_CM_UDP.0, ah };
        let event = CmEvent {
            id: self.clone(),
            kind: CmEventKind::MulticastJoin,
            status: CmStatus::Ok,
            private_data: Vec::new(),
            param: None,
            listen_id: None,
            ud: Some(ud),
        };
        if let Some(channel) = self.inner.channel.lock().unwrap_or_else(PoisonError::into_inner).upgrade() {
            channel.push(event);
        }
        Ok(())
    }

    /// `rdma_leave_multicast`: leaves group `addr`, which the ID joined: the ID's QP is
    /// detached from it (the device's last member leaves the group on the interface).
    /// `EADDRNOTAVAIL` (an [`Error::Io`] of it) for a group the ID did not join, as
    /// librdmacm's.
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let mut joined = self.inner.mcast.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(at) = joined.iter().position(|j| j.addr == addr) else {
            return Err(Error::io(
                format!("leave_multicast: the ID has not joined {addr}"),
                std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL),
            ));
        };
        let j = joined.remove(at);
        drop(joined);
        if let (true, Some(qp)) = (j.attached, self.qp()) {
            // The QP may have been detached by hand meanwhile: nothing to undo then.
            let _ = qp.detach_mcast(j.mgid);
        }
        Ok(())
    }

    /// The attached QP (`id->qp`).
    pub fn qp(&self) -> Option<Qp> {
        self.inner.qp.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|q| q.qp.clone())
    }

    /// The local address (`rdma_get_local_addr`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let b = self.inner.bindings().into_iter().next()?;
        b.ctx.drv.shared.lock().nic.cm().local_addr(b.id)
    }

    /// The peer's address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        let b = self.inner.bindings().into_iter().next()?;
        b.ctx.drv.shared.lock().nic.cm().peer_addr(b.id)
    }

    /// `rdma_migrate_id`: this ID's future events go to `channel`.
    pub fn migrate(&self, channel: &EventChannel) {
        *self.inner.channel.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&channel.inner);
    }

    /// The type of QP the ID was created for.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// Whether `self` and `other` are the same ID.
    pub fn same(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    // ---- <rdma/rdma_verbs.h> ------------------------------------------------------------

    /// `rdma_reg_msgs`: a region for SENDs and RECVs, in the attached QP's PD.
    pub fn reg_msgs(&self, len: usize) -> Result<Mr> {
        self.id_qp("reg_msgs")?.parts("reg_msgs")?.0.reg_mr(len, Access::LOCAL_WRITE)
    }

    /// `rdma_reg_read`: a region peers may READ.
    pub fn reg_read(&self, len: usize) -> Result<Mr> {
        self.id_qp("reg_read")?.parts("reg_read")?.0.reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_READ)
    }

    /// `rdma_reg_write`: a region peers may WRITE.
    pub fn reg_write(&self, len: usize) -> Result<Mr> {
        self.id_qp("reg_write")?.parts("reg_write")?.0.reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
    }

    /// `rdma_post_recv`: one receive into bytes `range` of `mr`; `wr_id` is the context the
    /// completion returns.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, range: Range<usize>) -> Result<()> {
        self.post_recvv(wr_id, &[mr.sge(range)?])
    }

    /// `rdma_post_recvv`: one receive scattered over `sgl`.
    pub fn post_recvv(&self, wr_id: u64, sgl: &[Sge]) -> Result<()> {
        self.id_qp("post_recv")?.qp.post_recv(&[RecvWr { wr_id, sg_list: sgl }])
    }

    /// `rdma_post_send`: a SEND of bytes `range` of `mr`.
    pub fn post_send(&self, wr_id: u64, mr: &Mr, range: Range<usize>, flags: SendFlags) -> Result<()> {
        self.post(wr_id, SendOp::Send, &[mr.sge(range)?], flags)
    }

    /// `rdma_post_read`: READ `range.len()` bytes at `remote_addr` into bytes `range` of
    /// `mr`.
    pub fn post_read(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        flags: SendFlags,
        remote_addr: u64,
        rkey: RKey,
    ) -> Result<()> {
        self.post(wr_id, SendOp::RdmaRead { remote_addr, rkey }, &[mr.sge(range)?], flags)
    }

    /// `rdma_post_write`: WRITE bytes `range` of `mr` to `remote_addr`.
    pub fn post_write(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        flags: SendFlags,
        remote_addr: u64,
        rkey: RKey,
    ) -> Result<()> {
        self.post(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, &[mr.sge(range)?], flags)
    }

    /// `rdma_post_write` with `IBV_SEND_INLINE` and no MR (seed: "unless inline data is
    /// specified, the local data buffer must have been registered"): `data` is copied now,
    /// up to the QP's `max_inline_data`.
    pub fn post_write_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        flags: SendFlags,
        remote_addr: u64,
        rkey: RKey,
    ) -> Result<()> {
        let sge = [Sge { addr: data.as_ptr() as usize as u64, length: data.len() as u32, lkey: Default::default() }];
        self.post(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, &sge, flags | SendFlags::INLINE)
    }

    /// `rdma_post_ud_send`: a UD SEND of bytes `range` of `mr` to the QP `ud` describes
    /// (from a UD `ESTABLISHED`), through address handle `ah`.
    pub fn post_ud_send(
        &self,
        wr_id: u64,
        mr: &Mr,
        range: Range<usize>,
        flags: SendFlags,
        ah: &crate::Ah,
        ud: &UdParam,
    ) -> Result<()> {
        let q = self.id_qp("post_ud_send")?;
        let sge = [mr.sge(range)?];
        let dest = softrdma_engine::UdDest {
            ah: ah.id(),
            remote_qpn: Qpn::from_u24_truncating(ud.remote_qpn),
            remote_qkey: QKey(ud.qkey),
        };
        q.qp.post_send(&[SendWr { wr_id, op: SendOp::Send, sg_list: &sge, flags, ud: Some(dest), xrc_srqn: None }])
    }

    fn post(&self, wr_id: u64, op: SendOp, sgl: &[Sge], flags: SendFlags) -> Result<()> {
        self.id_qp("post")?.qp.post_send(&[SendWr { wr_id, op, sg_list: sgl, flags, ud: None, xrc_srqn: None }])
    }

    /// `rdma_get_send_comp`: waits up to `timeout` for a completion on the send CQ.
    pub fn get_send_comp(&self, timeout: Duration) -> Result<Wc> {
        self.id_qp("get_send_comp")?.parts("get_send_comp")?.1.wait(timeout)
    }

    /// `rdma_get_recv_comp`: waits up to `timeout` for a completion on the receive CQ.
    pub fn get_recv_comp(&self, timeout: Duration) -> Result<Wc> {
        self.id_qp("get_recv_comp")?.parts("get_recv_comp")?.2.wait(timeout)
    }
}

/// The source address the kernel's routing table picks for `dst` (a link-local one with
/// its scope: that of `dst`, which a link-local destination needs).
fn route_source(dst: SocketAddr) -> Result<SocketAddr> {
    if let SocketAddr::V6(d) = dst {
        if d.ip().is_unicast_link_local() && d.scope_id() == 0 {
            return Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "link-local {} names no interface: set sin6_scope_id to the interface's index (\"{}%eth0\")",
                d.ip(),
                d.ip()
            ))));
        }
    }
    let any: SocketAddr = if dst.is_ipv4() { "0.0.0.0:0".parse() } else { "[::]:0".parse() }.expect("a literal");
    let probe = UdpSocket::bind(any).map_err(|e| Error::io("route lookup", e))?;
    probe.connect(dst).map_err(|e| Error::io(format!("no route to {dst}"), e))?;
    probe.local_addr().map_err(|e| Error::io("route lookup", e))
}

/// A CM ID with an event channel of its own whose calls wait for their outcome: librdmacm's
/// synchronous mode (`rdma_create_ep`, `rdma_get_request`, and `rdma_connect`,
/// `rdma_accept`, `rdma_disconnect` on an ID created without a channel). It dereferences to
/// its [`CmId`] for everything else (`post_send`, `get_recv_comp`, ...).
#[derive(Debug)]
pub struct CmEndpoint {
    id: CmId,
    events: EventChannel,
    pd: Option<Pd>,
    cap: softrdma_engine::QpCap,
    timeout: Duration,
}

impl std::ops::Deref for CmEndpoint {
    type Target = CmId;
    fn deref(&self) -> &CmId {
        &self.id
    }
}

impl CmEndpoint {
    /// `rdma_create_ep` for an active side: resolves `dst` and its route (waiting for both,
    /// up to `timeout` each) and creates a PD and a QP of `cap`.
    pub fn connect_to(
        dst: SocketAddr,
        qp_type: QpType,
        cap: softrdma_engine::QpCap,
        options: ContextOptions,
        timeout: Duration,
    ) -> Result<CmEndpoint> {
        let events = EventChannel::with_options(options)?;
        let ps = if qp_type == QpType::Ud { PortSpace::UDP } else { PortSpace::TCP };
        let id = events.create_id(ps, qp_type)?;
        id.resolve_addr(None, dst)?;
        events.expect(CmEventKind::AddrResolved, timeout)?;
        id.resolve_route()?;
        events.expect(CmEventKind::RouteResolved, timeout)?;
        let pd = id.context().ok_or(Error::Unbound("create_ep"))?.alloc_pd()?;
        id.create_qp(&pd, cap)?;
        Ok(CmEndpoint { id, events, pd: Some(pd), cap, timeout })
    }

    /// `rdma_create_ep` with `RAI_PASSIVE`, then `rdma_listen`: a listener on `addr` whose
    /// [`get_request`](Self::get_request) gives connections with QPs of `cap`.
    pub fn listen_on(
        addr: SocketAddr,
        qp_type: QpType,
        cap: softrdma_engine::QpCap,
        options: ContextOptions,
        backlog: u32,
        timeout: Duration,
    ) -> Result<CmEndpoint> {
        let events = EventChannel::with_options(options)?;
        let ps = if qp_type == QpType::Ud { PortSpace::UDP } else { PortSpace::TCP };
        let id = events.create_id(ps, qp_type)?;
        id.bind_addr(addr)?;
        id.listen(backlog)?;
        Ok(CmEndpoint { id, events, pd: None, cap, timeout })
    }

    /// `rdma_get_request`: waits for the next connection request on this listener and
    /// returns it as an endpoint of its own, with a PD and a QP; then `accept` or `reject`.
    pub fn get_request(&self) -> Result<(CmEndpoint, CmEvent)> {
        let event = self.events.expect(CmEventKind::ConnectRequest, self.timeout)?;
        let events = EventChannel::with_options(self.id.inner.options.clone())?;
        event.id.migrate(&events);
        let pd = event.id.context().ok_or(Error::Unbound("get_request"))?.alloc_pd()?;
        event.id.create_qp(&pd, self.cap)?;
        let ep = CmEndpoint { id: event.id.clone(), events, pd: Some(pd), cap: self.cap, timeout: self.timeout };
        Ok((ep, event))
    }

    /// The endpoint's PD (`id->pd`), for registering memory.
    pub fn pd(&self) -> Option<&Pd> {
        self.pd.as_ref()
    }

    /// `rdma_connect`, waiting for `ESTABLISHED` (an error for `REJECTED`, `UNREACHABLE`,
    /// ...). Returns the event, with the peer's private data.
    pub fn connect(&self, param: &ConnParam) -> Result<CmEvent> {
        self.id.connect(param)?;
        self.events.expect(CmEventKind::Established, self.timeout)
    }

    /// `rdma_accept`, waiting for `ESTABLISHED` (RC, UC). A UD endpoint's accept is its
    /// SIDR_REP, after which nothing comes: it returns `None` at once.
    pub fn accept(&self, param: &ConnParam) -> Result<Option<CmEvent>> {
        self.id.accept(param)?;
        if self.id.inner.qp_type == QpType::Ud {
            return Ok(None);
        }
        self.events.expect(CmEventKind::Established, self.timeout).map(Some)
    }

    /// `rdma_disconnect`, waiting for `DISCONNECTED`.
    pub fn disconnect(&self) -> Result<()> {
        self.id.disconnect()?;
        self.events.expect(CmEventKind::Disconnected, self.timeout).map(drop)
    }

    /// The next event of this endpoint (a peer's `DISCONNECTED`, say), waiting up to the
    /// endpoint's timeout.
    pub fn next_event(&self) -> Result<Option<CmEvent>> {
        self.events.get_cm_event(Some(self.timeout))
    }
}
