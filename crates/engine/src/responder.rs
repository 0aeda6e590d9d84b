//! Receiving: the filters every packet passes (rxe `rxe_recv.c`), then the responder, one
//! check after another as rxe's `rxe_resp.c` orders them: PSN, opcode sequence, resources,
//! length, R_Key; then execution and the response.

use softrdma_wire::datagram::ip_udp_headers_with;
use softrdma_wire::grh::{GRH_LEN, GrhRepr};
use softrdma_wire::icrc::ICRC_LEN;
use softrdma_wire::opcode::{Operation, PayloadRule, Position, Transport};
use softrdma_wire::{BthPacket, BthRepr, DethRepr, ImmDtPacket, ImmDtRepr, RethPacket, RethRepr, bth};
use softrdma_wire::{Envelope, NakCode, Psn, Qpn, RKey, RnrTimer, RocePacket, RoceRepr, Syndrome};

use crate::completer;
use crate::engine::Shared;
use crate::identification::IcrcCheck;
use crate::memory::Memory;
use crate::qp::{InMessage, Qp, RdAtomicResource, RecvWqe, RespJob};
use crate::reference::Payload;
use crate::transmit::packets;
use crate::verbs::{Access, AsyncEvent, Event, NetworkHdr, QpState, QpType, SendOp, Wc, WcOpcode, WcStatus};
use crate::{Engine, Instant};

/// What the IP header said that the envelope does not: needed for the GRH of UD receives.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct IpInfo {
    /// IPv4 TTL / IPv6 hop limit as received.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class as received.
    pub traffic_class: u8,
    /// IPv6 flow label as received.
    pub flow_label: u32,
}

impl Default for IpInfo {
    fn default() -> Self {
        Self { hop_limit: 64, traffic_class: 0, flow_label: 0 }
    }
}

impl Engine {
    /// One received UDP payload and the envelope it came in. Malformed packets, packets with
    /// a bad ICRC and packets for no QP are dropped and counted.
    pub fn handle_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        payload: &[u8],
        mem: &mut M,
    ) {
        self.handle_datagram_with(now, envelope, IpInfo::default(), payload, mem);
    }

    /// [`handle_datagram`](Self::handle_datagram) with the IP header fields a UD receiver
    /// puts in the GRH.
    pub fn handle_datagram_with<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        mem: &mut M,
    ) {
        if let Some(envelope) = self.check_icrc(now, envelope, payload) {
            self.handle_checked_datagram(now, &envelope, ip, payload, mem);
        }
    }

    /// Checks a received datagram's ICRC and returns the envelope it was sent in, or `None`
    /// for a datagram too short to be RoCE or whose ICRC does not match (dropped, counted).
    ///
    /// For IPv4 the envelope's identification is only the first guess: a UDP socket never
    /// shows the one the packet carried, so the engine recovers it from the ICRC and its
    /// memory of the peer ([`crate::identification`]); the envelope returned carries it.
    /// Every path is counted: `rcvd_icrc_exact`, `_predicted`, `_solved`, `_errors`.
    pub fn check_icrc(&mut self, now: Instant, envelope: &Envelope, payload: &[u8]) -> Option<Envelope> {
        self.shared.tick(now);
        let c = &mut self.shared.counters;
        let Ok(packet) = RocePacket::new_checked(payload) else {
            c.rcvd_malformed += 1;
            return None;
        };
        let (verdict, found) = self.shared.identifications.check(now, envelope, &packet);
        match verdict {
            IcrcCheck::Exact => c.rcvd_icrc_exact += 1,
            IcrcCheck::Predicted(_) => c.rcvd_icrc_predicted += 1,
            IcrcCheck::Solved(_) => c.rcvd_icrc_solved += 1,
            IcrcCheck::Bad => {
                c.rcvd_malformed += 1;
                c.rcvd_icrc_errors += 1;
                return None;
            }
        }
        Some(found)
    }

    /// [`handle_datagram_with`](Self::handle_datagram_with) for a datagram whose ICRC
    /// [`check_icrc`](Self::check_icrc) accepted, with the envelope it returned.
    pub fn handle_checked_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        mem: &mut M,
    ) {
        self.handle_packet(now, envelope, ip, payload, None, mem);
    }

    /// [`handle_checked_datagram`](Self::handle_checked_datagram) for a packet carried by
    /// reference from process `origin` of this host ([`crate::reference`]): an RC SEND or
    /// WRITE whose payload lists where its bytes are in `origin`, which the responder
    /// copies from there ([`Memory::pull`]) once its checks pass. Any other packet so
    /// carried is dropped, as malformed.
    pub fn handle_referenced_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        origin: u32,
        mem: &mut M,
    ) {
        self.handle_packet(now, envelope, ip, payload, Some(origin), mem);
    }

    /// Takes an ACK that came beside `packet` from a process of this host
    /// ([`Transmit::ack_beside`](crate::Transmit::ack_beside)), before `packet` itself: as
    /// the ACK packet it stands for would have been taken, by the RC QP `packet` is for,
    /// from the same peer and port, in the same states. Anything else is dropped.
    pub fn handle_ack_beside(&mut self, now: Instant, envelope: &Envelope, packet: &[u8], ack: crate::AckBeside) {
        let sh = &mut self.shared;
        sh.tick(now);
        let Ok(packet) = softrdma_wire::BthPacket::new_checked(packet) else {
            sh.counters.rcvd_malformed += 1;
            return;
        };
        let qp = match self.qps.get_mut(&packet.dest_qp().value()) {
            Some(qp) if sh.is_local(envelope.dst_ip()) && qp.qp_type == QpType::Rc && qp.keys.is_none() => qp,
            _ => {
                sh.counters.rcvd_dropped += 1;
                return;
            }
        };
        if !matches!(ack.aeth.syndrome, Syndrome::Ack { .. }) {
            sh.counters.rcvd_malformed += 1; // a NAK always goes as a packet
            return;
        }
        if !from_the_peer(qp, sh, envelope, ack.psn, true) || !takes_responses(qp, sh) {
            return;
        }
        sh.counters.rcvd_acks_beside += 1;
        completer::handle_ack(qp, sh, now, ack.psn, ack.aeth.syndrome);
        sh.count_window(qp);
        settle(qp, sh);
        self.wake_window_waiters();
    }

    /// Whether taking `ack`, which came beside `packet` ([`Engine::handle_ack_beside`]),
    /// would only retire SENDs and WRITEs that asked for no completion: no work completion,
    /// no event, nothing the application sees but room in its send queue. Such an ACK may
    /// be taken after `packet`, even after the completion `packet` makes is returned to a
    /// poll (as an ACK packet that came a moment later would be): the runtime takes it
    /// then, off the path from the datagram to the application. Any other (one that
    /// completes a signaled request, reaches a READ, an atomic or a local operation, or
    /// comes to a QP not ready to send) must be taken first.
    pub fn ack_beside_is_quiet(&self, packet: &[u8], ack: crate::AckBeside) -> bool {
        let Ok(packet) = softrdma_wire::BthPacket::new_checked(packet) else { return false };
        let Some(qp) = self.qps.get(&packet.dest_qp().value()) else { return false };
        if qp.state != QpState::Rts {
            return false;
        }
        let mut pos = qp.sq.head();
        while pos != qp.sq.tail() {
            let wqe = qp.sq.get(pos);
            if !wqe.started || wqe.last_psn().is_after(ack.psn) {
                return true; // what the ACK covers ends before this one
            }
            let failed = wqe.status.is_some_and(|s| s != WcStatus::Success);
            if wqe.signaled || failed || wqe.op().is_local() || wqe.op().is_read_or_atomic() {
                return false;
            }
            pos += 1;
        }
        true
    }

    fn handle_packet<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        origin: Option<u32>,
        mem: &mut M,
    ) {
        let sh = &mut self.shared;
        sh.tick(now);
        let Ok(packet) = RocePacket::new_checked(payload) else {
            sh.counters.rcvd_malformed += 1;
            return;
        };
        let (opcode, dest_qp) = (packet.bth().opcode(), packet.bth().dest_qp());
        let Some(info) = opcode.info() else {
            sh.counters.rcvd_dropped += 1;
            return;
        };
        if dest_qp == Qpn::MULTICAST && origin.is_none() {
            self.handle_multicast(now, envelope, ip, payload, info, mem);
            self.wake_window_waiters();
            return;
        }
        // rxe_recv.c: the destination must be ours, the QP must exist and be of the
        // opcode's transport, and the P_Key must match the default partition.
        let qp = match self.qps.get_mut(&dest_qp.value()) {
            Some(qp) if sh.is_local(envelope.dst_ip()) && transport_matches(info, qp.qp_type) => qp,
            _ => {
                sh.counters.rcvd_dropped += 1;
                return;
            }
        };
        receive_for(qp, sh, now, envelope, ip, payload, origin, info, mem);
        self.wake_window_waiters();
    }

    /// A packet to QPN 0xFFFFFF (rxe `rxe_rcv_mcast_pkt`): a UD packet to a multicast group
    /// goes, a copy each, to every QP attached to the group (its destination address as a
    /// GID), each taking it as a UD receive of its own (state, Q_Key, a posted receive).
    /// Anything else to that QPN, or to a group no QP is attached to, is dropped.
    fn handle_multicast<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        payload: &[u8],
        info: &softrdma_wire::opcode::OpcodeInfo,
        mem: &mut M,
    ) {
        let group = softrdma_wire::Gid::from_ip(envelope.dst_ip());
        let sh = &mut self.shared;
        if info.transport != Transport::Ud || !group.is_multicast() || !sh.mcast.contains_key(&group) {
            sh.counters.rcvd_dropped += 1;
            return;
        }
        // By index: a delivery never changes the group table.
        for i in 0.. {
            let Some(&qpn) = self.shared.mcast.get(&group).and_then(|qps| qps.get(i)) else { break };
            let sh = &mut self.shared;
            match self.qps.get_mut(&qpn.value()) {
                Some(qp) if transport_matches(info, qp.qp_type) => {
                    receive_for(qp, sh, now, envelope, ip, payload, None, info, mem);
                }
                _ => sh.counters.rcvd_dropped += 1,
            }
        }
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.shared.tick(now);
        while let Some(&(at, qpn)) = self.shared.timers.first() {
            if at > now {
                break;
            }
            self.shared.timers.pop_first();
            let Some(qp) = self.qps.get_mut(&qpn) else { continue };
            qp.timer = None;
            if qp.comp.rnr_wait_until.is_some_and(|t| t <= now) {
                qp.comp.rnr_wait_until = None;
                self.shared.schedule(qp);
            }
            if qp.comp.retransmit_at.is_some_and(|t| t <= now) {
                completer::handle_retransmit_timeout(qp, &mut self.shared, now);
                self.shared.count_window(qp);
            }
            if let Some(cc) = qp.cc.as_deref_mut() {
                cc.rp.handle_timeout(now);
                if cc.paced_until.is_some_and(|t| t <= now) {
                    cc.paced_until = None;
                    self.shared.schedule(qp);
                }
            }
            self.shared.update_timer(qp);
        }
        self.wake_window_waiters();
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.shared.timers.first().map(|&(at, _)| at)
    }
}

/// What a packet for QP `qp` (its transport checked) does there: every check after the
/// lookup (authentication, P_Key, the peer, congestion), then the responder or completer.
#[allow(clippy::too_many_arguments)]
fn receive_for<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    now: Instant,
    envelope: &Envelope,
    ip: IpInfo,
    payload: &[u8],
    origin: Option<u32>,
    info: &softrdma_wire::opcode::OpcodeInfo,
    mem: &mut M,
) {
    if one_packet_request_received(qp, sh, now, envelope, ip, payload, origin, info, mem)
        || continuing_write_received(qp, sh, now, envelope, ip, payload, origin, info, mem)
    {
        return;
    }
    // Only an RC QP's SENDs, WRITEs and READs go by reference (crate::reference).
    let by_reference_kind = matches!(
        info.operation,
        Operation::Send
            | Operation::SendWithImm
            | Operation::SendWithInvalidate
            | Operation::RdmaWrite
            | Operation::RdmaWriteWithImm
            | Operation::RdmaReadRequest
            | Operation::RdmaReadResponse
    );
    if origin.is_some() && !(qp.qp_type == QpType::Rc && qp.keys.is_none() && by_reference_kind) {
        sh.counters.rcvd_malformed += 1;
        return;
    }
    // An authenticated QP acts on nothing whose tag does not verify (crate::auth).
    let payload = match &qp.keys {
        Some(sealer) => match sealer.open(payload) {
            Some(opened) => opened,
            None => {
                sh.counters.rcvd_auth_failures += 1;
                return;
            }
        },
        None => payload,
    };
    // Looked at where it was parsed: moving it out of the `Result` was a copy of 160 bytes.
    let parsed = RoceRepr::parse_ignoring_icrc(&RocePacket::new_unchecked(payload));
    let repr = match &parsed {
        Ok(r) => r,
        Err(_) => {
            sh.counters.rcvd_malformed += 1;
            return;
        }
    };
    if repr.bth.pkey.0 & 0x7fff != 0x7fff {
        sh.counters.rcvd_dropped += 1;
        return;
    }
    if qp.qp_type.is_connected() && !from_the_peer(qp, sh, envelope, repr.bth.psn, info.is_response()) {
        return;
    }
    if let Some(config) = sh.config.congestion {
        let cc = qp.cc.get_or_insert_with(|| Box::new(crate::congestion::QpCongestion::new(config)));
        if info.operation == Operation::Cnp {
            sh.counters.cnps_rcvd += 1;
            cc.rp.on_cnp(now);
            sh.update_timer(qp);
            return;
        }
        congestion_seen(qp, sh, now, envelope, ip, repr.ext.deth);
    } else if info.operation == Operation::Cnp {
        sh.counters.rcvd_dropped += 1;
        return;
    }
    let data = match origin {
        None => Payload::Bytes(repr.payload),
        Some(origin) => match Payload::reference(origin, repr.payload) {
            Some(data) => data,
            None => {
                sh.counters.rcvd_malformed += 1;
                return;
            }
        },
    };
    if info.is_response() {
        if !takes_responses(qp, sh) {
            return;
        }
        complete_response(qp, sh, mem, now, repr, data, info.operation, info.position);
        sh.count_window(qp);
    } else {
        // The responder works from RTR on (IBA 10.3.1.3).
        if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            sh.counters.rcvd_dropped += 1;
            return;
        }
        if qp.qp_type != QpType::Ud {
            sh.counters.rcvd_packets += 1; // UD counts after its Q_Key check
        }
        if qp.state == QpState::Rtr && !qp.resp.established {
            qp.resp.established = true;
            sh.events.push_back(Event::Async(AsyncEvent::CommEstablished(qp.qpn)));
        }
        match qp.qp_type {
            QpType::Rc | QpType::XrcTgt => rc_request(qp, sh, mem, repr, data, info.operation, info.position),
            QpType::Uc => uc_request(qp, sh, mem, repr, info.operation, info.position),
            QpType::Ud | QpType::Gsi => ud_request(qp, sh, mem, envelope, ip, repr),
            QpType::XrcIni => sh.counters.rcvd_dropped += 1, // transport_matches keeps requests away
        }
    }
    settle(qp, sh);
}

/// [`receive_for`] for its most common case, the next request of an RC QP that is a whole
/// message of one packet: a SEND or RDMA WRITE ONLY, with or without immediate, from the
/// peer, in sequence, for a QP that is in no message and has its own receive queue. The
/// same checks in the same order as the general path (the parse, the P_Key, the peer, the
/// PSN, the R_Key or the receive), but only this case's, and the same outcome, without the
/// general parse and dispatch. Returns whether it took the packet: `false` (not that case,
/// or a check failed) changes nothing, and the general path takes the packet, and tells
/// what is wrong with it.
#[allow(clippy::too_many_arguments)]
#[inline]
fn one_packet_request_received<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    now: Instant,
    envelope: &Envelope,
    ip: IpInfo,
    packet: &[u8],
    origin: Option<u32>,
    info: &softrdma_wire::opcode::OpcodeInfo,
    mem: &mut M,
) -> bool {
    let (write, imm) = match (info.operation, info.position) {
        (Operation::Send, Position::Only) => (false, false),
        (Operation::SendWithImm, Position::Only) => (false, true),
        (Operation::RdmaWrite, Position::Only) => (true, false),
        (Operation::RdmaWriteWithImm, Position::Only) => (true, true),
        _ => return false,
    };
    if !short_path_open(qp, sh, origin) || qp.srq.is_some() || !matches!(qp.resp.current, InMessage::None) {
        return false;
    }
    // And this opcode's headers.
    let header_len = info.header_len();
    let Some((bth, payload)) = short_path_parse(packet, info) else { return false };
    let reth = match write {
        true => match RethRepr::parse(&RethPacket::new_unchecked(&packet[bth::HEADER_LEN..])) {
            Ok(reth) => Some(reth),
            Err(_) => return false,
        },
        false => None,
    };
    let imm_data = match imm {
        true => match ImmDtRepr::parse(&ImmDtPacket::new_unchecked(&packet[header_len - 4..])) {
            Ok(imm) => Some(imm.0),
            Err(_) => return false,
        },
        false => None,
    };
    // The P_Key, the peer (whose port the QP knows already), the sequence.
    let psn = bth.psn;
    let from_peer = is_the_peer(qp, envelope) && qp.peer_port == Some(envelope.src_port());
    let plen = payload.len() as u32;
    if bth.pkey.0 & 0x7fff != 0x7fff || !from_peer || psn != qp.resp.psn || plen > qp.mtu() {
        return false;
    }
    // Where it goes: a WRITE's R_Key, checked for the whole message; a receive.
    let at = match reth {
        Some(reth) => {
            if reth.dma_length != plen {
                return false;
            }
            match remote_access(qp, sh, reth.rkey, reth.virtual_address, u64::from(plen), Access::REMOTE_WRITE) {
                Ok(at) => at,
                Err(_) => return false,
            }
        }
        None => 0,
    };
    if (!write || imm) && qp.rq.is_empty() {
        return false; // RNR NAK
    }

    short_path_taken(qp, sh, now, envelope, ip);
    let data = Payload::Bytes(payload);
    let wc = |qp: &Qp, wr_id, opcode, byte_len| recv_wc_of(qp, wr_id, opcode, byte_len, imm_data, bth.solicited_event);
    // The receive it takes (a WRITE without immediate takes none), found above.
    let wqe = if write && !imm { None } else { Some(sh.take_recv(qp).expect("a receive was found above").0) };
    let done = if write {
        if plen > 0 && data.copy_to(mem, at, 0, plen).is_err() {
            Err(NakCode::RemoteAccessError) // as `execute`: an R_Key violation
        } else {
            qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
            if let Some(wqe) = wqe {
                sh.push_cqe(qp.recv_cq, wc(qp, wqe.wr_id, WcOpcode::RecvRdmaWithImm, plen));
                sh.recycle(wqe);
            }
            Ok(())
        }
    } else {
        let wqe = wqe.expect("a SEND takes a receive");
        match scatter_recv(sh, qp.pd, mem, &wqe, 0, data) {
            Ok(()) => {
                sh.push_cqe(qp.recv_cq, wc(qp, wqe.wr_id, WcOpcode::Recv, plen));
                sh.recycle(wqe);
                qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
                Ok(())
            }
            Err(status) => {
                let error = Wc { status, ..wc(qp, wqe.wr_id, WcOpcode::Recv, 0) };
                sh.push_cqe(qp.recv_cq, error);
                Err(scatter_refusal(status))
            }
        }
    };
    match done {
        Ok(()) => {
            qp.resp.psn = psn.next();
            if bth.ack_req {
                queue_ack(qp, psn, Syndrome::ACK_NO_CREDITS);
            }
        }
        Err(code) => nak_fatal(qp, sh, psn, code),
    }
    settle(qp, sh);
    true
}

/// [`receive_for`] for the packets after the first of an RDMA WRITE without immediate: its
/// MIDDLE and LAST, whose only header is the BTH, in sequence, from the peer, to an RC QP
/// in that message. The same checks in the same order as the general path (the parse, the
/// P_Key, the peer, the PSN, the lengths the message has left, the R_Key again for this
/// packet's bytes) and the same outcome, without the general parse and dispatch. Returns
/// whether it took the packet: `false` (not that case, or a check failed) changes nothing,
/// and the general path takes the packet, and tells what is wrong with it.
#[allow(clippy::too_many_arguments)]
#[inline]
fn continuing_write_received<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    now: Instant,
    envelope: &Envelope,
    ip: IpInfo,
    packet: &[u8],
    origin: Option<u32>,
    info: &softrdma_wire::opcode::OpcodeInfo,
    mem: &mut M,
) -> bool {
    let last = match (info.operation, info.position) {
        (Operation::RdmaWrite, Position::Middle) => false,
        (Operation::RdmaWrite, Position::Last) => true,
        _ => return false,
    };
    let InMessage::Write { va, remaining, length, rkey } = qp.resp.current else { return false };
    if !short_path_open(qp, sh, origin) {
        return false;
    }
    // Its only header is the BTH.
    let Some((bth, payload)) = short_path_parse(packet, info) else { return false };
    // The P_Key, the peer (whose port the QP knows already), the sequence; then `execute`'s
    // lengths: a MIDDLE carries an MTU and leaves some of the message, a LAST the rest.
    let (psn, plen) = (bth.psn, payload.len() as u32);
    let from_peer = is_the_peer(qp, envelope) && qp.peer_port == Some(envelope.src_port());
    let lengths = if last { plen == remaining && plen <= qp.mtu() } else { plen == qp.mtu() && plen < remaining };
    if bth.pkey.0 & 0x7fff != 0x7fff || !from_peer || psn != qp.resp.psn || !lengths {
        return false;
    }
    // Every packet is checked against the R_Key again, as `execute` checks it.
    let Ok(at) = sh.resolve_rkey(qp.pd, qp.qpn, rkey, va, u64::from(plen), Access::REMOTE_WRITE) else {
        return false;
    };

    short_path_taken(qp, sh, now, envelope, ip);
    if plen > 0 && Payload::Bytes(payload).copy_to(mem, at, 0, plen).is_err() {
        // As `execute`: an R_Key violation, the message left as it was.
        nak_fatal(qp, sh, psn, NakCode::RemoteAccessError);
    } else {
        qp.resp.current = if last {
            qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
            InMessage::None
        } else {
            InMessage::Write { va: va + u64::from(plen), remaining: remaining - plen, length, rkey }
        };
        qp.resp.psn = psn.next();
        if bth.ack_req {
            queue_ack(qp, psn, Syndrome::ACK_NO_CREDITS);
        }
    }
    settle(qp, sh);
    true
}

/// Whether the responder's short paths may take a packet for `qp` at all: they are on, the
/// packet came by value, and `qp` is an RC QP that seals nothing, working (RTS, SQD, SQE,
/// or RTR once established: the first packet raises COMM_EST, which the general path does).
#[inline(always)]
fn short_path_open(qp: &Qp, sh: &Shared, origin: Option<u32>) -> bool {
    let working = match qp.state {
        QpState::Rts | QpState::Sqd | QpState::Sqe => true,
        QpState::Rtr => qp.resp.established,
        _ => false,
    };
    sh.config.one_packet_short_path && working && origin.is_none() && qp.keys.is_none() && qp.qp_type == QpType::Rc
}

/// `packet`'s BTH and payload as `RoceRepr::parse_ignoring_icrc` takes them (lengths, pad,
/// TVer, the opcode's payload rule), for an opcode (`info`) whose other headers the caller
/// parses, if any.
#[inline(always)]
fn short_path_parse<'a>(packet: &'a [u8], info: &softrdma_wire::opcode::OpcodeInfo) -> Option<(BthRepr, &'a [u8])> {
    let len = packet.len();
    let header_len = info.header_len();
    let view = BthPacket::new_unchecked(packet);
    let pad = usize::from(view.pad_count());
    if len < header_len + ICRC_LEN + pad || len % 4 != 0 {
        return None;
    }
    let bth = BthRepr::parse(&view).ok()?;
    let payload = &packet[header_len..len - ICRC_LEN - pad];
    if !info.payload.allows(payload.len()) || (info.payload == PayloadRule::PathMtu && pad != 0) {
        return None;
    }
    Some((bth, payload))
}

/// A packet a short path took: from here on as the general path, errors included.
/// Congestion control sees it, it is counted, and the QP may NAK again.
#[inline(always)]
fn short_path_taken(qp: &mut Qp, sh: &mut Shared, now: Instant, envelope: &Envelope, ip: IpInfo) {
    if let Some(config) = sh.config.congestion {
        qp.cc.get_or_insert_with(|| Box::new(crate::congestion::QpCongestion::new(config)));
        congestion_seen(qp, sh, now, envelope, ip, None);
    }
    sh.counters.rcvd_packets += 1;
    sh.counters.rcvd_by_short_path += 1;
    qp.resp.nak_sent = false;
}

/// What a packet taken by `qp` leaves to do: send what the QP owes, at its next chance, and
/// keep its timer.
fn settle(qp: &mut Qp, sh: &mut Shared) {
    if !qp.resp.out.is_empty() {
        sh.schedule(qp);
    }
    sh.update_timer(qp);
}

/// Whether a packet in `envelope` (its PSN `psn`, a response or not) may act on connected
/// QP `qp`: only the connected peer may talk to it (rxe `check_addr`), and from the one
/// UDP source port it uses (see `peer_port`), which the first packet that proves it is the
/// peer teaches. Counts what it refuses.
fn from_the_peer(qp: &mut Qp, sh: &mut Shared, envelope: &Envelope, psn: Psn, response: bool) -> bool {
    if !is_the_peer(qp, envelope) {
        sh.counters.rcvd_dropped += 1;
        return false;
    }
    match qp.peer_port {
        Some(port) if port != envelope.src_port() => {
            sh.counters.rcvd_wrong_source += 1;
            return false;
        }
        None if proves_peer(qp, psn, response) => qp.peer_port = Some(envelope.src_port()),
        _ => {}
    }
    true
}

/// Whether `envelope` comes from connected QP `qp`'s peer to the address it connected from
/// (its UDP port aside: [`from_the_peer`]). Always inlined: a call of its own cost both
/// paths 18 instructions a packet (callgrind).
#[inline(always)]
fn is_the_peer(qp: &Qp, envelope: &Envelope) -> bool {
    qp.peer_ip() == Some(envelope.src_ip()) && qp.envelope.is_some_and(|e| e.src_ip() == envelope.dst_ip())
}

/// Whether `qp` takes a response now (the requester works in RTS and SQD): counts it
/// received, or dropped.
fn takes_responses(qp: &Qp, sh: &mut Shared) -> bool {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        sh.counters.rcvd_dropped += 1;
        return false;
    }
    sh.counters.rcvd_packets += 1;
    true
}

/// Whether a packet of this opcode is for a QP of `qp_type`: of its transport, and for XRC
/// of its half (requests to the TGT QP, responses to the INI QP).
fn transport_matches(info: &softrdma_wire::opcode::OpcodeInfo, qp_type: QpType) -> bool {
    match (info.transport, qp_type) {
        (Transport::Xrc, QpType::XrcTgt) => !info.is_response(),
        (Transport::Xrc, QpType::XrcIni) => info.is_response(),
        (t, qp_type) => matches!(
            (t, qp_type),
            (Transport::Rc, QpType::Rc)
                | (Transport::Uc, QpType::Uc)
                | (Transport::Ud, QpType::Ud | QpType::Gsi)
                | (Transport::Cnp, QpType::Rc | QpType::Uc | QpType::Ud | QpType::XrcIni | QpType::XrcTgt)
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn complete_response<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    repr: &RoceRepr<'_>,
    data: Payload<'_>,
    operation: Operation,
    position: Position,
) {
    let psn = repr.bth.psn;
    match operation {
        Operation::Acknowledge => {
            if let Some(aeth) = repr.ext.aeth {
                completer::handle_ack(qp, sh, now, psn, aeth.syndrome);
            }
        }
        Operation::RdmaReadResponse => {
            completer::handle_read_response(qp, sh, mem, now, psn, position, data);
        }
        Operation::AtomicAcknowledge => {
            if let Some(a) = repr.ext.atomic_ack_eth {
                completer::handle_atomic_ack(qp, sh, mem, now, psn, a.original_data);
            }
        }
        _ => {}
    }
}

/// Queues an ACK or NAK; consecutive ACKs coalesce into the newest (they are cumulative).
fn queue_ack(qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
    if let Some(RespJob::Ack { syndrome: Syndrome::Ack { .. }, .. }) = qp.resp.out.back() {
        if matches!(syndrome, Syndrome::Ack { .. }) {
            qp.resp.out.pop_back();
        }
    }
    qp.resp.out.push_back(RespJob::Ack { psn, syndrome });
}

/// A fatal responder error: NAK it, and the QP goes to the error state (IBA 9.9.2).
fn nak_fatal(qp: &mut Qp, sh: &mut Shared, psn: Psn, code: NakCode) {
    tracing::warn!(
        target: "softrdma::qp",
        qpn = qp.qpn.value(),
        psn = psn.value(),
        peer = ?qp.peer_ip(),
        "QP {} {} → ERR: the peer's request at PSN {} refused, NAK {code:?}",
        qp.qpn,
        qp.state,
        psn.value(),
    );
    sh.counters.naks_sent += 1;
    qp.counters.naks_sent += 1;
    count_refusal(sh, code);
    let event = match code {
        NakCode::RemoteAccessError => AsyncEvent::QpAccessError(qp.qpn),
        NakCode::InvalidRequest => AsyncEvent::QpRequestError(qp.qpn),
        _ => AsyncEvent::QpFatal(qp.qpn),
    };
    sh.events.push_back(Event::Async(event));
    completer::enter_error(qp, sh, None);
    // The NAK still goes out: the error state sends what the responder owes, and
    // enter_error left it nothing else.
    qp.resp.out.push_back(RespJob::Ack { psn, syndrome: Syndrome::Nak(code) });
}

/// Counts a request refused with `code`, whether an RC NAK says so or UC drops it.
fn count_refusal(sh: &mut Shared, code: NakCode) {
    let counter = match code {
        NakCode::RemoteAccessError => &mut sh.counters.resp_remote_access_errors,
        NakCode::InvalidRequest => &mut sh.counters.resp_invalid_requests,
        _ => &mut sh.counters.resp_operational_errors,
    };
    *counter += 1;
}

/// Writes `data` at byte `offset` of a receive WQE's buffers, checking each SGE's key.
fn scatter_recv<M: Memory + ?Sized>(
    sh: &Shared,
    pd: crate::verbs::PdId,
    mem: &mut M,
    wqe: &RecvWqe,
    offset: u32,
    data: Payload<'_>,
) -> Result<(), WcStatus> {
    if u64::from(offset) + u64::from(data.len()) > u64::from(wqe.length) {
        return Err(WcStatus::LocLenErr);
    }
    // The length check above keeps `data` inside the buffers, so `LocLenErr` comes only
    // from there.
    crate::sgl::scatter(sh, pd, mem, &wqe.sges, offset, data)
}

fn recv_wc(qp: &Qp, wr_id: u64, opcode: WcOpcode, byte_len: u32, repr: &RoceRepr<'_>) -> Wc {
    recv_wc_of(qp, wr_id, opcode, byte_len, repr.ext.imm_dt.map(|i| i.0), repr.bth.solicited_event)
}

/// [`recv_wc`] from the two things it takes from the packet: its immediate data and its
/// solicited-event bit.
#[inline]
fn recv_wc_of(qp: &Qp, wr_id: u64, opcode: WcOpcode, byte_len: u32, imm_data: Option<[u8; 4]>, solicited: bool) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len,
        imm_data,
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: Qpn::from_u24_truncating(qp.attr.dest_qp_num),
        grh: None,
        solicited,
        completed_at: None,
    }
}

/// The NAK for a SEND whose receive refused its data with `status`: more data than the
/// receive holds is the requester's error; a bad local key, the responder's.
fn scatter_refusal(status: WcStatus) -> NakCode {
    if status == WcStatus::LocLenErr { NakCode::InvalidRequest } else { NakCode::RemoteOperationalError }
}

/// Whether `operation` may follow what the responder is in the middle of (IBA 9.7.5.1.4
/// "opcode sequence"): a FIRST or ONLY when idle, a MIDDLE or LAST of the same kind
/// otherwise.
fn sequence_ok(current: &InMessage, operation: Operation, position: Position) -> bool {
    match current {
        InMessage::None | InMessage::Dropping => position.starts_message(),
        InMessage::Send { .. } => {
            !position.starts_message()
                && matches!(operation, Operation::Send | Operation::SendWithImm | Operation::SendWithInvalidate)
        }
        InMessage::Write { .. } => {
            !position.starts_message() && matches!(operation, Operation::RdmaWrite | Operation::RdmaWriteWithImm)
        }
    }
}

/// What went wrong with a request, and what the requester is told.
enum Refusal {
    /// No receive WQE: RNR NAK, nothing consumed, the PSN does not advance.
    NotReady,
    /// A NAK that moves the QP to the error state.
    Fatal(NakCode),
}

/// Executes one in-sequence request packet of an RC or UC QP. On success returns how many
/// PSNs the request occupies (a READ: one per response packet), by which the caller
/// advances the expected PSN.
#[allow(clippy::too_many_arguments)]
fn execute<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    repr: &RoceRepr<'_>,
    data: Payload<'_>,
    operation: Operation,
    position: Position,
) -> Result<u32, Refusal> {
    let psn = repr.bth.psn;
    let mtu = qp.mtu();
    let len = data.len();
    // What a FIRST or MIDDLE packet carries, or stands for (crate::reference).
    let unit = crate::reference::unit(data.by_reference(), mtu);
    let mut psns = 1;
    if !sequence_ok(&qp.resp.current, operation, position) {
        return Err(Refusal::Fatal(NakCode::InvalidRequest));
    }
    if matches!(position, Position::First | Position::Middle) && len != unit {
        return Err(Refusal::Fatal(NakCode::InvalidRequest)); // FIRST and MIDDLE carry one MTU
    }
    if len > unit {
        return Err(Refusal::Fatal(NakCode::InvalidRequest));
    }
    match operation {
        Operation::Send | Operation::SendWithImm | Operation::SendWithInvalidate => {
            if position.starts_message() {
                let (wqe, from_srq) = sh.take_recv(qp).ok_or(Refusal::NotReady)?;
                qp.resp.current = InMessage::Send { wqe, from_srq, offset: 0 };
            }
            let pd = qp.pd;
            let InMessage::Send { wqe, offset, .. } = &mut qp.resp.current else { unreachable!("checked above") };
            if let Err(status) = scatter_recv(sh, pd, mem, wqe, *offset, data) {
                let code = scatter_refusal(status);
                if qp.qp_type == QpType::Uc {
                    // UC drops the message silently; `drop_message` gives the WQE back.
                    return Err(Refusal::Fatal(code));
                }
                let wr_id = wqe.wr_id;
                let wc = Wc { status, byte_len: 0, ..recv_wc(qp, wr_id, WcOpcode::Recv, 0, repr) };
                sh.push_cqe(qp.recv_cq, wc);
                qp.resp.current = InMessage::None;
                return Err(Refusal::Fatal(code));
            }
            *offset += len;
            if position.ends_message() {
                let InMessage::Send { wqe, offset, .. } = core::mem::take(&mut qp.resp.current) else { unreachable!() };
                let mut wc = recv_wc(qp, wqe.wr_id, WcOpcode::Recv, offset, repr);
                if operation == Operation::SendWithInvalidate {
                    // The IETH's R_Key is invalidated once the message is placed (rxe
                    // `execute`). If it cannot be (IBA class J), the receive completes in
                    // error and the QP fails; rxe also says REM_INV_REQ_ERR there, and this
                    // NAKs Invalid Request where rxe's ACK would tell the requester nothing.
                    let invalidated = repr.ext.ieth.map(|i| i.rkey);
                    match invalidated.map(|rkey| sh.invalidate(qp.pd, qp.qpn, rkey.0, true)) {
                        Some(Ok(())) => wc.invalidated_rkey = invalidated,
                        _ => {
                            let wc = Wc { status: WcStatus::RemInvReqErr, byte_len: 0, ..wc };
                            sh.push_cqe(qp.recv_cq, wc);
                            sh.recycle(wqe);
                            return Err(Refusal::Fatal(NakCode::InvalidRequest));
                        }
                    }
                }
                sh.push_cqe(qp.recv_cq, wc);
                sh.recycle(wqe);
                qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
            }
        }
        Operation::RdmaWrite | Operation::RdmaWriteWithImm => {
            // Where a FIRST or ONLY packet's message lands, its R_Key checked for all of it.
            let mut message_at = None;
            if position.starts_message() {
                let reth = repr.ext.reth.ok_or(Refusal::Fatal(NakCode::InvalidRequest))?;
                let length = u64::from(reth.dma_length);
                message_at =
                    Some(remote_access(qp, sh, reth.rkey, reth.virtual_address, length, Access::REMOTE_WRITE)?);
                qp.resp.current = InMessage::Write {
                    va: reth.virtual_address,
                    remaining: reth.dma_length,
                    length: reth.dma_length,
                    rkey: reth.rkey.0,
                };
            }
            let InMessage::Write { va, remaining, length, rkey } = qp.resp.current else {
                unreachable!("checked above")
            };
            let total_ok = if position.ends_message() { len == remaining } else { len < remaining };
            if !total_ok {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // the RETH length is the message's
            }
            // A WRITE with immediate consumes a receive at its last packet: check first, so
            // that an RNR NAK leaves this packet unexecuted.
            let recv = if operation == Operation::RdmaWriteWithImm && position.ends_message() {
                Some(sh.take_recv(qp).ok_or(Refusal::NotReady)?)
            } else {
                None
            };
            // Every packet is checked against the R_Key again: once dereg_mr returns (or a
            // window is invalidated or deallocated), no packet still in flight reaches the
            // region.
            let local = match (len, message_at) {
                (0, _) => Ok(va),
                // An ONLY packet is its whole message, checked just now: not twice.
                (_, Some(at)) if position.ends_message() => Ok(at),
                _ => sh.resolve_rkey(qp.pd, qp.qpn, rkey, va, u64::from(len), Access::REMOTE_WRITE),
            };
            let Ok(local) = local else {
                if let Some((wqe, from_srq)) = recv {
                    sh.give_back_recv(qp, wqe, from_srq);
                }
                return Err(Refusal::Fatal(NakCode::RemoteAccessError));
            };
            if len > 0 && data.copy_to(mem, local, 0, len).is_err() {
                // Pages of the region that do not take the write (a region on demand): an
                // R_Key violation, as rxe's failed copy is (RESPST_ERR_RKEY_VIOLATION).
                return Err(Refusal::Fatal(NakCode::RemoteAccessError));
            }
            qp.resp.current = InMessage::Write { va: va + u64::from(len), remaining: remaining - len, length, rkey };
            if position.ends_message() {
                qp.resp.current = InMessage::None;
                qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
                if let Some((wqe, _)) = recv {
                    // The message's length, which only its first packet's RETH carried.
                    let wc = recv_wc(qp, wqe.wr_id, WcOpcode::RecvRdmaWithImm, length, repr);
                    sh.push_cqe(qp.recv_cq, wc);
                    sh.recycle(wqe);
                }
            }
        }
        Operation::RdmaReadRequest => {
            let reth = repr.ext.reth.ok_or(Refusal::Fatal(NakCode::InvalidRequest))?;
            if qp.attr.max_dest_rd_atomic == 0 {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // no responder resources
            }
            remote_access(qp, sh, reth.rkey, reth.virtual_address, u64::from(reth.dma_length), Access::REMOTE_READ)?;
            // A READ asked for by reference is answered by reference, a segment per
            // response (crate::reference): the requester copies from here.
            let by_reference = data.by_reference();
            let npkts = packets(SendOp::RdmaRead { remote_addr: 0, rkey: reth.rkey }, reth.dma_length, unit);
            psns = npkts;
            remember(
                qp,
                RdAtomicResource {
                    first_psn: psn,
                    npkts,
                    va: reth.virtual_address,
                    rkey: reth.rkey.0,
                    pd: qp.pd,
                    length: reth.dma_length,
                    atomic_original: None,
                    by_reference,
                },
            );
            qp.resp.out.push_back(RespJob::Read {
                psn,
                va: reth.virtual_address,
                remaining: reth.dma_length,
                first: true,
                rkey: reth.rkey.0,
                pd: qp.pd,
                by_reference,
            });
            qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
        }
        Operation::AtomicWrite => {
            let reth = repr.ext.reth.ok_or(Refusal::Fatal(NakCode::InvalidRequest))?;
            let va = reth.virtual_address;
            let value: [u8; 8] = repr.payload.try_into().map_err(|_| Refusal::Fatal(NakCode::InvalidRequest))?;
            if qp.attr.max_dest_rd_atomic == 0 || va % 8 != 0 || reth.dma_length != 8 {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // 8 bytes, 8-byte aligned
            }
            let local = remote_access(qp, sh, reth.rkey, va, 8, Access::REMOTE_WRITE)?;
            if local % 8 != 0 {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // a zero-based window's start
            }
            mem.atomic_write(local, value).map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError))?;
            answer_as_empty_read(qp, psn, va, reth.rkey.0);
        }
        Operation::Flush => {
            // rxe's check_qp_attr_access, check_rkey and process_flush: the QP and the region
            // must allow each placement asked for; a range is checked as any, a whole-region
            // FLUSH covers the region (or window) the key names, whatever the RETH's address.
            let (Some(reth), Some(feth)) = (repr.ext.reth, repr.ext.feth) else {
                return Err(Refusal::Fatal(NakCode::InvalidRequest));
            };
            let placement = feth.placement_type;
            let level = feth.selectivity;
            if qp.attr.max_dest_rd_atomic == 0
                || !SendOp::flush_placement_is_defined(placement)
                || level > SendOp::FLUSH_MR
            {
                return Err(Refusal::Fatal(NakCode::InvalidRequest));
            }
            let mut need = Access(0);
            if placement & SendOp::FLUSH_GLOBAL != 0 {
                need = need | Access::FLUSH_GLOBAL;
            }
            if placement & SendOp::FLUSH_PERSISTENT != 0 {
                need = need | Access::FLUSH_PERSISTENT;
            }
            if !qp.attr.qp_access_flags.contains(need) {
                return Err(Refusal::Fatal(NakCode::RemoteAccessError));
            }
            let rkey = reth.rkey.0;
            let (va, len) = if level == SendOp::FLUSH_MR {
                sh.rkey_extent(qp.pd, qp.qpn, rkey).ok_or(Refusal::Fatal(NakCode::RemoteAccessError))?
            } else {
                (reth.virtual_address, u64::from(reth.dma_length))
            };
            // The key is checked even for nothing to flush (rxe: a FETH needs a valid R_Key).
            let local = sh
                .resolve_rkey(qp.pd, qp.qpn, rkey, va, len, need)
                .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError))?;
            let persistent = placement & SendOp::FLUSH_PERSISTENT != 0;
            mem.flush(local, len, persistent).map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError))?;
            answer_as_empty_read(qp, psn, reth.virtual_address, rkey);
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            let a = repr.ext.atomic_eth.ok_or(Refusal::Fatal(NakCode::InvalidRequest))?;
            if qp.attr.max_dest_rd_atomic == 0 || a.virtual_address % 8 != 0 {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // IBA 9.4.5: 8-byte aligned
            }
            let local = remote_access(qp, sh, a.rkey, a.virtual_address, 8, Access::REMOTE_ATOMIC)?;
            if local % 8 != 0 {
                return Err(Refusal::Fatal(NakCode::InvalidRequest)); // a zero-based window's start
            }
            let result = if operation == Operation::CompareSwap {
                mem.compare_swap(local, a.compare, a.swap_add)
            } else {
                mem.fetch_add(local, a.swap_add)
            };
            let original = result.map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError))?;
            remember(
                qp,
                RdAtomicResource {
                    first_psn: psn,
                    npkts: 1,
                    va: a.virtual_address,
                    rkey: a.rkey.0,
                    pd: qp.pd,
                    length: 8,
                    atomic_original: Some(original),
                    by_reference: false,
                },
            );
            qp.resp.out.push_back(RespJob::AtomicAck { psn, original, rkey: Some(a.rkey) });
            qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
        }
        _ => return Err(Refusal::Fatal(NakCode::InvalidRequest)),
    }
    if data.by_reference() && len > 0 {
        sh.counters.rcvd_by_reference += 1; // a SEND's or WRITE's data, copied
    }
    Ok(psns)
}

/// The responder's access check for a RETH or AtomicETH (IBA 9.7.5.1.3, rxe `check_rkey`): the QP must
/// allow the access, and the R_Key must name an MR of the QP's PD, or a memory window
/// reachable through this QP, that allows it and holds the whole range
/// ([`Shared::resolve_rkey`]). C9-88: a zero-length operation needs no valid R_Key.
/// Returns the local address of the first byte.
fn remote_access(qp: &Qp, sh: &Shared, rkey: RKey, va: u64, len: u64, need: Access) -> Result<u64, Refusal> {
    if len == 0 {
        return Ok(va);
    }
    if !qp.attr.qp_access_flags.contains(need) {
        return Err(Refusal::Fatal(NakCode::RemoteAccessError));
    }
    sh.resolve_rkey(qp.pd, qp.qpn, rkey.0, va, len, need).map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError))
}

/// Remembers a READ or atomic for duplicates, keeping the last `max_dest_rd_atomic`.
/// Answers an ATOMIC_WRITE or FLUSH at `psn` as a READ of nothing (rxe's
/// send_read_response_ack), remembered as one, so that a duplicate is answered again, not
/// executed again.
fn answer_as_empty_read(qp: &mut Qp, psn: Psn, va: u64, rkey: u32) {
    let pd = qp.pd;
    let resource = RdAtomicResource {
        first_psn: psn,
        npkts: 1,
        va,
        rkey,
        pd,
        length: 0,
        atomic_original: None,
        by_reference: false,
    };
    remember(qp, resource);
    qp.resp.out.push_back(RespJob::Read { psn, va, remaining: 0, first: true, rkey, pd, by_reference: false });
    qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
}

fn remember(qp: &mut Qp, r: RdAtomicResource) {
    let keep = usize::from(qp.attr.max_dest_rd_atomic.max(1));
    while qp.resp.resources.len() >= keep {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(r);
}

fn rc_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    repr: &RoceRepr<'_>,
    data: Payload<'_>,
    operation: Operation,
    position: Position,
) {
    let psn = repr.bth.psn;
    let expected = qp.resp.psn;
    if psn != expected {
        if psn.is_after(expected) {
            // Ahead: something was lost. One NAK until the expected packet arrives.
            sh.counters.out_of_sequence += 1;
            if !qp.resp.nak_sent {
                qp.resp.nak_sent = true;
                sh.counters.naks_sent += 1;
                qp.counters.naks_sent += 1;
                queue_ack(qp, expected, Syndrome::Nak(NakCode::PsnSequenceError));
            }
        } else {
            duplicate(qp, sh, psn, operation, repr);
        }
        return;
    }
    qp.resp.nak_sent = false;
    let executed = match qp.qp_type {
        QpType::XrcTgt => xrc_target(qp, sh, repr).and_then(|()| execute(qp, sh, mem, repr, data, operation, position)),
        _ => execute(qp, sh, mem, repr, data, operation, position),
    };
    match executed {
        Ok(npkts) => {
            qp.resp.psn = psn.wrapping_add(npkts);
            let answered = matches!(
                operation,
                Operation::RdmaReadRequest
                    | Operation::CompareSwap
                    | Operation::FetchAdd
                    | Operation::AtomicWrite
                    | Operation::Flush
            );
            if repr.bth.ack_req && !answered {
                queue_ack(qp, psn, Syndrome::ACK_NO_CREDITS);
            }
        }
        Err(Refusal::NotReady) => {
            sh.counters.rnr_naks_sent += 1;
            qp.counters.rnr_naks_sent += 1;
            let timer = RnrTimer::new(qp.attr.min_rnr_timer).unwrap_or(RnrTimer::new(0).expect("0 is a code"));
            tracing::debug!(
                target: "softrdma::qp",
                qpn = qp.qpn.value(),
                psn = psn.value(),
                peer = ?qp.peer_ip(),
                "QP {}: no receive posted for the peer's message at PSN {}: RNR NAK (the peer waits {} us and resends)",
                qp.qpn,
                psn.value(),
                timer.delay_us(),
            );
            queue_ack(qp, psn, Syndrome::RnrNak(timer));
        }
        Err(Refusal::Fatal(code)) => nak_fatal(qp, sh, psn, code),
    }
}

/// An XRC TGT QP's request names, in its XRCETH, the XRC SRQ that serves its message: its
/// receive, the PD its memory accesses are checked in and the CQ its receive completes to
/// (IBA 9.8: an SRQ of the QP's XRC domain, or the request is invalid). A message's packets
/// all name the SRQ its first named.
fn xrc_target(qp: &mut Qp, sh: &Shared, repr: &RoceRepr<'_>) -> Result<(), Refusal> {
    let srqn = repr.ext.xrceth.ok_or(Refusal::Fatal(NakCode::InvalidRequest))?.srqn;
    let srq = sh.srqs.get(srqn as usize).ok_or(Refusal::Fatal(NakCode::InvalidRequest))?;
    let cq = match srq.xrc {
        Some((xrcd, cq)) if Some(xrcd) == qp.xrcd => cq,
        _ => return Err(Refusal::Fatal(NakCode::InvalidRequest)),
    };
    let id = crate::verbs::SrqId(srqn);
    if qp.resp.in_message() && qp.srq != Some(id) {
        return Err(Refusal::Fatal(NakCode::InvalidRequest));
    }
    qp.srq = Some(id);
    qp.pd = srq.pd;
    qp.recv_cq = cq;
    Ok(())
}

/// A request whose PSN is before the expected one (IBA 9.7.5.1.2 / C9-105).
fn duplicate(qp: &mut Qp, sh: &mut Shared, psn: Psn, operation: Operation, repr: &RoceRepr<'_>) {
    sh.counters.duplicate_requests += 1;
    let mtu = qp.mtu();
    match operation {
        // An ATOMIC_WRITE or FLUSH is remembered as a READ of nothing: answered again, not
        // executed again.
        Operation::RdmaReadRequest | Operation::AtomicWrite | Operation::Flush => {
            // Re-read from the remembered request, restarting mid-stream at this PSN.
            let found = qp.resp.resources.iter().rev().find(|r| {
                r.atomic_original.is_none()
                    && softrdma_wire::PsnWindow::new(r.first_psn, r.npkts).is_some_and(|w| w.contains(psn))
                    && repr.ext.reth.is_some_and(|reth| reth.rkey.0 == r.rkey)
            });
            if let Some(r) = found.copied() {
                // Like rxe (duplicate_request resets the resource and replays from here),
                // the replay replaces a response to this READ still being streamed: its
                // packets would only repeat what the requester has or delay what it lacks,
                // and on a lossy link every retry would queue one more stream behind it.
                let window = softrdma_wire::PsnWindow::new(r.first_psn, r.npkts);
                qp.resp.out.retain(
                    |job| !matches!(job, RespJob::Read { psn: p, .. } if window.is_some_and(|w| w.contains(*p))),
                );
                let skip = r.first_psn.distance_to(psn) as u32 * crate::reference::unit(r.by_reference, mtu);
                qp.resp.out.push_back(RespJob::Read {
                    psn,
                    va: r.va + u64::from(skip),
                    remaining: r.length - skip.min(r.length),
                    first: skip == 0,
                    rkey: r.rkey,
                    pd: r.pd,
                    by_reference: r.by_reference,
                });
            }
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            // Answered from the resource, never executed twice.
            let found = qp.resp.resources.iter().rev().find(|r| r.first_psn == psn && r.atomic_original.is_some());
            if let Some(r) = found.copied() {
                qp.resp.out.push_back(RespJob::AtomicAck { psn, original: r.atomic_original.unwrap_or(0), rkey: None });
            }
        }
        _ => queue_ack(qp, qp.resp.psn.wrapping_sub(1), Syndrome::ACK_NO_CREDITS),
    }
}

fn uc_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    repr: &RoceRepr<'_>,
    operation: Operation,
    position: Position,
) {
    let psn = repr.bth.psn;
    if psn != qp.resp.psn {
        // A gap: the message in progress is lost; resynchronise on the next FIRST or ONLY
        // (IBA 9.8.4).
        sh.counters.out_of_sequence += 1;
        drop_message(qp, sh);
    }
    qp.resp.psn = psn.next();
    if matches!(qp.resp.current, InMessage::Dropping) {
        if !position.starts_message() {
            return;
        }
        qp.resp.current = InMessage::None;
    }
    if let Err(refusal) = execute(qp, sh, mem, repr, Payload::Bytes(repr.payload), operation, position) {
        // UC has no NAKs: the message is silently dropped, and counted.
        match refusal {
            Refusal::NotReady => sh.counters.rcvd_dropped += 1, // no receive posted
            Refusal::Fatal(code) => count_refusal(sh, code),
        }
        drop_message(qp, sh);
        if position.ends_message() {
            qp.resp.current = InMessage::None;
        }
    }
}

/// Abandons the UC message in progress. A receive it had taken from the QP's own queue goes
/// back to the head for the next message, as rxe (`drop_msg`) and rdmavt (rewind) do; one
/// taken from an SRQ cannot go back, and completes in error (IBA 10.2.9.5).
fn drop_message(qp: &mut Qp, sh: &mut Shared) {
    if let InMessage::Send { wqe, from_srq, .. } = core::mem::take(&mut qp.resp.current) {
        sh.give_back_recv(qp, wqe, from_srq);
    }
    qp.resp.current = InMessage::Dropping;
}

fn ud_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    envelope: &Envelope,
    ip: IpInfo,
    repr: &RoceRepr<'_>,
) {
    let Some(deth) = repr.ext.deth else { return };
    if deth.qkey != qp.attr.qkey {
        sh.counters.rcvd_dropped += 1; // IBA 10.2.4: Q_Key mismatch, silently dropped
        return;
    }
    sh.counters.rcvd_packets += 1;
    let Some((wqe, _)) = sh.take_recv(qp) else {
        sh.counters.rcvd_dropped += 1; // UD has no RNR: no receive, no delivery
        return;
    };
    let mut grh = [0u8; GRH_LEN];
    let mut network_hdr = None;
    if let Ok(header) = grh_for(envelope, ip, repr) {
        let _ = header.emit(&mut grh);
        network_hdr = Some(match header {
            GrhRepr::V4(_) => NetworkHdr::Ipv4,
            GrhRepr::V6(_) => NetworkHdr::Ipv6,
        });
    }
    let byte_len = (GRH_LEN + repr.payload.len()) as u32;
    let status = scatter_recv(sh, qp.pd, mem, &wqe, 0, Payload::Bytes(&grh))
        .and_then(|()| scatter_recv(sh, qp.pd, mem, &wqe, GRH_LEN as u32, Payload::Bytes(repr.payload)));
    let wc = Wc {
        wr_id: wqe.wr_id,
        status: status.err().unwrap_or(WcStatus::Success),
        opcode: WcOpcode::Recv,
        byte_len: if status.is_ok() { byte_len } else { 0 },
        imm_data: repr.ext.imm_dt.map(|i| i.0),
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: deth.src_qp,
        grh: network_hdr,
        solicited: repr.bth.solicited_event,
        completed_at: None,
    };
    sh.push_cqe(qp.recv_cq, wc);
    sh.recycle(wqe);
}

/// Congestion control's notification point for a packet `qp` accepted: remembers the
/// sender (for [`Engine::handle_receive_drops`]) and answers an ECN CE mark with a CNP, at
/// most one per [`CNP_INTERVAL`](crate::congestion::CNP_INTERVAL).
fn congestion_seen(
    qp: &mut Qp,
    sh: &mut Shared,
    now: Instant,
    envelope: &Envelope,
    ip: IpInfo,
    deth: Option<DethRepr>,
) {
    let connected = qp.qp_type.is_connected();
    let Some(cc) = qp.cc.as_deref_mut() else { return };
    cc.last_rx = Some(now);
    if !connected {
        // A UD QP's CNPs go to the last sender heard from (a connected QP's to its peer:
        // nothing to note on each packet).
        if let Some(peer) = deth.and_then(|d| Some((sh.reply_envelope(envelope)?, d.src_qp))) {
            cc.last_peer = Some(peer);
        }
    }
    const ECN_CE: u8 = 0b11;
    if ip.traffic_class & 0b11 == ECN_CE
        && cc.np.on_congestion(now)
        && let Some((e, dest)) = cnp_peer(qp)
    {
        sh.cnps.push_back((e, dest, qp.qpn));
    }
}

/// Where QP `qp`'s CNPs go, and to which QP: a connected QP's peer, or the last sender a
/// UD QP heard from.
pub(crate) fn cnp_peer(qp: &Qp) -> Option<(Envelope, softrdma_wire::Qpn)> {
    if qp.qp_type.is_connected() {
        qp.envelope.map(|e| (e, softrdma_wire::Qpn::from_u24_truncating(qp.attr.dest_qp_num)))
    } else {
        qp.cc.as_deref().and_then(|cc| cc.last_peer)
    }
}

/// Whether a packet to a connected QP that has not yet heard from its peer shows
/// knowledge only the peer has, so that its UDP source port may be taken as the peer's: a
/// request at exactly the PSN the responder expects, or a response to a PSN the requester
/// has sent and not seen acknowledged. (A blind forger must guess a 24-bit PSN; one that
/// guesses wrong cannot make the QP deaf to its real peer.)
fn proves_peer(qp: &Qp, psn: Psn, response: bool) -> bool {
    if response {
        qp.comp.psn.distance_to(psn) >= 0 && psn.distance_to(qp.req.sent_end) > 0
    } else {
        psn == qp.resp.psn
    }
}

/// The GRH of a received UD packet: its IP header as it arrived (ibv_post_recv(3) NOTES).
/// Fails only for a packet too long for any datagram, which no receiver is handed.
pub fn grh_for(envelope: &Envelope, ip: IpInfo, repr: &RoceRepr<'_>) -> softrdma_wire::Result<GrhRepr> {
    let (header, _) = ip_udp_headers_with(envelope, repr.buffer_len(), ip.hop_limit, ip.traffic_class, ip.flow_label)?;
    Ok(GrhRepr::from_ip(&header))
}
