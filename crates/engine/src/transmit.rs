//! The requester and the responder's output: which packet a QP sends next.
//!
//! A QP's owed responses (ACKs, NAKs, READ responses, atomic ACKs) go before its own
//! requests, in the order the requests arrived: an ACK for a later PSN must not overtake a
//! READ response, or the peer would take the READ for lost.

use softrdma_wire::bth;
use softrdma_wire::icrc::ICRC_LEN;
use softrdma_wire::opcode::{OpcodeInfo, Position};
use softrdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthPacket, BthRepr, DethRepr, Envelope, ExtHeaders, FethRepr, Headers,
    IethRepr, ImmDtPacket, ImmDtRepr, Msn, NakCode, Opcode, PKey, Psn, RethPacket, RethRepr, RocePacket, RoceRepr,
    Syndrome, XrcEthRepr,
};

use crate::completer::{self, local_key_status};
use crate::engine::{AckBeside, Shared, Transmit, udp_source_port};
use crate::memory::{Memory, MemoryFault};
use crate::qp::{Carriage, Qp, RespJob};
use crate::reference::{self, Piece};
use crate::verbs::{Access, QpState, QpType, SendOp, WcStatus};
use crate::{Engine, Instant};

/// rxe's `RXE_MAX_UNACKED_PSNS`: the requester stops this far ahead of the oldest ACK.
pub(crate) const MAX_UNACKED_PSNS: i32 = 128;
/// rxe's `RXE_MAX_PKT_PER_ACK`: AckReq at least this often.
const MAX_PKTS_PER_ACK: u32 = 64;

impl Engine {
    /// The next datagram to send, written into `buf` (which must hold 4096 + 80 bytes).
    /// Call after every input until it returns `None`.
    #[must_use]
    pub fn poll_transmit<M: Memory + ?Sized>(&mut self, now: Instant, mem: &mut M, buf: &mut [u8]) -> Option<Transmit> {
        self.shared.tick(now);
        // CNPs first: they exist to slow a sender down now.
        while let Some((envelope, dest, local)) = self.shared.cnps.pop_front() {
            if let Some(t) = self.cnp(envelope, dest, local, buf) {
                return Some(t);
            }
        }
        // Room a QP was refused for only because others waited first goes to them now.
        if self.shared.ready.is_empty() {
            self.wake_window_waiters();
        }
        // Each QP in the round-robin gets one chance per call; one that has nothing to send
        // leaves it, so the loop ends.
        let mut budget = self.shared.ready.len();
        while budget > 0 {
            budget -= 1;
            let qpn = self.shared.ready.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn.value()) else { continue };
            qp.in_ready = false;
            if let Some(cc) = qp.cc.as_deref_mut() {
                // Congestion control's pacer: the QP waits for its timer (responses too, so
                // that a READ is paced like any other traffic).
                if let Some(at) = cc.rp.send_at(now) {
                    cc.paced_until = Some(at);
                    self.shared.update_timer(qp);
                    continue;
                }
            }
            let mut sent = next_packet(qp, &mut self.shared, mem, now, buf);
            if sent.is_none() {
                mem.discard_gathered();
            }
            self.shared.count_window(qp);
            if let Some(t) = &mut sent {
                t.local_qp = qp.qpn;
                t.qp_by_reference = qp.by_reference;
                t.qp_acks_beside = qp.acks_beside;
            }
            if let (Some(t), Some(av)) = (&mut sent, qp.av()) {
                // A connected QP's packets, requests and responses, take its AV's traffic
                // class (a UD request has its AH's already).
                t.traffic_class = av.traffic_class;
            }
            if let (Some(t), Some(cc)) = (&sent, qp.cc.as_deref_mut()) {
                cc.rp.on_sent(now, t.len);
            }
            if let Some(t) = &mut sent {
                if let Some(sealer) = &mut qp.keys {
                    // The buffer holds 4096 + 80 bytes: room for the largest packet and its
                    // trailer. Sealing computes the ICRC over the sealed packet.
                    t.len = sealer
                        .seal(&t.envelope, buf, t.len)
                        .expect("poll_transmit's buffer holds a packet and its trailer");
                    t.icrc_pending = false;
                } else if !self.shared.config.defer_icrc {
                    RocePacket::new_unchecked(&mut buf[..t.len]).fill_icrc(&t.envelope);
                    t.icrc_pending = false;
                }
            }
            if let Some(t) = &sent {
                // An ACK beside a packet counts as the packet it stands for.
                self.shared.counters.sent_packets += 1 + u64::from(t.ack_beside.is_some());
                if crate::window::PeerWindows::in_burst(&qp.window) {
                    // A QP sends its burst through before the next QP: interleaved packet
                    // by packet, every burst ended, and asked for its ACK, only once the
                    // whole window was out, and the window emptied and filled in turns
                    // (128 QPs: the receiver idle half the time).
                    self.shared.schedule_first(qp);
                } else {
                    self.shared.schedule(qp);
                }
            }
            self.shared.update_timer(qp);
            if sent.is_some() {
                return sent;
            }
        }
        None
    }

    /// A CNP to QP `dest` in `envelope`, sent for local QP `local` (sealed with its keys if
    /// it is authenticated).
    fn cnp(
        &mut self,
        envelope: Envelope,
        dest: softrdma_wire::Qpn,
        local: softrdma_wire::Qpn,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let repr = RoceRepr {
            bth: BthRepr { becn: true, ..bth(Opcode::CNP, dest.value(), Psn::default()) },
            ext: ExtHeaders::default(),
            payload: &[0; 16],
        };
        let mut len = repr.emit(&envelope, buf).ok()?;
        if let Some(sealer) = self.qps.get_mut(&local.value()).and_then(|qp| qp.keys.as_deref_mut()) {
            len = sealer.seal(&envelope, buf, len)?;
        }
        self.shared.counters.sent_packets += 1;
        self.shared.counters.cnps_sent += 1;
        Some(Transmit::new(envelope, len, local, false))
    }
}

fn next_packet<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    buf: &mut [u8],
) -> Option<Transmit> {
    match qp.state {
        QpState::Reset | QpState::Init => None,
        // In the error state only the NAK that put the QP there still goes out.
        QpState::Err => respond(qp, sh, mem, buf),
        _ => {
            // The plain ACK it owes goes beside the request that follows it now, if one does,
            // to be taken before it (Engine::allow_acks_beside); else as a packet, first.
            // (One call of `request`, which inlines: two made a 64 B SEND 6 % dearer.)
            let carry = ack_to_carry(qp);
            if carry.is_none()
                && let Some(t) = respond(qp, sh, mem, buf)
            {
                return Some(t);
            }
            let sent = match one_packet_request(qp, sh, mem, now, buf) {
                Some(sent) => sent,
                None => match continuing_request(qp, sh, mem, now, buf) {
                    Some(sent) => sent,
                    None => request(qp, sh, mem, now, buf),
                },
            };
            match sent {
                Some(mut t) => {
                    if carry.is_some() {
                        qp.resp.out.pop_front();
                        t.ack_beside = carry;
                    }
                    Some(t)
                }
                None if carry.is_some() => respond(qp, sh, mem, buf),
                None => None,
            }
        }
    }
}

/// The ACK `qp` may carry beside its next request: the one response it owes, if that is a
/// plain ACK and the runtime allows it (a NAK, an atomic's answer or a READ's go as
/// packets; so does an ACK queued behind them, in its order).
fn ack_to_carry(qp: &Qp) -> Option<AckBeside> {
    if !qp.acks_beside || qp.keys.is_some() || qp.resp.out.len() != 1 {
        return None;
    }
    match qp.resp.out.front() {
        Some(&RespJob::Ack { psn, syndrome: syndrome @ Syndrome::Ack { .. } }) => {
            Some(AckBeside { psn, aeth: AethRepr { syndrome, msn: Msn::from_u24_truncating(qp.resp.msn) } })
        }
        _ => None,
    }
}

fn bth(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
    BthRepr {
        opcode,
        solicited_event: false,
        mig_req: false,
        pkey: PKey::DEFAULT,
        fecn: false,
        becn: false,
        dest_qp: softrdma_wire::Qpn::from_u24_truncating(dest_qp),
        ack_req: false,
        psn,
    }
}

/// Writes `repr` with a payload of `payload_len` bytes already placed after its headers, but
/// not its ICRC: `poll_transmit` seals the packet, computes it or leaves it to the runtime.
fn emit(repr: &RoceRepr<'_>, envelope: Envelope, payload_len: usize, buf: &mut [u8]) -> Option<Transmit> {
    match repr.emit_around_payload_without_icrc(payload_len, buf) {
        // The caller (`poll_transmit`) names the QP.
        Ok(len) => Some(Transmit::new(envelope, len, softrdma_wire::Qpn::default(), true)),
        Err(e) => {
            debug_assert!(false, "the engine built a packet the codec refuses: {e}");
            None
        }
    }
}

/// The responder's next owed response.
fn respond<M: Memory + ?Sized>(qp: &mut Qp, sh: &mut Shared, mem: &mut M, buf: &mut [u8]) -> Option<Transmit> {
    let job = *qp.resp.out.front()?;
    let envelope = qp.envelope?;
    let msn = Msn::from_u24_truncating(qp.resp.msn);
    let ack = |syndrome| Some(AethRepr { syndrome, msn });
    let dest = qp.attr.dest_qp_num;
    match job {
        RespJob::Ack { psn, syndrome } => {
            qp.resp.out.pop_front();
            let repr = RoceRepr {
                bth: bth(response_opcode(qp.qp_type, Opcode::RC_ACKNOWLEDGE), dest, psn),
                ext: ExtHeaders { aeth: ack(syndrome), ..Default::default() },
                payload: &[],
            };
            emit(&repr, envelope, 0, buf)
        }
        RespJob::AtomicAck { psn, original, rkey } => {
            qp.resp.out.pop_front();
            let grant = rkey.and_then(|rkey| sh.grant_for(qp, rkey)).is_some();
            let repr = RoceRepr {
                bth: bth(response_opcode(qp.qp_type, Opcode::RC_ATOMIC_ACKNOWLEDGE), dest, psn),
                ext: ExtHeaders {
                    aeth: ack(Syndrome::ACK_NO_CREDITS),
                    atomic_ack_eth: Some(AtomicAckEthRepr { original_data: original }),
                    ..Default::default()
                },
                payload: &[],
            };
            emit(&repr, envelope, 0, buf).map(|t| Transmit { grant, ..t })
        }
        RespJob::Read { psn, va, remaining, first, rkey, pd, by_reference } => {
            // Asked for by reference: a segment per response, listing where it is here.
            let chunk = remaining.min(reference::unit(by_reference, qp.mtu()));
            let last = chunk == remaining;
            let (opcode, position) = match (first, last) {
                (true, true) => (Opcode::RC_RDMA_READ_RESPONSE_ONLY, Position::Only),
                (true, false) => (Opcode::RC_RDMA_READ_RESPONSE_FIRST, Position::First),
                (false, false) => (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, Position::Middle),
                (false, true) => (Opcode::RC_RDMA_READ_RESPONSE_LAST, Position::Last),
            };
            // The R_Key again, for every packet: after dereg_mr no response reads the region.
            // A memory window is resolved again too: invalidated or rebound, it answers no more.
            let local = match chunk {
                0 => Ok(va),
                _ => sh.resolve_rkey(pd, qp.qpn, rkey, va, u64::from(chunk), Access::REMOTE_READ),
            };
            let Ok(local) = local else {
                qp.resp.out.clear();
                qp.resp.out.push_back(RespJob::Ack { psn, syndrome: Syndrome::Nak(NakCode::RemoteAccessError) });
                return respond(qp, sh, mem, buf);
            };
            let header = RoceRepr {
                bth: bth(response_opcode(qp.qp_type, opcode), dest, psn),
                ext: ExtHeaders {
                    aeth: (position != Position::Middle)
                        .then_some(AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn }),
                    ..Default::default()
                },
                payload: &[],
            };
            let at = header.header_len();
            let len = if by_reference {
                let out = buf.get_mut(at..)?;
                Piece { addr: local, len: chunk }.emit(out.get_mut(..reference::PIECE_LEN)?);
                reference::pad(out, reference::PIECE_LEN, last)?
            } else {
                chunk as usize
            };
            // Copied, never gathered (Memory::gather): the application may write the region
            // a READ reads while it reads it (a torn read is its to detect), and a packet
            // sent from where the bytes are would leave with an ICRC over other bytes than
            // the kernel then takes; the peer would drop it, and every retry, for as long as
            // the writes go on. A snapshot keeps each response true to its ICRC.
            if !by_reference && chunk > 0 && mem.read(local, buf.get_mut(at..at + chunk as usize)?).is_err() {
                // Pages of the region that cannot be read (a region on demand): an R_Key
                // violation, as rxe's failed copy is.
                qp.resp.out.clear();
                qp.resp.out.push_back(RespJob::Ack { psn, syndrome: Syndrome::Nak(NakCode::RemoteAccessError) });
                return respond(qp, sh, mem, buf);
            }
            let job = qp.resp.out.front_mut().expect("the job is still queued");
            if last {
                qp.resp.out.pop_front();
            } else {
                *job = RespJob::Read {
                    psn: psn.next(),
                    va: va + u64::from(chunk),
                    remaining: remaining - chunk,
                    first: false,
                    rkey,
                    pd,
                    by_reference,
                };
            }
            emit(&header, envelope, len, buf).map(|t| Transmit { by_reference, ..t })
        }
    }
}

/// The opcode of response `rc_opcode` (an RC one) in the transport of a `qp_type` QP:
/// XRC's responses are RC's, in XRC's opcode range (IBA Table 38).
fn response_opcode(qp_type: QpType, rc_opcode: Opcode) -> Opcode {
    match qp_type {
        QpType::XrcTgt => Opcode(0xa0 | (rc_opcode.0 & 0x1f)),
        _ => rc_opcode,
    }
}

/// The opcode of a request packet.
fn request_opcode(qp_type: QpType, op: SendOp, position: Position) -> Opcode {
    let base = match qp_type {
        QpType::Rc => 0x00,
        QpType::Uc => 0x20,
        QpType::Ud | QpType::Gsi => 0x60,
        QpType::XrcIni | QpType::XrcTgt => 0xa0,
    };
    let low = match (op, position) {
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, Position::First) => 0x00,
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, Position::Middle) => 0x01,
        (SendOp::Send, Position::Last) => 0x02,
        (SendOp::SendWithImm { .. }, Position::Last) => 0x03,
        (SendOp::Send, Position::Only) => 0x04,
        (SendOp::SendWithImm { .. }, Position::Only) => 0x05,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, Position::First) => 0x06,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, Position::Middle) => 0x07,
        (SendOp::RdmaWrite { .. }, Position::Last) => 0x08,
        (SendOp::RdmaWriteWithImm { .. }, Position::Last) => 0x09,
        (SendOp::RdmaWrite { .. }, Position::Only) => 0x0a,
        (SendOp::RdmaWriteWithImm { .. }, Position::Only) => 0x0b,
        (SendOp::RdmaRead { .. }, _) => 0x0c,
        (SendOp::CompareSwap { .. }, _) => 0x13,
        (SendOp::FetchAdd { .. }, _) => 0x14,
        (SendOp::AtomicWrite { .. }, _) => 0x1d,
        (SendOp::Flush { .. }, _) => 0x1c,
        (SendOp::SendWithInv { .. }, Position::Last) => 0x16,
        (SendOp::SendWithInv { .. }, Position::Only) => 0x17,
        (SendOp::BindMw { .. } | SendOp::LocalInv { .. }, _) => unreachable!("local operations send nothing"),
    };
    Opcode(base | low)
}

/// PSNs a message occupies.
pub(crate) fn packets(op: SendOp, length: u32, mtu: u32) -> u32 {
    if op.is_atomic() || matches!(op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. }) {
        1
    } else {
        length.div_ceil(mtu).max(1)
    }
}

/// The requester's next packet.
fn request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    buf: &mut [u8],
) -> Option<Transmit> {
    // SQD lets messages already started finish, retransmissions included, and starts
    // nothing new (IBA 10.3.1.6).
    let started = qp.req.next < qp.sq.tail() && qp.sq.get(qp.req.next).started;
    let sending = qp.state == QpState::Rts || (qp.state == QpState::Sqd && started);
    if !sending {
        return None;
    }
    if let Some(until) = qp.comp.rnr_wait_until {
        if now < until {
            return None;
        }
        qp.comp.rnr_wait_until = None;
    }
    if !local_ops(qp, sh) {
        return None;
    }
    let pos = qp.req.next;
    if qp.state == QpState::Sqd && !(pos < qp.sq.tail() && qp.sq.get(pos).started) {
        return None; // past local operations done before, SQD still starts nothing new
    }
    if pos >= qp.sq.tail() {
        return None;
    }
    if qp.sq.get(pos).status.is_some() {
        return None; // it failed here (completer::fail_at), behind WQEs still to complete
    }
    let rc = qp.qp_type.is_reliable();
    if rc && qp.comp.psn.distance_to(qp.req.psn) >= MAX_UNACKED_PSNS {
        return None; // wait for ACKs
    }
    if rc && !window_room(qp, sh) {
        return None; // wait for room in the peer's window (crate::window)
    }
    let mtu = qp.mtu();
    let w = qp.sq.get(pos);
    let op = w.op();
    if !w.started {
        if w.fence && qp.req.rd_atomic_outstanding > 0 {
            return None; // IBV_SEND_FENCE: earlier READs and atomics first
        }
        if op.is_read_or_atomic() && qp.req.rd_atomic_outstanding >= u32::from(qp.attr.max_rd_atomic.max(1)) {
            return None; // max_rd_atomic (the initiator depth) reached
        }
        if op.is_read_or_atomic() && qp.attr.max_rd_atomic == 0 {
            completer::fail_at(qp, sh, pos, WcStatus::LocQpOpErr);
            return None;
        }
        // A message of one packet whose every SGE has bytes has each checked by its gather
        // below, which fails it the same way before anything leaves: not looked up twice.
        let gathered_whole = || {
            matches!(
                op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            ) && w.length <= mtu
                && w.sges.iter().all(|s| s.length > 0)
        };
        if !w.is_inline && !gathered_whole() {
            let need = if op.is_read_or_atomic() { Access::LOCAL_WRITE } else { Access(0) };
            for sge in &w.sges {
                if let Err(e) = sh.check_lkey(qp.pd, sge.lkey, sge.addr, u64::from(sge.length), need) {
                    completer::fail_at(qp, sh, pos, local_key_status(e));
                    return None;
                }
            }
        }
        let psn = qp.req.psn;
        let by_reference = qp.by_reference && qp.keys.is_none() && qp.qp_type == QpType::Rc;
        let w = qp.sq.get_mut(pos);
        if w.carriage == Carriage::Undecided {
            // Kept if it is sent again from scratch: the peer counted its PSNs by it.
            let long = !w.is_inline && w.length >= reference::MIN_LEN;
            let kind = op.carries_data() || matches!(op, SendOp::RdmaRead { .. });
            w.carriage = if by_reference && long && kind { Carriage::Reference } else { Carriage::Bytes };
        }
        w.started = true;
        w.first_psn = psn;
        w.npkts = packets(op, w.length, w.unit(mtu));
        w.read_done = 0;
        qp.req.offset = 0;
        if op.is_read_or_atomic() {
            qp.req.rd_atomic_outstanding += 1;
        }
    }

    let w = qp.sq.get(pos);
    let (envelope, dest_qp, traffic_class) = match qp.qp_type {
        QpType::Ud | QpType::Gsi => {
            let dest = w.ud?;
            let ah = sh.ahs.get(dest.ah.0 as usize)?;
            let port = udp_source_port(ah.av.flow_label, qp.qpn.value(), dest.remote_qpn.value());
            (sh.envelope_for(&ah.av, port)?, dest.remote_qpn.value(), ah.av.traffic_class)
        }
        // A connected QP's: poll_transmit sets its AV's on each of its packets.
        _ => (qp.envelope?, qp.attr.dest_qp_num, 0),
    };
    let psn = qp.req.psn;
    // Built in place, headers as they are decided: no copy of the 128-byte set of extended
    // headers into a packet's representation at the end.
    let mut repr = RoceRepr { bth: bth(Opcode(0), dest_qp, psn), ext: ExtHeaders::default(), payload: &[] };
    if qp.qp_type == QpType::XrcIni {
        // Every XRC request names the SRQ that serves its message (IBA 9.2.2.2).
        repr.ext.xrceth = Some(XrcEthRepr { srqn: w.xrc_srqn });
    }
    let mut payload_len = 0u32;
    let mut by_reference = false;
    let message_done;
    match op {
        SendOp::RdmaRead { remote_addr, rkey } => {
            let remaining = w.length - w.read_done;
            repr.bth.opcode = request_opcode(qp.qp_type, op, Position::Only);
            repr.bth.ack_req = true;
            repr.ext.reth = Some(RethRepr {
                virtual_address: remote_addr.wrapping_add(u64::from(w.read_done)),
                rkey,
                dma_length: remaining,
            });
            qp.req.psn = psn.wrapping_add(remaining.div_ceil(w.unit(mtu)).max(1));
            // Sent by reference, it asks for its answer so (crate::reference).
            by_reference = w.carriage == Carriage::Reference;
            message_done = true;
        }
        SendOp::CompareSwap { remote_addr, rkey, compare, swap } => {
            repr.bth.opcode = request_opcode(qp.qp_type, op, Position::Only);
            repr.bth.ack_req = true;
            repr.ext.atomic_eth = Some(AtomicEthRepr { virtual_address: remote_addr, rkey, swap_add: swap, compare });
            qp.req.psn = psn.next();
            message_done = true;
        }
        SendOp::FetchAdd { remote_addr, rkey, add } => {
            repr.bth.opcode = request_opcode(qp.qp_type, op, Position::Only);
            repr.bth.ack_req = true;
            repr.ext.atomic_eth = Some(AtomicEthRepr { virtual_address: remote_addr, rkey, swap_add: add, compare: 0 });
            qp.req.psn = psn.next();
            message_done = true;
        }
        SendOp::AtomicWrite { remote_addr, rkey, value } => {
            repr.bth.opcode = request_opcode(qp.qp_type, op, Position::Only);
            repr.bth.ack_req = true;
            repr.ext.reth = Some(RethRepr { virtual_address: remote_addr, rkey, dma_length: 8 });
            let at = repr.header_len();
            buf.get_mut(at..at + 8)?.copy_from_slice(&value);
            payload_len = 8;
            qp.req.psn = psn.next();
            message_done = true;
        }
        SendOp::Flush { remote_addr, rkey, length, placement, level } => {
            repr.bth.opcode = request_opcode(qp.qp_type, op, Position::Only);
            repr.bth.ack_req = true;
            repr.ext.reth = Some(RethRepr { virtual_address: remote_addr, rkey, dma_length: length });
            repr.ext.feth = Some(FethRepr { selectivity: level, placement_type: placement });
            qp.req.psn = psn.next();
            message_done = true;
        }
        SendOp::BindMw { .. } | SendOp::LocalInv { .. } => unreachable!("local_ops did them"),
        SendOp::Send
        | SendOp::SendWithImm { .. }
        | SendOp::SendWithInv { .. }
        | SendOp::RdmaWrite { .. }
        | SendOp::RdmaWriteWithImm { .. } => {
            let offset = qp.req.offset;
            let chunk = (w.length - offset).min(w.unit(mtu));
            let first = offset == 0;
            let last = offset + chunk == w.length;
            let position = match (first, last) {
                (true, true) => Position::Only,
                (true, false) => Position::First,
                (false, false) => Position::Middle,
                (false, true) => Position::Last,
            };
            repr.bth.opcode = request_opcode(qp.qp_type, op, position);
            repr.bth.solicited_event = last && w.solicited;
            if first {
                if let SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaWriteWithImm { remote_addr, rkey, .. } = op
                {
                    repr.ext.reth = Some(RethRepr { virtual_address: remote_addr, rkey, dma_length: w.length });
                }
            }
            if last {
                if let SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } = op {
                    repr.ext.imm_dt = Some(ImmDtRepr(imm));
                }
                if let SendOp::SendWithInv { rkey } = op {
                    repr.ext.ieth = Some(IethRepr { rkey });
                }
            }
            if let Some(dest) = w.ud {
                repr.ext.deth = Some(DethRepr { qkey: dest.remote_qkey, src_qp: qp.qpn });
            }
            repr.bth.ack_req =
                rc && (last || qp.req.since_ack_req + 1 >= MAX_PKTS_PER_ACK || sh.windows.ends_burst(&qp.window));
            // The opcode's header length, from the table (the headers just set are the
            // opcode's, which emit checks).
            let at = repr.bth.opcode.info().map_or(bth::HEADER_LEN, OpcodeInfo::header_len);
            let gathered = if w.carriage == Carriage::Reference {
                // Where the bytes are, for the peer to copy them from (crate::reference).
                by_reference = true;
                let out = buf.get_mut(at..)?;
                pieces(qp, sh, pos, offset, chunk, out).and_then(|len| {
                    reference::pad(out, len as usize, last).map(|n| n as u32).ok_or(WcStatus::LocLenErr)
                })
            } else {
                // Copy the payload straight from the application's memory into the datagram.
                let out = buf.get_mut(at..at + chunk as usize)?;
                gather(qp, sh, mem, pos, offset, out).map(|()| chunk)
            };
            match gathered {
                Ok(len) => payload_len = len,
                Err(status) => {
                    completer::fail_at(qp, sh, pos, status);
                    return None;
                }
            }
            qp.req.offset += chunk;
            qp.req.psn = psn.next();
            message_done = last;
        }
    }
    qp.req.since_ack_req = if repr.bth.ack_req { 0 } else { qp.req.since_ack_req + 1 };
    if rc {
        sh.windows.sent(&mut qp.window, repr.bth.ack_req);
    }
    count_sent(qp, sh, psn);
    if message_done {
        qp.req.next = pos + 1;
        qp.req.offset = 0;
    }
    let sent = emit(&repr, envelope, payload_len as usize, buf).map(|t| Transmit { traffic_class, by_reference, ..t });
    if rc {
        if qp.comp.retransmit_at.is_none() {
            completer::rearm(qp, now);
        }
    } else if message_done {
        // UC and UD have no ACKs: the WR is done once its last packet is out.
        completer::complete_head(qp, sh, WcStatus::Success);
    }
    sent
}

/// Counts a request packet at `psn` just built, the requester's PSN already past it: a
/// retransmission if `psn` is before the furthest PSN ever sent, else that one moves on.
fn count_sent(qp: &mut Qp, sh: &mut Shared, psn: Psn) {
    if psn.distance_to(qp.req.sent_end) > 0 {
        sh.counters.retransmitted_packets += 1;
        qp.counters.retransmitted_packets += 1;
    } else {
        qp.req.sent_end = qp.req.psn;
    }
}

/// [`request`] for its most common case, a new message of one packet: an RC SEND or RDMA
/// WRITE, with or without immediate, of at most a path MTU, on an RTS QP that waits for
/// nothing else. The same packet and the same state as `request`, without the checks and
/// the general construction of headers only the other cases need. `None`: not that case,
/// nothing changed (`request` builds it).
#[inline]
fn one_packet_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    buf: &mut [u8],
) -> Option<Option<Transmit>> {
    // A message under way is `continuing_request`'s, turned away before its WQE is read.
    let pos = short_path_cursor(qp, sh, false)?;
    let envelope = qp.envelope?;
    let mtu = qp.mtu();
    let w = qp.sq.get(pos);
    let op = w.op();
    let (reth, imm) = match op {
        SendOp::Send => (None, None),
        SendOp::SendWithImm { imm } => (None, Some(imm)),
        SendOp::RdmaWrite { remote_addr, rkey } => (Some((remote_addr, rkey)), None),
        SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => (Some((remote_addr, rkey)), Some(imm)),
        _ => return None,
    };
    let len = w.length;
    if w.started
        || w.status.is_some()
        || len > mtu
        || (w.fence && qp.req.rd_atomic_outstanding > 0)
        || (!w.is_inline && w.sges.iter().any(|s| s.length == 0))
        || qp.comp.psn.distance_to(qp.req.psn) >= MAX_UNACKED_PSNS
    {
        return None;
    }
    let solicited = w.solicited;
    if !window_room(qp, sh) {
        return Some(None); // wait for room in the peer's window (crate::window)
    }
    let psn = qp.req.psn;
    let w = qp.sq.get_mut(pos);
    debug_assert!(w.carriage != Carriage::Reference, "a message of one packet goes by value");
    w.carriage = Carriage::Bytes;
    w.started = true;
    w.first_psn = psn;
    w.npkts = 1;
    w.read_done = 0;
    qp.req.offset = 0;
    let (reth_len, imm_len) = (Headers::RETH.len(), Headers::IMM_DT.len());
    let at = bth::HEADER_LEN + if reth.is_some() { reth_len } else { 0 } + if imm.is_some() { imm_len } else { 0 };
    let end = at + len as usize;
    let Some(out) = buf.get_mut(at..end) else { return Some(None) };
    if let Err(status) = gather(qp, sh, mem, pos, 0, out) {
        completer::fail_at(qp, sh, pos, status);
        return Some(None);
    }
    qp.req.psn = psn.next();
    qp.req.since_ack_req = 0;
    sh.windows.sent(&mut qp.window, true);
    count_sent(qp, sh, psn);
    qp.req.next = pos + 1;
    let mut h = bth::HEADER_LEN;
    if let Some((virtual_address, rkey)) = reth {
        RethRepr { virtual_address, rkey, dma_length: len }
            .emit(&mut RethPacket::new_unchecked(&mut buf[h..h + reth_len]));
        h += reth_len;
    }
    if let Some(imm) = imm {
        ImmDtRepr(imm).emit(&mut ImmDtPacket::new_unchecked(&mut buf[h..h + imm_len]));
    }
    let header = BthRepr {
        opcode: request_opcode(QpType::Rc, op, Position::Only),
        solicited_event: solicited,
        ack_req: true,
        ..bth(Opcode(0), qp.attr.dest_qp_num, psn)
    };
    let len = short_path_packet(qp, sh, now, buf, header, end);
    Some(Some(Transmit::new(envelope, len, softrdma_wire::Qpn::default(), true)))
}

/// Whether `qp` may send a new packet to its peer now ([`crate::window`]); if not, it waits
/// in the peer's queue for room.
#[inline(always)]
fn window_room(qp: &mut Qp, sh: &mut Shared) -> bool {
    let peer = qp.peer_ip();
    if sh.windows.admits(&mut qp.window, peer) {
        return true;
    }
    sh.windows.wait(qp.qpn, &mut qp.window, peer);
    false
}

/// The send queue's cursor, if a requester's short path may build the next packet: the
/// short paths are on, the QP is an RC one in RTS with no RNR wait, and its cursor is at a
/// work request, in a message under way (`under_way`) or at a new one.
fn short_path_cursor(qp: &Qp, sh: &Shared, under_way: bool) -> Option<u64> {
    let pos = qp.req.next;
    let open = sh.config.one_packet_short_path
        && (qp.req.offset != 0) == under_way
        && qp.state == QpState::Rts
        && qp.qp_type == QpType::Rc
        && qp.comp.rnr_wait_until.is_none()
        && pos < qp.sq.tail();
    open.then_some(pos)
}

/// A short path's packet made whole around its headers after the BTH and its payload,
/// which ends at `end` (the headers are whole words: the pad is the payload's): the BTH
/// `header`, the pad; the QP's timer armed if nothing armed it, the packet counted. Its
/// length, ICRC included.
// Always inlined: out of line, a 64 KiB WRITE on the wire took 35 instructions more a packet.
#[inline(always)]
fn short_path_packet(qp: &mut Qp, sh: &mut Shared, now: Instant, buf: &mut [u8], header: BthRepr, end: usize) -> usize {
    let pad = end.wrapping_neg() & 3;
    let mut packet = BthPacket::new_unchecked(&mut buf[..bth::HEADER_LEN]);
    header.emit(&mut packet);
    packet.set_pad_count(pad as u8);
    buf[end..end + pad].fill(0);
    if qp.comp.retransmit_at.is_none() {
        completer::rearm(qp, now);
    }
    sh.counters.sent_by_short_path += 1;
    end + pad + ICRC_LEN
}

/// [`request`] for the packets after the first of an RC SEND or RDMA WRITE (with or without
/// immediate) by value, on an RTS QP: its MIDDLE and LAST packets, whose only headers are
/// the BTH and, on the LAST with immediate, the ImmDt. The same packet and the same state as
/// `request`, without the checks and the general construction of headers only the first
/// packet and the other operations need. `None`: not that case, nothing changed (`request`
/// builds it).
#[inline]
fn continuing_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    buf: &mut [u8],
) -> Option<Option<Transmit>> {
    let pos = short_path_cursor(qp, sh, true)?;
    let offset = qp.req.offset;
    let envelope = qp.envelope?;
    let w = qp.sq.get(pos);
    let op = w.op();
    let imm = match op {
        SendOp::Send | SendOp::RdmaWrite { .. } => None,
        SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
        _ => return None,
    };
    if !w.started
        || w.status.is_some()
        || w.carriage != Carriage::Bytes
        || qp.comp.psn.distance_to(qp.req.psn) >= MAX_UNACKED_PSNS
    {
        return None;
    }
    let (length, solicited) = (w.length, w.solicited);
    if !window_room(qp, sh) {
        return Some(None); // wait for room in the peer's window (crate::window)
    }
    let chunk = (length - offset).min(qp.mtu());
    let last = offset + chunk == length;
    let imm = imm.filter(|_| last);
    let psn = qp.req.psn;
    let ack_req = last || qp.req.since_ack_req + 1 >= MAX_PKTS_PER_ACK || sh.windows.ends_burst(&qp.window);
    let at = bth::HEADER_LEN + if imm.is_some() { Headers::IMM_DT.len() } else { 0 };
    let end = at + chunk as usize;
    let Some(out) = buf.get_mut(at..end) else { return Some(None) };
    if let Err(status) = gather(qp, sh, mem, pos, offset, out) {
        completer::fail_at(qp, sh, pos, status);
        return Some(None);
    }
    qp.req.offset += chunk;
    qp.req.psn = psn.next();
    qp.req.since_ack_req = if ack_req { 0 } else { qp.req.since_ack_req + 1 };
    sh.windows.sent(&mut qp.window, ack_req);
    count_sent(qp, sh, psn);
    if last {
        qp.req.next = pos + 1;
        qp.req.offset = 0;
    }
    if let Some(imm) = imm {
        ImmDtRepr(imm).emit(&mut ImmDtPacket::new_unchecked(&mut buf[bth::HEADER_LEN..at]));
    }
    let header = BthRepr {
        opcode: request_opcode(QpType::Rc, op, if last { Position::Last } else { Position::Middle }),
        solicited_event: last && solicited,
        ack_req,
        ..bth(Opcode(0), qp.attr.dest_qp_num, psn)
    };
    let len = short_path_packet(qp, sh, now, buf, header, end);
    Some(Some(Transmit::new(envelope, len, softrdma_wire::Qpn::default(), true)))
}

/// Does the local operations (BIND_MW, LOCAL_INV) at the requester's cursor, as rxe's
/// requester does when it reaches one (`rxe_do_local_ops`): each takes effect then, ahead
/// of the ACKs of what was sent before it, and completes in order: at once if nothing is
/// outstanding before it, else when what is before it completes
/// ([`completer::complete_head`]). Returns whether the requester may go on to the work
/// request after them: not while one waits for its fence, nor after one failed (it then
/// completes in error, in order, and the QP fails; nothing after it is sent).
fn local_ops(qp: &mut Qp, sh: &mut Shared) -> bool {
    loop {
        let pos = qp.req.next;
        if pos >= qp.sq.tail() {
            return true;
        }
        let w = qp.sq.get(pos);
        let op = w.op();
        if !op.is_local() {
            return true;
        }
        if w.started {
            // Done before a go-back-N rewind brought the cursor back: never done twice.
            if w.status != Some(WcStatus::Success) {
                return false;
            }
            qp.req.next = pos + 1;
            continue;
        }
        if qp.state != QpState::Rts {
            return false; // SQD starts nothing new
        }
        // The local invalidate fence (IBA 10.6.5.1), which rxe makes mandatory: every
        // earlier work request has completed. IBV_SEND_FENCE: every earlier READ and atomic.
        let fenced = matches!(op, SendOp::LocalInv { .. }) && pos != qp.sq.head();
        if fenced || (w.fence && qp.req.rd_atomic_outstanding > 0) {
            return false;
        }
        let status = match op {
            SendOp::BindMw { mw, rkey, bind } => {
                sh.bind_mw(qp.pd, qp.qpn, mw, rkey.0, &bind).err().map(|_| WcStatus::MwBindErr)
            }
            SendOp::LocalInv { rkey } => {
                sh.invalidate(qp.pd, qp.qpn, rkey.0, false).err().map(|_| WcStatus::LocQpOpErr)
            }
            _ => unreachable!("is_local"),
        }
        .unwrap_or(WcStatus::Success);
        let psn = qp.req.psn;
        let w = qp.sq.get_mut(pos);
        w.started = true;
        w.first_psn = psn;
        w.npkts = 0;
        w.status = Some(status);
        match (pos == qp.sq.head(), status) {
            // complete_head moves the cursor past it.
            (true, WcStatus::Success) => completer::complete_head(qp, sh, status),
            (true, _) => {
                completer::fail(qp, sh, status);
                return false;
            }
            (false, WcStatus::Success) => qp.req.next = pos + 1,
            (false, _) => return false,
        }
    }
}

/// Writes into `out` where bytes `offset .. offset + len` of send WQE `pos` are, as
/// [`Piece`]s, each SGE's part checked against its local key as [`gather`] checks it.
/// Returns the bytes written.
fn pieces(qp: &Qp, sh: &Shared, pos: u64, offset: u32, len: u32, out: &mut [u8]) -> Result<u32, WcStatus> {
    let mut written = 0usize;
    crate::sgl::for_each_part(sh, qp.pd, &qp.sq.get(pos).sges, offset, len, Access(0), |at, _, n| {
        let slot = out.get_mut(written..written + reference::PIECE_LEN).ok_or(WcStatus::LocLenErr)?;
        Piece { addr: at, len: n }.emit(slot);
        written += reference::PIECE_LEN;
        Ok(())
    })?;
    Ok(written as u32)
}

/// Copies `out.len()` bytes from byte `offset` of send WQE `pos` into `out`, each SGE's
/// bytes from where its region has them.
fn gather<M: Memory + ?Sized>(
    qp: &Qp,
    sh: &Shared,
    mem: &mut M,
    pos: u64,
    offset: u32,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    let w = qp.sq.get(pos);
    if w.is_inline {
        out.copy_from_slice(&w.inline[offset as usize..offset as usize + out.len()]);
        return Ok(());
    }
    crate::sgl::for_each_part(sh, qp.pd, &w.sges, offset, out.len() as u32, Access(0), |at, from, n| {
        payload_from(qp, sh, mem, at, &mut out[from as usize..(from + n) as usize]).map_err(|_| WcStatus::LocProtErr)
    })
}

/// Puts the bytes at `addr` into a payload, `out`: by [`Memory::gather`] where nothing reads
/// them before they leave (the runtime computes the ICRC, and the QP seals nothing), by
/// [`Memory::read`] otherwise.
fn payload_from<M: Memory + ?Sized>(
    qp: &Qp,
    sh: &Shared,
    mem: &mut M,
    addr: u64,
    out: &mut [u8],
) -> Result<(), MemoryFault> {
    if qp.keys.is_none() && sh.config.defer_icrc { mem.gather(addr, out) } else { mem.read(addr, out) }
}
