//! The NIC: the engine, the connection manager and the GSI QP that joins them, sans-IO.

use core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet};

use softrdma_engine::{
    AsyncEvent, AttrMask, Engine, Event, Instant, IpInfo, Memory, QpAttr, QpState, QpType, Transmit, VerbsError,
};
use softrdma_wire::{BthRepr, DethRepr, Envelope, ExtHeaders, Opcode, PKey, Psn, QKey, Qpn, RocePacket, RoceRepr};

use crate::Cm;
use crate::types::{CmError, CmEvent, CmEventKind, CmId, CmTransmit, ConnParam};

/// A RoCE NIC without I/O: an [`Engine`] (the verbs and the RC/UC/UD transports), a [`Cm`]
/// (rdma_cm over IB CM MADs), and what joins them: the GSI QP (QP1) that carries the CM's
/// MADs in UD packets, and the QPs attached to CM IDs, which the connection drives through
/// their states as librdmacm drives them.
///
/// It has the engine's contract, in the manner of quinn-proto's `Connection`: it never
/// opens a socket, reads a clock, spawns a thread or draws from a global RNG.
///
/// # Methods, by kind
///
/// - **Getters**: [`engine`](Self::engine), [`cm`](Self::cm), [`attached_qp`](Self::attached_qp),
///   [`counters`](Self::counters). [`engine_mut`](Self::engine_mut) and
///   [`cm_mut`](Self::cm_mut) give the verbs and the CM's own commands (`create_id`,
///   `resolve_addr`, `listen`, `connect`, `reject`, ...), which need nothing of the other.
/// - **Inputs**: [`handle_datagram`](Self::handle_datagram) for every UDP datagram that
///   arrives (one per call): MADs for QP1 go to the CM, everything else to the engine;
///   [`handle_timeout`](Self::handle_timeout) once [`poll_timeout`](Self::poll_timeout)'s
///   instant has come.
/// - **Commands that join the two** (librdmacm's, where it moves the ID's QP):
///   [`attach_qp`](Self::attach_qp) (`rdma_create_qp`: INIT, or RTS for UD),
///   [`accept`](Self::accept) (RTR and RTS, then the REP), [`establish`](Self::establish)
///   (the RTU), [`disconnect`](Self::disconnect) (ERR, then the DREQ or DREP),
///   [`destroy_id`](Self::destroy_id), [`destroy_qp`](Self::destroy_qp).
/// - **Outputs**: [`poll_transmit`](Self::poll_transmit) (the engine's datagrams and the
///   CM's MADs, each framed as a UD SEND_ONLY from QP1 to QP1), [`poll_event`](Self::poll_event)
///   (the engine's completion and asynchronous events, and the CM's events with what they
///   do to attached QPs already done), [`poll_timeout`](Self::poll_timeout).
///
/// # Calling contract
///
/// After every input and every command, drain `poll_transmit` and `poll_event`, then re-read
/// `poll_timeout` and arm a timer for that instant. Time only moves forward. A CM event
/// that moves a QP (a `CONNECT_RESPONSE`, `DISCONNECTED`, `REJECTED`) does so when
/// `poll_event` returns it, which may queue datagrams: drain `poll_transmit` again after
/// draining `poll_event`.
///
/// # What the connection does to an attached QP
///
/// As librdmacm does (`ucma_process_conn_resp`, `ucma_modify_qp_err`, `rdma_accept`):
///
/// | when | the QP | the event reported |
/// |---|---|---|
/// | `attach_qp` | INIT (UD: INIT, RTR, RTS) | – |
/// | `CONNECT_RESPONSE` | INIT, RTR, RTS, then the RTU goes out | `ESTABLISHED` (with the REP's data); the CM's own `ESTABLISHED` that follows is not reported again; on failure the QP goes to ERR and `CONNECT_ERROR` is reported |
/// | `accept` | INIT, RTR, RTS before the REP | – |
/// | `DISCONNECTED`, `REJECTED` | ERR | as is |
/// | `disconnect` | ERR before the DREQ or DREP | – |
/// | the engine's `COMM_EST` on the QP | – | the CM establishes a passive connection whose RTU is missing |
///
/// A `CONNECT_RESPONSE` of an ID with no QP attached is reported as it is, and the program
/// completes the connection with [`establish`](Self::establish) (`rdma_establish`).
#[derive(Debug)]
pub struct Nic {
    engine: Engine,
    cm: Cm,
    /// The next PSN of QP1.
    gsi_psn: Psn,
    /// QPs attached to CM IDs, and back.
    attached: BTreeMap<CmId, Qpn>,
    by_qpn: BTreeMap<u32, CmId>,
    /// IDs whose `ESTABLISHED` was reported already (at the `CONNECT_RESPONSE`, or by
    /// `establish`): the CM's own, which follows, is not reported again.
    established_early: BTreeSet<CmId>,
    /// The latest instant an input or command brought, for the CM commands `poll_event`
    /// makes.
    now: Instant,
    counters: NicCounters,
}

/// What the NIC itself counts (the engine and the CM count the rest).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct NicCounters {
    /// Datagrams for QP1 that were not CM MADs in a UD SEND_ONLY with the GSI Q_Key,
    /// dropped.
    pub gsi_dropped: u64,
    /// MADs that could not be framed (no envelope between their addresses), not sent.
    pub gsi_unsendable: u64,
}

/// What [`Nic::poll_event`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicEvent {
    /// An event of the engine: a completion event of an armed CQ, or an asynchronous event.
    Engine(Event),
    /// An event of the CM (`rdma_cm_event`), with what it does to the ID's QP done.
    Cm(CmEvent),
}

/// Why a command that joins the CM and the engine failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NicError {
    /// The CM refused (see [`CmError`]).
    #[error(transparent)]
    Cm(#[from] CmError),
    /// The engine refused to move the QP (see [`VerbsError`]).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

impl Nic {
    /// A NIC of `engine` and `cm`, which should have the same addresses.
    pub fn new(engine: Engine, cm: Cm) -> Self {
        Self {
            engine,
            cm,
            gsi_psn: Psn::default(),
            attached: BTreeMap::new(),
            by_qpn: BTreeMap::new(),
            established_early: BTreeSet::new(),
            now: Instant::ZERO,
            counters: NicCounters::default(),
        }
    }

    // ---------------------------------------------------------------- getters

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, for the verbs. Moving a QP attached to a CM ID by hand is the caller's
    /// business, as with librdmacm.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The connection manager.
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// The connection manager, for its commands.
    pub fn cm_mut(&mut self) -> &mut Cm {
        &mut self.cm
    }

    /// The QP attached to `id`, if any.
    pub fn attached_qp(&self, id: CmId) -> Option<Qpn> {
        self.attached.get(&id).copied()
    }

    /// What the NIC counted.
    pub fn counters(&self) -> NicCounters {
        self.counters
    }

    // ---------------------------------------------------------------- commands

    /// `rdma_create_qp`'s part: QP `qpn` (created in the engine by the caller) belongs to
    /// `id`, and moves to INIT with the CM's attributes; a UD QP on to RTR and RTS at once
    /// (librdmacm's `ucma_init_ud_qp`: it has no connection to wait for). Not attached if
    /// that fails.
    pub fn attach_qp(&mut self, id: CmId, qpn: Qpn) -> Result<(), NicError> {
        let ud = self.cm.qp_type(id) == Some(QpType::Ud);
        let states: &[QpState] = if ud { &[QpState::Init, QpState::Rtr, QpState::Rts] } else { &[QpState::Init] };
        self.move_qp(id, qpn, states)?;
        if let Some(old) = self.attached.insert(id, qpn) {
            self.by_qpn.remove(&old.value());
        }
        self.by_qpn.insert(qpn.value(), id);
        Ok(())
    }

    /// `rdma_accept`, for the ID of a `CONNECT_REQUEST`: moves the attached RC or UC QP to
    /// RTR and RTS, then sends the REP (the SIDR_REP for UD); `ESTABLISHED` follows the RTU.
    pub fn accept(&mut self, now: Instant, id: CmId, param: &ConnParam) -> Result<(), NicError> {
        self.advance(now);
        if let Some(qpn) = self.attached_qp(id) {
            if self.cm.qp_type(id) != Some(QpType::Ud) {
                self.move_qp(id, qpn, &[QpState::Init, QpState::Rtr, QpState::Rts])?;
            }
        }
        Ok(self.cm.accept(now, id, param)?)
    }

    /// `rdma_establish`, active side, with no QP attached: after `CONNECT_RESPONSE` (and
    /// moving its own QP to RTS) the program completes the connection: the RTU goes out.
    /// This side gets no `ESTABLISHED`, as from the kernel.
    pub fn establish(&mut self, now: Instant, id: CmId) -> Result<(), NicError> {
        self.advance(now);
        self.cm.establish(now, id)?;
        self.established_early.insert(id);
        Ok(())
    }

    /// `rdma_disconnect`: the attached QP goes to ERR (its work flushes), then the DREQ (or
    /// the DREP to the peer's DREQ); `DISCONNECTED` follows.
    pub fn disconnect(&mut self, now: Instant, id: CmId) -> Result<(), NicError> {
        self.advance(now);
        if let Some(qpn) = self.attached_qp(id) {
            self.qp_to_error(qpn);
        }
        Ok(self.cm.disconnect(now, id)?)
    }

    /// `rdma_destroy_id`: the CM destroys the ID (sending the REJ, DREQ or DREP its state
    /// needs) and the NIC forgets its QP, which stays as it is (`rdma_destroy_qp` destroys
    /// it: [`destroy_qp`](Self::destroy_qp)).
    pub fn destroy_id(&mut self, now: Instant, id: CmId) -> Result<(), NicError> {
        self.advance(now);
        if let Some(qpn) = self.attached.remove(&id) {
            self.by_qpn.remove(&qpn.value());
        }
        self.established_early.remove(&id);
        Ok(self.cm.destroy_id(now, id)?)
    }

    /// `ibv_destroy_qp` (`rdma_destroy_qp` for an attached one): the QP leaves its ID too.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), NicError> {
        if let Some(id) = self.by_qpn.remove(&qpn.value()) {
            self.attached.remove(&id);
        }
        Ok(self.engine.destroy_qp(qpn)?)
    }

    // ---------------------------------------------------------------- inputs

    /// One received UDP datagram and the envelope it came in: its ICRC checked, then a
    /// MAD for QP1 to the CM, anything else to the engine. Malformed packets, packets with a
    /// bad ICRC and QP1 packets that are not a CM MAD in a UD SEND_ONLY with the GSI Q_Key
    /// are dropped and counted.
    pub fn handle_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        mem: &mut M,
    ) {
        if let Some(envelope) = self.engine.check_icrc(now, envelope, payload) {
            self.handle_checked_datagram(now, &envelope, ip, payload, mem);
        }
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram whose ICRC
    /// `engine_mut().check_icrc` accepted, with the envelope it returned (a runtime that
    /// captures packets writes them in between, with the identification recovered).
    pub fn handle_checked_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        mem: &mut M,
    ) {
        self.advance(now);
        let gsi = RocePacket::new_checked(payload).is_ok_and(|p| p.bth().dest_qp() == Qpn::GSI);
        if !gsi {
            self.engine.handle_checked_datagram(now, envelope, ip, payload, mem);
            return;
        }
        // QP1: a CM MAD in a UD SEND_ONLY with the GSI Q_Key (IBA 13.4.6.1), or nothing.
        let packet = RocePacket::new_unchecked(payload);
        match RoceRepr::parse_ignoring_icrc(&packet) {
            Ok(r) if r.bth.opcode == Opcode::UD_SEND_ONLY && r.ext.deth.is_some_and(|d| d.qkey == QKey::GSI) => {
                self.cm.handle_mad(now, envelope.src_ip(), envelope.dst_ip(), r.payload);
            }
            _ => self.counters.gsi_dropped += 1,
        }
    }

    /// A packet carried by reference from process `origin` of this host: the engine's
    /// [`handle_referenced_datagram`](softrdma_engine::Engine::handle_referenced_datagram)
    /// (the CM's MADs never come so).
    pub fn handle_referenced_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        origin: u32,
        mem: &mut M,
    ) {
        self.advance(now);
        self.engine.handle_referenced_datagram(now, envelope, ip, payload, origin, mem);
    }

    /// Fires the engine's and the CM's timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
    }

    // ---------------------------------------------------------------- outputs

    /// The next datagram to send, written into `buf` (which must hold 4096 + 80 bytes):
    /// the CM's MADs first, each in a UD SEND_ONLY from QP1 to QP1 (Q_Key 0x80010000,
    /// P_Key 0xffff, AckReq set as kernel rxe sends its MADs, QP1's own PSN), then the
    /// engine's packets.
    #[must_use]
    pub fn poll_transmit<M: Memory + ?Sized>(&mut self, now: Instant, mem: &mut M, buf: &mut [u8]) -> Option<Transmit> {
        self.advance(now);
        while let Some(t) = self.cm.poll_transmit() {
            match self.gsi_packet(&t, buf) {
                Some(t) => return Some(t),
                None => self.counters.gsi_unsendable += 1,
            }
        }
        self.engine.poll_transmit(now, mem, buf)
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to be called: the earlier of
    /// the engine's and the CM's timers.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        Instant::earliest(self.engine.poll_timeout(), self.cm.poll_timeout())
    }

    /// The next event: the engine's first (a `COMM_EST` establishes the passive connection
    /// of its QP on the way), then the CM's, with their QP transitions applied (see the
    /// type's documentation).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<NicEvent> {
        if let Some(event) = self.engine.poll_event() {
            if let Event::Async(AsyncEvent::CommEstablished(qpn)) = event {
                // The first packet reached a passive QP whose RTU is still missing.
                if let Some(&id) = self.by_qpn.get(&qpn.value()) {
                    let _ = self.cm.notify(self.now, id);
                }
            }
            return Some(NicEvent::Engine(event));
        }
        while let Some(mut ev) = self.cm.poll_event() {
            let qpn = self.attached_qp(ev.id);
            match (ev.kind, qpn) {
                (CmEventKind::ConnectResponse, Some(qpn)) => {
                    // librdmacm completes the connection itself when a QP is attached and
                    // reports the CONNECT_RESPONSE, with the REP's private data, as
                    // ESTABLISHED (ucma_process_conn_resp).
                    let now = self.now;
                    match self
                        .move_qp(ev.id, qpn, &[QpState::Init, QpState::Rtr, QpState::Rts])
                        .and_then(|()| Ok(self.cm.establish(now, ev.id)?))
                    {
                        Ok(()) => {
                            ev.kind = CmEventKind::Established;
                            self.established_early.insert(ev.id);
                        }
                        Err(_) => {
                            // ucma_process_conn_resp's error path: the QP goes to ERR.
                            self.qp_to_error(qpn);
                            ev.kind = CmEventKind::ConnectError;
                        }
                    }
                }
                (CmEventKind::Established, _) if self.established_early.remove(&ev.id) => continue,
                // librdmacm's rdma_get_cm_event moves the QP of a DISCONNECTED or REJECTED
                // ID to ERR (ucma_modify_qp_err), so that work posted flushes
                // (WR_FLUSH_ERR) and the QP cannot be used by mistake.
                (CmEventKind::Disconnected | CmEventKind::Rejected, Some(qpn)) => self.qp_to_error(qpn),
                _ => {}
            }
            return Some(NicEvent::Cm(ev));
        }
        None
    }

    // ---------------------------------------------------------------- inside

    /// Keeps the latest instant seen. A runtime whose threads read the clock before
    /// taking the device lock may hand in an instant a little older than the last one.
    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Moves `id`'s QP `qpn` through `states` with the CM's attributes. Connecting starts
    /// with INIT→INIT, as librdmacm's `ucma_modify_qp_rtr` does: a QP created before the
    /// exchange began (the active side's) got no remote access flags at INIT, and only now
    /// are they known.
    fn move_qp(&mut self, id: CmId, qpn: Qpn, states: &[QpState]) -> Result<(), NicError> {
        for &s in states {
            if s == QpState::Rtr {
                // Authenticated mode: the keys before the QP can receive (crate::auth).
                if let Some(keys) = self.cm.packet_keys(id) {
                    self.engine.set_qp_keys(qpn, keys)?;
                }
            }
            let (attr, mask) = self.cm.qp_attr(id, s)?;
            self.engine.modify_qp(qpn, &attr, mask)?;
        }
        Ok(())
    }

    fn qp_to_error(&mut self, qpn: Qpn) {
        let attr = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
        let _ = self.engine.modify_qp(qpn, &attr, AttrMask::STATE);
    }

    /// `t` framed as QP1 sends it, into `buf`; `None` if its addresses make no envelope.
    fn gsi_packet(&mut self, t: &CmTransmit, buf: &mut [u8]) -> Option<Transmit> {
        let envelope = self.gsi_envelope(t.src, t.dst)?;
        let psn = self.gsi_psn;
        self.gsi_psn = psn.next();
        let repr = RoceRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                solicited_event: false,
                mig_req: false,
                pkey: PKey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::GSI,
                ack_req: true, // as kernel rxe sends its MADs
                psn,
            },
            ext: ExtHeaders { deth: Some(DethRepr { qkey: QKey::GSI, src_qp: Qpn::GSI }), ..ExtHeaders::default() },
            payload: &t.payload(),
        };
        let len = repr.emit(&envelope, buf).ok()?;
        Some(Transmit::new(envelope, len, Qpn::GSI, false))
    }

    /// The envelope of a MAD: from the device's UDP port to the RoCEv2 port.
    fn gsi_envelope(&self, src: IpAddr, dst: IpAddr) -> Option<Envelope> {
        let config = self.engine.config();
        let sport = config.udp_source_port.unwrap_or(config.udp_port);
        Some(Envelope::rocev2(src, sport, dst)?.with_dst_port(config.udp_port))
    }
}
