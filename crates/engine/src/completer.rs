//! The completer: what the requester learns from ACKs, NAKs and responses.
//!
//! RC completions are strictly in order. An ACK for PSN `p` is cumulative: it completes
//! every SEND and WRITE whose last PSN is at or before `p`. READs and atomics complete only
//! with their response; an ACK past a READ that has not been answered means the response
//! was lost (IBA 9.7.5.1.5, "implied NAK"), and the requester retries it.

use core::time::Duration;

use softrdma_wire::opcode::Position;
use softrdma_wire::{NakCode, Psn, PsnWindow, Qpn, Syndrome};

use crate::Instant;
use crate::engine::{KeyError, Shared};
use crate::memory::Memory;
use crate::qp::{Carriage, InMessage, Qp};
use crate::reference::Payload;
use crate::verbs::{AsyncEvent, Event, QpState, SendOp, Wc, WcOpcode, WcStatus, local_ack_timeout};

/// The completion of a WR flushed by the error state.
pub(crate) fn flush_wc(qpn: Qpn, wr_id: u64, opcode: WcOpcode) -> Wc {
    error_wc(qpn, wr_id, opcode, WcStatus::WrFlushErr)
}

/// An error completion: only `wr_id`, `status`, `opcode` and `qp_num` mean anything.
pub(crate) fn error_wc(qpn: Qpn, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Wc {
    Wc {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: Qpn::default(),
        grh: None,
        solicited: false,
        completed_at: None,
    }
}

/// Reports the send WQE at the head and retires it. Successful unsignaled WRs retire
/// silently; errors always complete (IBA 10.8.3.1). Local operations the requester already
/// did right after it (`transmit::local_ops`) complete now too, in order: with success, or
/// with their error, which fails the QP.
pub(crate) fn complete_head(qp: &mut Qp, sh: &mut Shared, status: WcStatus) {
    retire_head(qp, sh, status);
    if status == WcStatus::Success {
        while !qp.sq.is_empty() {
            let w = qp.sq.get(qp.sq.head());
            // A local operation done, or a WQE the requester found in error (fail_at).
            let failed = w.status.is_some_and(|s| s != WcStatus::Success);
            if !(failed || w.op().is_local() && w.started) {
                break;
            }
            match w.status {
                Some(WcStatus::Success) | None => retire_head(qp, sh, WcStatus::Success),
                Some(error) => {
                    fail(qp, sh, error);
                    return;
                }
            }
        }
    }
    qp.req.skip_to(qp.sq.head());
    check_drained(qp, sh);
    if !qp.sq.is_empty() && qp.sq.get(qp.sq.head()).op().is_local() {
        sh.schedule(qp); // a LOCAL_INV waits to be at the head (its fence)
    }
}

/// Reports the head send WQE with `status` and pops it.
fn retire_head(qp: &mut Qp, sh: &mut Shared, status: WcStatus) {
    let pos = qp.sq.head();
    let wqe = qp.sq.get(pos);
    let op = wqe.op();
    if op.is_read_or_atomic() && wqe.started {
        qp.req.read_atomic_done();
    }
    if wqe.signaled || status != WcStatus::Success {
        let wc = Wc {
            wr_id: wqe.wr_id,
            status,
            opcode: op.wc_opcode(),
            byte_len: if status == WcStatus::Success { wqe.length } else { 0 },
            imm_data: None,
            invalidated_rkey: None,
            qp_num: qp.qpn,
            src_qp: Qpn::default(),
            grh: None,
            solicited: false,
            completed_at: None,
        };
        sh.push_cqe(qp.send_cq, wc);
    }
    qp.sq.pop();
}

/// In SQD, once nothing started is outstanding, raises `IBV_EVENT_SQ_DRAINED` if the
/// application asked for it (IBA 11.6.3, `IBV_QP_EN_SQD_ASYNC_NOTIFY`).
pub(crate) fn check_drained(qp: &mut Qp, sh: &mut Shared) {
    if qp.state != QpState::Sqd || qp.sq_drained_reported {
        return;
    }
    let in_flight = !qp.sq.is_empty() && qp.sq.get(qp.sq.head()).started;
    if !in_flight && qp.req.offset == 0 {
        qp.sq_drained_reported = true;
        if qp.attr.en_sqd_async_notify {
            sh.events.push_back(Event::Async(AsyncEvent::SqDrained(qp.qpn)));
        }
    }
}

/// Moves `qp` to the error state: `failed` (the head WQE's status) completes first, then
/// every other outstanding WR is flushed, receives included.
pub(crate) fn enter_error(qp: &mut Qp, sh: &mut Shared, failed: Option<WcStatus>) {
    let was_error = qp.state == QpState::Err;
    sh.void_grants();
    fail_send_queue(qp, sh, failed);
    qp.state = QpState::Err;
    if let InMessage::Send { wqe, .. } = core::mem::take(&mut qp.resp.current) {
        sh.push_cqe(qp.recv_cq, flush_wc(qp.qpn, wqe.wr_id, WcOpcode::Recv));
    }
    while !qp.rq.is_empty() {
        let wr_id = qp.rq.get(qp.rq.head()).wr_id;
        sh.push_cqe(qp.recv_cq, flush_wc(qp.qpn, wr_id, WcOpcode::Recv));
        qp.rq.pop();
    }
    if qp.srq.is_some() && !was_error {
        sh.events.push_back(Event::Async(AsyncEvent::QpLastWqeReached(qp.qpn)));
    }
    qp.req.flushed(qp.sq.tail());
    qp.comp.retransmit_at = None;
    qp.comp.rnr_wait_until = None;
    qp.resp.out.clear();
    sh.update_timer(qp);
}

/// Fails the QP because of an error its requester found (a local protection or length
/// error, retries exhausted, a NAK): the head WQE completes with `status` and the rest of
/// the send queue flushes. An RC (or XRC) QP goes to ERR, receives flushed too; a UC or UD QP
/// goes to SQE (IBA 10.3.1.5), where its receive side carries on and SQE→RTS resumes sending.
pub(crate) fn fail(qp: &mut Qp, sh: &mut Shared, status: WcStatus) {
    tracing::warn!(
        target: "softrdma::qp",
        qpn = qp.qpn.value(),
        wr_id = (!qp.sq.is_empty()).then(|| qp.sq.get(qp.sq.head()).wr_id),
        peer = ?qp.peer_ip(),
        dest_qpn = qp.attr.dest_qp_num,
        "QP {} {} → {}: send work request failed with {status:?}",
        qp.qpn,
        qp.state,
        if qp.qp_type.is_reliable() { "ERR" } else { "SQE" },
    );
    if qp.qp_type.is_reliable() {
        enter_error(qp, sh, Some(status));
    } else {
        fail_send_queue(qp, sh, Some(status));
        qp.state = QpState::Sqe;
    }
}

/// The requester found a local error in send WQE `pos` (a local key, a length, memory it
/// cannot read) while building its packets. At the head, the QP fails at once. Behind
/// WQEs still waiting for their ACKs, it fails once those have completed as their ACKs
/// say, so that the error completes the WQE that caused it, in order: rxe's requester
/// marks such a WQE and its completer fails the QP when it reaches it at the head (a
/// WRITE in flight before a WRITE whose second SGE cannot be read completes with
/// success, the second with the error). Until then the requester sends nothing new.
pub(crate) fn fail_at(qp: &mut Qp, sh: &mut Shared, pos: u64, status: WcStatus) {
    if pos == qp.sq.head() {
        fail(qp, sh, status);
    } else {
        qp.sq.get_mut(pos).status = Some(status);
    }
}

/// Completes the head send WQE with `failed` (if given), flushes every other one, and
/// leaves the requester with nothing to send: what ERR and SQE have in common.
fn fail_send_queue(qp: &mut Qp, sh: &mut Shared, failed: Option<WcStatus>) {
    if let Some(status) = failed {
        if !qp.sq.is_empty() {
            complete_head(qp, sh, status);
        }
    }
    while !qp.sq.is_empty() {
        let wqe = qp.sq.get(qp.sq.head());
        let wc = flush_wc(qp.qpn, wqe.wr_id, wqe.op().wc_opcode());
        sh.push_cqe(qp.send_cq, wc);
        qp.sq.pop();
    }
    qp.req.flushed(qp.sq.tail());
}

/// The status a failed local key check gives.
pub(crate) fn local_key_status(e: KeyError) -> WcStatus {
    match e {
        KeyError::BadKey | KeyError::Bounds | KeyError::Access => WcStatus::LocProtErr,
    }
}

fn window(qp: &Qp, pos: u64) -> PsnWindow {
    let w = qp.sq.get(pos);
    PsnWindow::new(w.first_psn, w.npkts.max(1)).unwrap_or(PsnWindow::new(w.first_psn, 1).expect("1 fits"))
}

/// Whether `psn` acknowledges something outstanding: in `[comp.psn, req.psn)`.
fn outstanding(qp: &Qp, psn: Psn) -> bool {
    let n = qp.comp.psn.distance_to(qp.req.psn);
    n > 0 && PsnWindow::new(qp.comp.psn, n as u32).is_some_and(|w| w.contains(psn))
}

/// Completes, in order, the SENDs and WRITEs whose last PSN is before `limit` (or at it,
/// when `inclusive`). Stops at a READ or atomic and returns its position if `limit` lies
/// past its request: that response was lost.
fn retire_acked(qp: &mut Qp, sh: &mut Shared, limit: Psn, inclusive: bool) -> Option<u64> {
    while !qp.sq.is_empty() {
        let pos = qp.sq.head();
        let wqe = qp.sq.get(pos);
        if !wqe.started || wqe.op().is_local() {
            // A local operation at the head is done (complete_head retires those that
            // follow what it completes) or waits for the requester: no ACK covers it.
            return None;
        }
        let last = wqe.last_psn();
        let covered = if inclusive { !last.is_after(limit) } else { last.is_before(limit) };
        if wqe.op().is_read_or_atomic() {
            let request_covered =
                if inclusive { !wqe.first_psn.is_after(limit) } else { wqe.first_psn.is_before(limit) };
            return request_covered.then_some(pos);
        }
        if !covered {
            return None;
        }
        complete_head(qp, sh, WcStatus::Success);
    }
    None
}

fn progress(qp: &mut Qp, now: Instant, acked_through: Psn) {
    if qp.comp.psn.distance_to(acked_through.next()) > 0 {
        qp.comp.psn = acked_through.next();
        qp.comp.retry_started = false;
    }
    qp.comp.retry_left = qp.attr.retry_cnt;
    qp.comp.rnr_retry_left = qp.attr.rnr_retry;
    rearm(qp, now);
}

/// The local ACK timer runs while anything is unacknowledged.
pub(crate) fn rearm(qp: &mut Qp, now: Instant) {
    let unacked = qp.comp.psn != qp.req.psn || qp.req.rd_atomic_outstanding > 0;
    qp.comp.retransmit_at = match local_ack_timeout(qp.attr.timeout) {
        Some(t) if unacked && qp.qp_type.is_reliable() => Some(now + t),
        _ => None,
    };
}

/// Rewinds the requester to resend from `psn` (go-back-N), restarting mid-message where
/// needed; a partly answered READ is reissued for what is missing.
pub(crate) fn retry_from(qp: &mut Qp, sh: &mut Shared, psn: Psn) {
    let mtu = qp.mtu();
    let mut pos = qp.sq.head();
    while pos < qp.req.next || (pos == qp.req.next && pos < qp.sq.tail() && qp.sq.get(pos).started) {
        // A local operation occupies no PSN (its window would be the next message's).
        if !qp.sq.get(pos).op().is_local() && window(qp, pos).contains(psn) {
            break;
        }
        pos += 1;
    }
    if pos >= qp.sq.tail() || !qp.sq.get(pos).started || qp.sq.get(pos).op().is_local() {
        return;
    }
    // WQEs after the retry point are sent again from scratch; local operations done
    // among them are not done again (rxe's req_retry skips them too).
    for later in pos + 1..qp.sq.tail() {
        let w = qp.sq.get_mut(later);
        if w.started && !w.op().is_local() {
            w.started = false;
            if w.op().is_read_or_atomic() {
                qp.req.read_atomic_done();
            }
        }
    }
    let w = qp.sq.get(pos);
    let (offset, from) = match w.op() {
        SendOp::RdmaRead { .. } => {
            let done_pkts = w.read_done / w.unit(mtu);
            (w.read_done, w.first_psn.wrapping_add(done_pkts))
        }
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } | SendOp::AtomicWrite { .. } | SendOp::Flush { .. } => {
            (0, w.first_psn)
        }
        _ => {
            let k = w.first_psn.distance_to(psn).max(0) as u32;
            (k * w.unit(mtu), psn)
        }
    };
    qp.req.rewind(pos, offset, from);
    sh.schedule(qp);
}

/// Starts a retry sequence from `psn` unless one is under way, spending one of `retry_cnt`;
/// with none left the QP fails with RETRY_EXC_ERR. Returns whether the QP is still alive.
fn start_retry(qp: &mut Qp, sh: &mut Shared, psn: Psn) -> bool {
    if qp.comp.retry_started {
        return true;
    }
    if qp.comp.retry_left == 0 {
        fail(qp, sh, WcStatus::RetryExcErr);
        return false;
    }
    qp.comp.retry_left -= 1;
    qp.comp.retry_started = true;
    retry_from(qp, sh, psn);
    true
}

/// An ACKNOWLEDGE (ACK, RNR NAK or NAK) for `psn`.
pub(crate) fn handle_ack(qp: &mut Qp, sh: &mut Shared, now: Instant, psn: Psn, syndrome: Syndrome) {
    match syndrome {
        Syndrome::Ack { .. } => {
            if !outstanding(qp, psn) {
                return; // stale or duplicate ACK (IBA 9.7.5.1.3)
            }
            if retire_acked(qp, sh, psn, true).is_some() {
                // An implied NAK: the READ or atomic at the head was answered, or its
                // answer would have come before this ACK, so the answer was lost.
                retry_lost_answer(qp, sh, now);
                return;
            }
            progress(qp, now, psn);
            sh.schedule(qp);
        }
        Syndrome::RnrNak(timer) => {
            sh.counters.rnr_naks_rcvd += 1;
            qp.counters.rnr_naks_rcvd += 1;
            if !outstanding(qp, psn) {
                return;
            }
            let _ = retire_acked(qp, sh, psn, false);
            if qp.comp.rnr_retry_left == 0 {
                fail(qp, sh, WcStatus::RnrRetryExcErr);
                return;
            }
            if qp.comp.rnr_retry_left != 7 {
                qp.comp.rnr_retry_left -= 1; // 7 means retry forever (IBA 9.7.5.2.8)
            }
            tracing::debug!(
                target: "softrdma::qp",
                qpn = qp.qpn.value(),
                psn = psn.value(),
                wait_us = timer.delay_us(),
                rnr_retries_left = qp.comp.rnr_retry_left,
                "QP {}: RNR NAK (the peer had no receive posted): waiting",
                qp.qpn,
            );
            qp.comp.rnr_wait_until = Some(now + Duration::from_micros(u64::from(timer.delay_us())));
            qp.comp.retransmit_at = None;
            retry_from(qp, sh, psn);
            sh.update_timer(qp);
        }
        Syndrome::Nak(code) => {
            sh.counters.naks_rcvd += 1;
            qp.counters.naks_rcvd += 1;
            if !outstanding(qp, psn) {
                return;
            }
            let lost_answer = retire_acked(qp, sh, psn, false).is_some();
            if lost_answer {
                // The request NAKed comes after a READ or atomic whose answer was lost:
                // that one is asked again first, as rxe's completer does (its check_psn:
                // a response past a READ's last PSN is a retry). After a fatal NAK the
                // error belongs to the request NAKed, not to it; the responder, now in
                // error, will not answer: the READ ends in RETRY_EXC_ERR, the NAKed
                // request flushed. After a sequence error the go-back-N starts there, not
                // at the NAKed PSN: moving `comp.psn` past the READ would make its
                // answer, when it came, look stale, and the READ would be asked for until
                // the retries ran out.
                retry_lost_answer(qp, sh, now);
                sh.update_timer(qp);
                return;
            }
            match code {
                NakCode::PsnSequenceError => {
                    if qp.comp.psn.distance_to(psn) > 0 {
                        qp.comp.psn = psn; // everything before the NAKed PSN arrived
                        qp.comp.retry_started = false;
                        // Forward progress renews the retry budget, which is for retries
                        // that get nowhere (rxe's comp.retry_cnt reset on progress): on a
                        // lossy link nearly every window ends in a NAK, yet each advances.
                        qp.comp.retry_left = qp.attr.retry_cnt;
                    }
                    if start_retry(qp, sh, psn) {
                        rearm(qp, now);
                    }
                }
                NakCode::InvalidRequest => fail(qp, sh, WcStatus::RemInvReqErr),
                NakCode::RemoteAccessError => fail(qp, sh, WcStatus::RemAccessErr),
                _ => fail(qp, sh, WcStatus::RemOpErr),
            }
            sh.update_timer(qp);
        }
        Syndrome::Reserved(_) => {}
    }
}

/// The READ or atomic at the head was answered, but the answer was lost (an ACK or NAK
/// came for a later request): it is asked again from what is missing (IBA 9.7.5.1.5).
fn retry_lost_answer(qp: &mut Qp, sh: &mut Shared, now: Instant) {
    let w = qp.sq.get(qp.sq.head());
    let resume = w.first_psn.wrapping_add(w.read_done / w.unit(qp.mtu()));
    if qp.comp.psn.distance_to(resume) > 0 {
        qp.comp.psn = resume;
        qp.comp.retry_started = false;
        qp.comp.retry_left = qp.attr.retry_cnt; // progress, as for a sequence-error NAK
    }
    if start_retry(qp, sh, resume) {
        rearm(qp, now);
    }
}

/// An RDMA READ response packet.
pub(crate) fn handle_read_response<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    psn: Psn,
    position: Position,
    data: Payload<'_>,
) {
    if !outstanding(qp, psn) {
        return;
    }
    // A response implicitly acknowledges everything sent before its READ (IBA 9.7.5.1.2).
    let _ = retire_acked(qp, sh, psn, false);
    if qp.sq.is_empty() {
        return;
    }
    let pos = qp.sq.head();
    let mtu = qp.mtu();
    let w = qp.sq.get(pos);
    // An ATOMIC_WRITE is answered as a READ of nothing.
    let (SendOp::RdmaRead { .. } | SendOp::AtomicWrite { .. } | SendOp::Flush { .. }) = w.op() else { return };
    if !w.started || !window(qp, pos).contains(psn) {
        return;
    }
    // A READ sent by reference is answered by reference, a segment per response.
    let unit = w.unit(mtu);
    if data.by_reference() != (w.carriage == Carriage::Reference) {
        fail(qp, sh, WcStatus::BadRespErr);
        return;
    }
    let expected = w.first_psn.wrapping_add(w.read_done / unit);
    if psn != expected {
        if psn.is_after(expected) {
            // Responses were lost: ask again for the rest (IBA 9.7.5.1.5).
            start_retry(qp, sh, expected);
        }
        return;
    }
    let remaining = w.length - w.read_done;
    let len = data.len();
    let ok_len = match position {
        Position::First | Position::Middle => len == unit && len < remaining,
        Position::Last => len == remaining && w.read_done > 0,
        Position::Only => len == remaining && w.read_done == 0,
    };
    if !ok_len {
        fail(qp, sh, WcStatus::BadRespErr);
        return;
    }
    if let Err(status) = scatter(qp, sh, mem, pos, w.read_done, data) {
        fail(qp, sh, status);
        return;
    }
    if data.by_reference() {
        sh.counters.rcvd_by_reference += 1;
    }
    let w = qp.sq.get_mut(pos);
    w.read_done += len;
    let last = w.last_psn();
    if position.ends_message() {
        complete_head(qp, sh, WcStatus::Success);
        progress(qp, now, last);
        sh.schedule(qp); // a fence or the READ limit may have held the next WQE
    } else {
        progress(qp, now, psn);
    }
    sh.update_timer(qp);
}

/// An ATOMIC ACKNOWLEDGE.
pub(crate) fn handle_atomic_ack<M: Memory + ?Sized>(
    qp: &mut Qp,
    sh: &mut Shared,
    mem: &mut M,
    now: Instant,
    psn: Psn,
    original: u64,
) {
    if !outstanding(qp, psn) {
        return;
    }
    let _ = retire_acked(qp, sh, psn, false);
    if qp.sq.is_empty() {
        return;
    }
    let pos = qp.sq.head();
    let w = qp.sq.get(pos);
    if !w.op().is_atomic() || !w.started || w.first_psn != psn {
        return;
    }
    if let Err(status) = scatter(qp, sh, mem, pos, 0, Payload::Bytes(&original.to_ne_bytes())) {
        fail(qp, sh, status);
        return;
    }
    complete_head(qp, sh, WcStatus::Success);
    progress(qp, now, psn);
    sh.schedule(qp);
    sh.update_timer(qp);
}

/// Writes `data` at byte `offset` of the local buffers of send WQE `pos` (READ data, an
/// atomic's original value), after checking each SGE's key for local write.
fn scatter<M: Memory + ?Sized>(
    qp: &Qp,
    sh: &Shared,
    mem: &mut M,
    pos: u64,
    offset: u32,
    data: Payload<'_>,
) -> Result<(), WcStatus> {
    crate::sgl::scatter(sh, qp.pd, mem, &qp.sq.get(pos).sges, offset, data)
}

/// The local ACK timer of `qp` fired.
pub(crate) fn handle_retransmit_timeout(qp: &mut Qp, sh: &mut Shared, now: Instant) {
    qp.comp.retransmit_at = None;
    if qp.state != QpState::Rts && qp.state != QpState::Sqd {
        return;
    }
    sh.counters.ack_timeouts += 1;
    qp.counters.ack_timeouts += 1;
    tracing::debug!(
        target: "softrdma::qp",
        qpn = qp.qpn.value(),
        psn = qp.comp.psn.value(),
        retries_left = qp.comp.retry_left,
        peer = ?qp.peer_ip(),
        "QP {}: ACK timeout",
        qp.qpn,
    );
    if qp.comp.retry_left == 0 {
        fail(qp, sh, WcStatus::RetryExcErr);
        return;
    }
    qp.comp.retry_left -= 1;
    qp.comp.retry_started = true;
    let from = if qp.sq.is_empty() {
        qp.comp.psn
    } else {
        let w = qp.sq.get(qp.sq.head());
        if w.op().is_read_or_atomic() && w.started {
            w.first_psn.wrapping_add(w.read_done / w.unit(qp.mtu()))
        } else {
            qp.comp.psn
        }
    };
    retry_from(qp, sh, from);
    rearm(qp, now);
    sh.update_timer(qp);
}
