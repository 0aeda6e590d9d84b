//! XRC on a `Pair`: A's XRC INI QP talks to B's XRC TGT QP, whose every request names, in
//! its XRCETH, the XRC SRQ that serves it: that SRQ's receive, its PD for the memory
//! checks, its CQ for the receive completion. What lands where, what is refused and how,
//! what goes on the wire, which resources hold which, and the state table's XRC columns.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::qp_state::ModifyQpError;
use softrdma_engine::*;
use softrdma_wire::{Gid, NakCode, Opcode, Qpn, RocePacket, RoceRepr, Syndrome, XrcEthRepr};

// XRC opcodes (IBA Table 38: RC's at base 0xA0), which the wire crate has no names for.
const XRC_SEND_MIDDLE: Opcode = Opcode(0xa1);
const XRC_SEND_LAST: Opcode = Opcode(0xa2);
const XRC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0xb0);
const XRC_ACKNOWLEDGE: Opcode = Opcode(0xb1);
const XRC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0xb2);

/// Where B's second XRC SRQ's PD has its region (an offset in B's memory).
const REGION: u64 = 0x8_0000;
const REGION_LEN: u64 = 0x4_0000;

/// One of B's XRC SRQs, with its PD, its CQ and a region of its PD.
#[derive(Clone, Copy, Debug)]
struct Target {
    srq: SrqId,
    cq: CqId,
    keys: MrKeys,
}

/// A pair whose `a.qp` is an XRC INI QP and `b.qp` an XRC TGT QP of domain `xrcd`, with
/// two XRC SRQs of the domain at B: `t[0]` in B's own PD (its region is all of B's memory,
/// `b.mr`), `t[1]` in a second PD (its region `REGION..REGION + REGION_LEN`), each with
/// its own CQ. B's own CQ (`b.cq`) serves nothing XRC.
struct Xrc {
    pair: Pair,
    xrcd: XrcdId,
    t: [Target; 2],
}

fn ini_attr(n: &Node) -> QpInitAttr {
    QpInitAttr { cap: QpCap { max_recv_wr: 0, max_recv_sge: 0, ..QpCap::default() }, ..init_attr(n, QpType::XrcIni) }
}

fn xrc(mtu: Mtu) -> Xrc {
    let mut a = node([10, 0, 0, 1], 1, QpType::Rc, QpCap::default());
    let mut b = node([10, 0, 0, 2], 2, QpType::Rc, QpCap::default());
    a.qp = a.engine.create_qp(&ini_attr(&a)).unwrap();
    let xrcd = b.engine.alloc_xrcd().unwrap();
    b.qp = b.engine.create_xrc_tgt_qp(xrcd).unwrap();
    let cq0 = b.engine.create_cq(256).unwrap();
    let srq0 = b.engine.create_xrc_srq(b.pd, xrcd, cq0, 32, 2).unwrap();
    let pd1 = b.engine.alloc_pd();
    let cq1 = b.engine.create_cq(256).unwrap();
    let keys1 = b.engine.reg_mr(pd1, BASE + REGION, REGION_LEN, Access::ALL).unwrap();
    let srq1 = b.engine.create_xrc_srq(pd1, xrcd, cq1, 32, 2).unwrap();
    let t = [Target { srq: srq0, cq: cq0, keys: b.mr }, Target { srq: srq1, cq: cq1, keys: keys1 }];
    let (aq, bq, aa, ba) = (a.qp, b.qp, a.addr, b.addr);
    connect(&mut a, bq, ba, QpType::XrcIni, mtu, &|_| {});
    connect(&mut b, aq, aa, QpType::XrcTgt, mtu, &|_| {});
    Xrc { pair: wire(a, b), xrcd, t }
}

/// A signaled XRC WR to `srq` at the target.
fn xwr(wr_id: u64, op: SendOp, sg_list: &[Sge], srq: SrqId) -> SendWr<'_> {
    SendWr { xrc_srqn: Some(srq.0), ..wr(wr_id, op, sg_list) }
}

impl Xrc {
    /// Posts a receive of `len` bytes at B offset `offset` to SRQ `k`, keyed in its PD.
    fn recv(&mut self, k: usize, wr_id: u64, offset: u64, len: u32) {
        let sge = Sge { addr: BASE + offset, length: len, lkey: self.t[k].keys.lkey };
        self.pair.b.engine.post_srq_recv(self.t[k].srq, &[RecvWr { wr_id, sg_list: &[sge] }]).unwrap();
    }
    /// Posts `op` on the INI QP, with `len` bytes of A's memory from `offset`, to SRQ `k`.
    fn post(&mut self, wr_id: u64, op: SendOp, offset: u64, len: u32, k: usize) {
        let sge = self.pair.a.sge(offset, len);
        let sg: &[Sge] = if len == 0 { &[] } else { std::slice::from_ref(&sge) };
        self.pair.a.post_send(xwr(wr_id, op, sg, self.t[k].srq));
    }
    /// The completions on SRQ `k`'s CQ.
    fn wcs(&mut self, k: usize) -> Vec<Wc> {
        let cq = self.t[k].cq;
        std::iter::from_fn(|| self.pair.b.engine.poll_cq(cq)).collect()
    }
    fn tgt_state(&self) -> Option<QpState> {
        self.pair.b.engine.qp_state(self.pair.b.qp)
    }
}

/// `(wr_id, status, opcode, byte_len, qp_num, imm_data)` of a completion.
type RecvSummary = (u64, WcStatus, WcOpcode, u32, Qpn, Option<[u8; 4]>);

fn recvs(wcs: &[Wc]) -> Vec<RecvSummary> {
    wcs.iter().map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num, w.imm_data)).collect()
}

fn sends(wcs: &[Wc]) -> Vec<(u64, WcStatus, WcOpcode)> {
    wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

// ---- SENDs: the named SRQ's receive, buffers and CQ ------------------------------------------

#[test]
fn sends_land_in_the_named_srqs_buffers_and_complete_on_its_cq() {
    let mut x = xrc(Mtu::Mtu1024);
    let tgt = x.pair.b.qp;
    let (m0, m1, m2) = (pattern(3000, 1), pattern(700, 2), pattern(64, 3));
    x.pair.a.fill(0, &m0);
    x.pair.a.fill(0x1000, &m1);
    x.pair.a.fill(0x2000, &m2);
    x.recv(0, 10, 0x1_0000, 4096);
    x.recv(0, 11, 0x1_2000, 4096);
    x.recv(1, 20, REGION, 4096);
    x.recv(1, 21, REGION + 0x2000, 4096);
    x.pair.b.engine.arm_srq_limit(x.t[1].srq, 2).unwrap();
    let before = x.pair.b.mem.clone();

    x.post(1, SendOp::Send, 0, 3000, 0);
    x.post(2, SendOp::Send, 0x1000, 700, 1);
    x.post(3, SendOp::SendWithImm { imm: [9, 8, 7, 6] }, 0x2000, 64, 0);
    x.pair.drive();

    let ok = WcStatus::Success;
    assert_eq!(
        sends(&x.pair.a.poll_all()),
        [(1, ok, WcOpcode::Send), (2, ok, WcOpcode::Send), (3, ok, WcOpcode::Send)]
    );
    assert_eq!(
        recvs(&x.wcs(0)),
        [(10, ok, WcOpcode::Recv, 3000, tgt, None), (11, ok, WcOpcode::Recv, 64, tgt, Some([9, 8, 7, 6]))],
        "SRQ 0 took the two messages that named it, in order, on its own CQ"
    );
    assert_eq!(recvs(&x.wcs(1)), [(20, ok, WcOpcode::Recv, 700, tgt, None)], "SRQ 1 took the one that named it");
    assert_eq!(x.pair.b.poll_all(), [], "B's other CQ completes nothing");
    // Exactly the three messages changed B's memory, each in its SRQ's first free receive.
    let mut want = before;
    want.slice_mut(BASE + 0x1_0000, 3000).copy_from_slice(&m0);
    want.slice_mut(BASE + 0x1_2000, 64).copy_from_slice(&m2);
    want.slice_mut(BASE + REGION, 700).copy_from_slice(&m1);
    assert!(x.pair.b.mem == want, "B's memory is the model's");
    // SRQ 1 kept one receive: fewer than its limit of 2, once.
    assert_eq!(x.pair.b.events(), [Event::Async(AsyncEvent::SrqLimitReached(x.t[1].srq))]);

    // Its second receive is still there, for the next message that names it.
    x.post(4, SendOp::Send, 0x1000, 5, 1);
    x.pair.drive();
    assert_eq!(recvs(&x.wcs(1)), [(21, ok, WcOpcode::Recv, 5, tgt, None)]);
    assert_eq!(x.pair.b.read(REGION + 0x2000, 5), &m1[..5]);
}

#[test]
fn two_tgt_qps_of_one_domain_share_its_srqs() {
    // XRC's point: one TGT QP per sending QP, the receives shared. A second INI QP talks to
    // a second TGT QP of the same domain; both fill SRQ 0, whose CQ tells them apart.
    let mut x = xrc(Mtu::Mtu1024);
    let ini2 = x.pair.a.engine.create_qp(&ini_attr(&x.pair.a)).unwrap();
    let tgt2 = x.pair.b.engine.create_xrc_tgt_qp(x.xrcd).unwrap();
    let (aa, ba) = (x.pair.a.addr, x.pair.b.addr);
    connect_qp(&mut x.pair.a.engine, ini2, tgt2, ba, QpType::XrcIni, Mtu::Mtu1024, &|_| {});
    connect_qp(&mut x.pair.b.engine, tgt2, ini2, aa, QpType::XrcTgt, Mtu::Mtu1024, &|_| {});
    for i in 0..4 {
        x.recv(0, 10 + i, 0x1_0000 + 0x100 * i, 0x100);
    }
    x.pair.a.fill(0, b"from the first");
    x.pair.a.fill(0x100, b"from the second");
    let (s1, s2) = (x.pair.a.sge(0, 14), x.pair.a.sge(0x100, 15));
    let srq = x.t[0].srq;
    x.pair.a.post_send(xwr(1, SendOp::Send, &[s1], srq));
    x.pair.a.engine.post_send(ini2, &[xwr(2, SendOp::Send, &[s2], srq)], &x.pair.a.mem).unwrap();
    x.pair.drive();

    let got: Vec<(u64, Qpn, u32)> = x.wcs(0).iter().map(|w| (w.wr_id, w.qp_num, w.byte_len)).collect();
    assert_eq!(got, [(10, x.pair.b.qp, 14), (11, tgt2, 15)]);
    assert_eq!(x.pair.b.read(0x1_0000, 14), b"from the first");
    assert_eq!(x.pair.b.read(0x1_0100, 15), b"from the second");
    let a_wcs = x.pair.a.poll_all();
    assert_eq!(
        a_wcs.iter().map(|w| (w.wr_id, w.qp_num, w.status)).collect::<Vec<_>>(),
        [(1, x.pair.a.qp, WcStatus::Success), (2, ini2, WcStatus::Success)]
    );
}

#[test]
fn a_receive_is_checked_in_its_srqs_pd() {
    // A receive on SRQ 1 whose buffer is keyed with an lkey of B's other PD (SRQ 0's): the
    // SEND that takes it cannot be placed.
    let mut x = xrc(Mtu::Mtu1024);
    let sge = Sge { addr: BASE + REGION, length: 64, lkey: x.t[0].keys.lkey };
    x.pair.b.engine.post_srq_recv(x.t[1].srq, &[RecvWr { wr_id: 5, sg_list: &[sge] }]).unwrap();
    let before = x.pair.b.mem.clone();
    x.pair.a.fill(0, b"misplaced");
    x.post(1, SendOp::Send, 0, 9, 1);
    x.pair.drive();
    assert!(x.pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::RemoteOperationalError))));
    assert_eq!(sends(&x.pair.a.poll_all()), [(1, WcStatus::RemOpErr, WcOpcode::Send)]);
    assert_eq!(recvs(&x.wcs(1)).iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(5, WcStatus::LocProtErr)]);
    assert!(x.pair.b.mem == before, "nothing was written");
    assert_eq!(x.tgt_state(), Some(QpState::Err));
}

// ---- RDMA through the TGT QP: the named SRQ's PD ---------------------------------------------

#[test]
fn rdma_and_atomics_use_the_named_srqs_pd() {
    let mut x = xrc(Mtu::Mtu256);
    let tgt = x.pair.b.qp;
    let (rkey0, rkey1) = (x.t[0].keys.rkey, x.t[1].keys.rkey);
    let (w, wi, r, w0) = (pattern(1000, 4), pattern(300, 5), pattern(900, 6), pattern(40, 7));
    x.pair.a.fill(0, &w);
    x.pair.a.fill(0x1000, &wi);
    x.pair.a.fill(0x2000, &w0);
    x.pair.b.fill(REGION + 0x2000, &r);
    x.pair.b.fill(REGION + 0x3000, &7u64.to_ne_bytes());
    x.pair.b.fill(REGION + 0x3008, &40u64.to_ne_bytes());
    x.recv(1, 30, REGION + 0x8000, 64); // for the WRITE_WITH_IMM
    x.recv(0, 31, 0x1_0000, 64); // SRQ 0's: nothing here names SRQ 0 but a WRITE
    let before = x.pair.b.mem.clone();

    let at = |off: u64| BASE + REGION + off;
    x.post(1, SendOp::RdmaWrite { remote_addr: at(0x1000), rkey: rkey1 }, 0, 1000, 1);
    x.post(2, SendOp::RdmaWriteWithImm { remote_addr: at(0x4000), rkey: rkey1, imm: [1, 2, 3, 4] }, 0x1000, 300, 1);
    x.post(3, SendOp::RdmaRead { remote_addr: at(0x2000), rkey: rkey1 }, 0x4_0000, 900, 1);
    x.post(4, SendOp::FetchAdd { remote_addr: at(0x3000), rkey: rkey1, add: 5 }, 0x5_0000, 8, 1);
    x.post(5, SendOp::CompareSwap { remote_addr: at(0x3008), rkey: rkey1, compare: 40, swap: 41 }, 0x5_0008, 8, 1);
    // The same QP, the next request naming SRQ 0: SRQ 0's PD's key now.
    x.post(6, SendOp::RdmaWrite { remote_addr: BASE + 0x2_0000, rkey: rkey0 }, 0x2000, 40, 0);
    x.pair.drive();

    let ok = WcStatus::Success;
    assert_eq!(
        sends(&x.pair.a.poll_all()),
        [
            (1, ok, WcOpcode::RdmaWrite),
            (2, ok, WcOpcode::RdmaWrite),
            (3, ok, WcOpcode::RdmaRead),
            (4, ok, WcOpcode::FetchAdd),
            (5, ok, WcOpcode::CompSwap),
            (6, ok, WcOpcode::RdmaWrite),
        ]
    );
    assert_eq!(x.pair.a.read(0x4_0000, 900), &r[..], "READ");
    assert_eq!(x.pair.a.read(0x5_0000, 8), 7u64.to_ne_bytes(), "FETCH_ADD returns the old value");
    assert_eq!(x.pair.a.read(0x5_0008, 8), 40u64.to_ne_bytes(), "CMP_SWAP returns the old value");
    let mut want = before;
    want.slice_mut(at(0x1000), 1000).copy_from_slice(&w);
    want.slice_mut(at(0x4000), 300).copy_from_slice(&wi);
    want.slice_mut(at(0x3000), 8).copy_from_slice(&12u64.to_ne_bytes());
    want.slice_mut(at(0x3008), 8).copy_from_slice(&41u64.to_ne_bytes());
    want.slice_mut(BASE + 0x2_0000, 40).copy_from_slice(&w0);
    assert!(x.pair.b.mem == want, "B's memory is the model's (no data to the WRITE_IMM's receive buffer)");
    assert_eq!(
        recvs(&x.wcs(1)),
        [(30, ok, WcOpcode::RecvRdmaWithImm, 300, tgt, Some([1, 2, 3, 4]))],
        "the WRITE_WITH_IMM took SRQ 1's receive and completed on SRQ 1's CQ"
    );
    assert_eq!(x.wcs(0), [], "SRQ 0's receive was not taken");
    assert_eq!(x.pair.b.poll_all(), []);
}

#[test]
fn an_rkey_of_a_pd_other_than_the_named_srqs_is_a_remote_access_error() {
    // B's first region (PD 0, all of B's memory) covers the second (PD 1) too: each key
    // would reach the bytes, but only through a request naming an SRQ of its PD.
    for case in ["WRITE", "WRITE_IMM", "READ", "FETCH_ADD", "CMP_SWAP", "WRITE to SRQ 0"] {
        let mut x = xrc(Mtu::Mtu1024);
        let (rkey0, rkey1) = (x.t[0].keys.rkey, x.t[1].keys.rkey);
        x.pair.a.fill(0, &pattern(64, 1));
        x.pair.b.fill(REGION, &pattern(64, 2));
        x.recv(0, 50, 0x1_0000, 64);
        x.recv(1, 51, REGION + 0x8000, 64);
        let before = x.pair.b.mem.clone();
        let remote = BASE + REGION;
        // Each names SRQ 1 (PD 1) with PD 0's key, but the last, which names SRQ 0 with PD 1's.
        let (op, len, k) = match case {
            "WRITE" => (SendOp::RdmaWrite { remote_addr: remote, rkey: rkey0 }, 64, 1),
            "WRITE_IMM" => (SendOp::RdmaWriteWithImm { remote_addr: remote, rkey: rkey0, imm: [0; 4] }, 64, 1),
            "READ" => (SendOp::RdmaRead { remote_addr: remote, rkey: rkey0 }, 64, 1),
            "FETCH_ADD" => (SendOp::FetchAdd { remote_addr: remote, rkey: rkey0, add: 1 }, 8, 1),
            "CMP_SWAP" => (SendOp::CompareSwap { remote_addr: remote, rkey: rkey0, compare: 0, swap: 1 }, 8, 1),
            _ => (SendOp::RdmaWrite { remote_addr: remote, rkey: rkey1 }, 64, 0),
        };
        // WRITEs send A's pattern; READs and atomics would bring something back to 0x1000.
        let local = if case.starts_with("WRITE") { 0 } else { 0x1000 };
        x.post(1, op, local, len, k);
        x.post(2, SendOp::Send, 0, 8, 0);
        x.pair.drive();
        assert!(x.pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::RemoteAccessError))), "{case}");
        assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)], "{case}");
        assert!(x.pair.b.mem == before, "{case}: B's memory changed");
        assert_eq!(x.pair.a.read(0x1000, 64), [0; 64], "{case}: nothing came back");
        assert_eq!(x.tgt_state(), Some(QpState::Err), "{case}");
        assert!(x.pair.b.events().contains(&Event::Async(AsyncEvent::QpAccessError(x.pair.b.qp))), "{case}");
        assert_eq!((x.wcs(0), x.wcs(1)), (vec![], vec![]), "{case}: the SRQs' receives stay theirs");
    }
}

// ---- requests that name no SRQ of the domain -------------------------------------------------

#[test]
fn an_xrceth_naming_no_srq_of_the_domain_is_an_invalid_request() {
    for case in ["another domain's XRC SRQ", "a plain SRQ", "a destroyed XRC SRQ", "no SRQ at all"] {
        for op in ["SEND", "WRITE"] {
            let mut x = xrc(Mtu::Mtu1024);
            let b = &mut x.pair.b;
            let other_domain = b.engine.alloc_xrcd().unwrap();
            let other_cq = b.engine.create_cq(16).unwrap();
            let foreign = b.engine.create_xrc_srq(b.pd, other_domain, other_cq, 8, 1).unwrap();
            let plain = b.engine.create_srq(b.pd, 8, 1).unwrap();
            for (srq, wr_id) in [(foreign, 60), (plain, 61)] {
                let sge = b.sge(0x3_0000 + 0x100 * (wr_id - 60), 0x100);
                b.engine.post_srq_recv(srq, &[RecvWr { wr_id, sg_list: &[sge] }]).unwrap();
            }
            let gone = b.engine.create_xrc_srq(b.pd, x.xrcd, other_cq, 8, 1).unwrap();
            b.engine.destroy_srq(gone).unwrap();
            x.recv(0, 62, 0x1_0000, 64);
            x.recv(1, 63, REGION, 64);
            let srqn = match case {
                "another domain's XRC SRQ" => foreign.0,
                "a plain SRQ" => plain.0,
                "a destroyed XRC SRQ" => gone.0,
                _ => 0x00ab_cdef,
            };
            let before = x.pair.b.mem.clone();
            x.pair.a.fill(0, b"nowhere to go");
            let sge = [x.pair.a.sge(0, 13)];
            let rkey = x.pair.b.mr.rkey; // the PD of the foreign and the plain SRQs
            let op = match op {
                "SEND" => SendOp::Send,
                _ => SendOp::RdmaWrite { remote_addr: BASE + 0x3_0000, rkey },
            };
            let bad = SendWr { xrc_srqn: Some(srqn), ..wr(1, op, &sge) };
            x.pair.a.post_send(bad);
            x.post(2, SendOp::Send, 0, 13, 0);
            x.pair.drive();

            let what = format!("{case}, {op:?}");
            assert_eq!(
                outcomes(&x.pair.a.poll_all()),
                [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)],
                "{what}"
            );
            assert_eq!(x.tgt_state(), Some(QpState::Err), "{what}");
            let nak: Vec<Opcode> = x
                .pair
                .sent(false)
                .iter()
                .filter(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::InvalidRequest)))
                .map(|p| p.opcode())
                .collect();
            assert_eq!(nak, [XRC_ACKNOWLEDGE], "{what}: one NAK, an XRC one");
            assert!(x.pair.b.events().contains(&Event::Async(AsyncEvent::QpRequestError(x.pair.b.qp))), "{what}");
            assert!(x.pair.b.mem == before, "{what}: B's memory changed");
            let b = &mut x.pair.b;
            let polled: Vec<Wc> = [other_cq, x.t[0].cq, x.t[1].cq, b.cq]
                .into_iter()
                .flat_map(|cq| std::iter::from_fn(|| b.engine.poll_cq(cq)).collect::<Vec<_>>())
                .collect();
            assert_eq!(polled, [], "{what}: no receive was taken");
        }
    }
}

/// Hands B a copy of `pkt` whose XRCETH names `srqn`, with its ICRC made again.
fn deliver_renamed(pair: &mut Pair, pkt: &Pkt, srqn: u32) {
    let packet = RocePacket::new_checked(&pkt.bytes[..]).unwrap();
    let mut repr = RoceRepr::parse(&packet, &pkt.envelope).unwrap();
    repr.ext.xrceth = Some(XrcEthRepr { srqn });
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit(&pkt.envelope, &mut buf).unwrap();
    let b = &mut pair.b;
    b.engine.handle_datagram(pair.now, &pkt.envelope, &buf, &mut b.mem);
}

#[test]
fn a_message_whose_packets_name_two_srqs_is_an_invalid_request() {
    // A two-packet SEND to SRQ 0 whose LAST is lost; then the LAST comes, naming SRQ 0
    // (the control: it lands) or SRQ 1 (the packets of one message must all name the SRQ
    // its first named).
    for renamed in [false, true] {
        let mut x = xrc(Mtu::Mtu256);
        x.recv(0, 70, 0x1_0000, 1024);
        x.recv(1, 71, REGION, 1024);
        let data = pattern(512, 8);
        x.pair.a.fill(0, &data);
        x.pair.set_filter(|p| !(p.from_a && p.opcode() == XRC_SEND_LAST));
        x.post(1, SendOp::Send, 0, 512, 0);
        x.pair.drive_for(Duration::from_micros(100));
        let err = x.pair.b.engine.destroy_srq(x.t[0].srq).unwrap_err();
        assert!(matches!(err, VerbsError::Busy(_)), "SRQ 0 is in the middle of a message: {err}");

        let last = x.pair.sent(true).into_iter().find(|p| !p.delivered).cloned().expect("the LAST, lost");
        let srqn = if renamed { x.t[1].srq.0 } else { x.t[0].srq.0 };
        deliver_renamed(&mut x.pair, &last, srqn);
        x.pair.drive_for(Duration::from_micros(100));

        if renamed {
            assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, WcStatus::RemInvReqErr)]);
            assert_eq!(x.tgt_state(), Some(QpState::Err));
            let flushed = recvs(&x.wcs(0)).iter().map(|r| (r.0, r.1)).collect::<Vec<_>>();
            assert_eq!(flushed, [(70, WcStatus::WrFlushErr)], "SRQ 0's receive, taken for the message, is flushed");
            assert_eq!(x.wcs(1), [], "SRQ 1's receive is not taken");
            assert_eq!(x.pair.b.read(REGION, 256), [0; 256], "SRQ 1's buffer is untouched");
        } else {
            assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, WcStatus::Success)]);
            assert_eq!(
                recvs(&x.wcs(0)).iter().map(|r| (r.0, r.1, r.3)).collect::<Vec<_>>(),
                [(70, WcStatus::Success, 512)]
            );
            assert_eq!(x.pair.b.read(0x1_0000, 512), &data[..]);
            assert_eq!(x.wcs(1), []);
        }
    }
}

// ---- the wire ----------------------------------------------------------------------------------

#[test]
fn xrc_requests_carry_the_srq_number_and_responses_use_xrc_opcodes() {
    let mut x = xrc(Mtu::Mtu1024);
    let (s0, s1) = (x.t[0].srq.0, x.t[1].srq.0);
    let (ini, tgt) = (x.pair.a.qp, x.pair.b.qp);
    let (rkey0, rkey1) = (x.t[0].keys.rkey, x.t[1].keys.rkey);
    x.recv(0, 1, 0x1_0000, 4096);
    x.recv(1, 2, REGION, 4096);
    x.recv(0, 3, 0x1_2000, 4096);
    x.post(1, SendOp::Send, 0, 3000, 0);
    x.post(2, SendOp::SendWithImm { imm: [1; 4] }, 0, 10, 1);
    x.post(3, SendOp::RdmaWrite { remote_addr: BASE + REGION + 0x1000, rkey: rkey1 }, 0, 100, 1);
    x.post(4, SendOp::RdmaWriteWithImm { remote_addr: BASE + 0x2_0000, rkey: rkey0, imm: [2; 4] }, 0, 100, 0);
    x.post(5, SendOp::RdmaRead { remote_addr: BASE + 0x3_0000, rkey: rkey0 }, 0x4_0000, 2500, 0);
    x.post(6, SendOp::RdmaRead { remote_addr: BASE + REGION, rkey: rkey1 }, 0x5_0000, 100, 1);
    x.post(7, SendOp::FetchAdd { remote_addr: BASE + REGION + 0x3000, rkey: rkey1, add: 1 }, 0x6_0000, 8, 1);
    x.post(8, SendOp::CompareSwap { remote_addr: BASE + 0x3_8000, rkey: rkey0, compare: 0, swap: 1 }, 0x6_0008, 8, 0);
    x.pair.drive();
    assert_eq!(x.pair.a.poll_all().iter().filter(|w| w.status == WcStatus::Success).count(), 8);

    let parse = |p: &Pkt| -> (u8, Option<u32>, Qpn, Option<Syndrome>) {
        let packet = RocePacket::new_checked(&p.bytes[..]).unwrap();
        let repr = RoceRepr::parse(&packet, &p.envelope).expect("a well-formed packet with a good ICRC");
        (repr.bth.opcode.0, repr.ext.xrceth.map(|e| e.srqn), repr.bth.dest_qp, repr.ext.aeth.map(|a| a.syndrome))
    };
    let requests: Vec<_> = x.pair.sent(true).into_iter().map(parse).collect();
    let want: Vec<(u8, Option<u32>, Qpn, Option<Syndrome>)> = [
        (0xa0, s0), // SEND FIRST
        (0xa1, s0), // SEND MIDDLE
        (0xa2, s0), // SEND LAST
        (0xa5, s1), // SEND ONLY WITH IMMEDIATE
        (0xaa, s1), // RDMA WRITE ONLY
        (0xab, s0), // RDMA WRITE ONLY WITH IMMEDIATE
        (0xac, s0), // RDMA READ REQUEST
        (0xac, s1),
        (0xb4, s1), // FETCH_ADD
        (0xb3, s0), // COMPARE_SWAP
    ]
    .into_iter()
    .map(|(op, srqn)| (op, Some(srqn), tgt, None))
    .collect();
    assert_eq!(requests, want, "every request is an XRC opcode whose XRCETH names its SRQ");
    assert!(requests.iter().all(|r| (0xa0..=0xb7).contains(&r.0)));

    let responses: Vec<_> = x.pair.sent(false).into_iter().map(parse).collect();
    assert!(responses.iter().all(|r| r.1.is_none() && r.2 == ini), "responses carry no XRCETH: {responses:?}");
    let acks: Vec<_> = responses.iter().filter(|r| r.0 == 0xb1).collect();
    assert!(!acks.is_empty() && acks.iter().all(|r| matches!(r.3, Some(Syndrome::Ack { .. }))), "{responses:?}");
    let others: Vec<u8> = responses.iter().map(|r| r.0).filter(|&op| op != 0xb1).collect();
    // READ RESPONSE FIRST, MIDDLE, LAST; READ RESPONSE ONLY; two ATOMIC ACKNOWLEDGEs.
    assert_eq!(others, [0xad, 0xae, 0xaf, 0xb0, 0xb2, 0xb2]);
}

// ---- recovery ----------------------------------------------------------------------------------

#[test]
fn lost_packets_are_recovered_and_a_replayed_read_uses_its_own_srqs_pd() {
    // The READ (SRQ 1, PD 1's key) is answered, its response lost; the SEND after it
    // names SRQ 0 and loses its MIDDLE; the FETCH_ADD's answer is lost once. The READ's
    // replay comes after the TGT QP has served SRQ 0 (PD 0): it must read through PD 1.
    let mut x = xrc(Mtu::Mtu256);
    let rkey1 = x.t[1].keys.rkey;
    let r = pattern(100, 3);
    x.pair.b.fill(REGION + 0x100, &r);
    let s = pattern(1024, 4);
    x.pair.a.fill(0, &s);
    x.recv(0, 80, 0x1_0000, 2048);
    x.recv(0, 81, 0x1_1000, 2048);
    let mut dropped = [false; 3];
    x.pair.set_filter(move |p| {
        let i = match p.opcode() {
            XRC_RDMA_READ_RESPONSE_ONLY => 0,
            XRC_SEND_MIDDLE => 1,
            XRC_ATOMIC_ACKNOWLEDGE => 2,
            _ => return true,
        };
        std::mem::replace(&mut dropped[i], true)
    });
    x.post(1, SendOp::RdmaRead { remote_addr: BASE + REGION + 0x100, rkey: rkey1 }, 0x4_0000, 100, 1);
    x.post(2, SendOp::Send, 0, 1024, 0);
    x.post(3, SendOp::FetchAdd { remote_addr: BASE + REGION + 0x200, rkey: rkey1, add: 3 }, 0x5_0000, 8, 1);
    x.pair.drive();

    let ok = WcStatus::Success;
    assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, ok), (2, ok), (3, ok)]);
    assert_eq!(x.pair.a.read(0x4_0000, 100), &r[..]);
    assert_eq!(x.pair.b.read(0x1_0000, 1024), &s[..]);
    assert_eq!(x.pair.b.read(REGION + 0x200, 8), 3u64.to_ne_bytes(), "added once");
    assert_eq!(recvs(&x.wcs(0)).iter().map(|r| (r.0, r.1, r.3)).collect::<Vec<_>>(), [(80, ok, 1024)]);
    assert!(x.pair.b.engine.counters().duplicate_requests >= 2, "the READ and the FETCH_ADD came again");
    assert!(!x.pair.log.iter().any(|p| matches!(p.syndrome(), Some(Syndrome::Nak(NakCode::RemoteAccessError)))));
}

// ---- resources ---------------------------------------------------------------------------------

#[test]
fn an_xrc_domain_is_busy_while_an_srq_or_a_tgt_qp_belongs_to_it() {
    let mut n = node([10, 0, 0, 1], 1, QpType::Rc, QpCap::default());
    let e = &mut n.engine;
    let xrcd = e.alloc_xrcd().unwrap();
    let pd = e.alloc_pd();
    let srq = e.create_xrc_srq(pd, xrcd, n.cq, 8, 1).unwrap();
    let tgt = e.create_xrc_tgt_qp(xrcd).unwrap();
    assert_eq!(e.xrc_srq(srq), Some((xrcd, n.cq)));
    let plain = e.create_srq(pd, 8, 1).unwrap();
    assert_eq!(e.xrc_srq(plain), None);
    assert_eq!(e.qp_state(tgt), Some(QpState::Reset));

    let err = e.dealloc_xrcd(xrcd).unwrap_err();
    assert!(matches!(&err, VerbsError::Busy(m) if m.contains("SRQ")), "{err}");
    let err = e.dealloc_pd(pd).unwrap_err();
    assert!(matches!(err, VerbsError::Busy(_)), "the SRQs hold their PD: {err}");
    e.destroy_srq(srq).unwrap();
    let err = e.dealloc_xrcd(xrcd).unwrap_err();
    assert!(matches!(&err, VerbsError::Busy(m) if m.contains("TGT")), "{err}");
    e.destroy_qp(tgt).unwrap();
    e.dealloc_xrcd(xrcd).unwrap();
    assert!(matches!(e.dealloc_xrcd(xrcd), Err(VerbsError::NotFound { .. })));
    assert!(matches!(e.create_xrc_tgt_qp(xrcd), Err(VerbsError::NotFound { .. })));
    assert!(matches!(e.create_xrc_srq(pd, xrcd, n.cq, 8, 1), Err(VerbsError::NotFound { .. })));
    e.destroy_srq(plain).unwrap();
    e.dealloc_pd(pd).unwrap();
}

#[test]
fn a_cq_is_busy_while_an_xrc_srq_completes_to_it_and_a_tgt_qp_holds_none() {
    let mut x = xrc(Mtu::Mtu1024);
    let err = x.pair.b.engine.destroy_cq(x.t[0].cq).unwrap_err();
    assert!(matches!(&err, VerbsError::Busy(m) if m.contains("SRQ")), "{err}");
    // The TGT QP serves a message through SRQ 0 and its CQ...
    x.recv(0, 1, 0x1_0000, 64);
    x.post(1, SendOp::Send, 0, 8, 0);
    x.pair.drive();
    assert_eq!(x.wcs(0).len(), 1);
    // ...but holds neither: once the SRQ goes, the CQ may.
    x.pair.b.engine.destroy_srq(x.t[0].srq).unwrap();
    x.pair.b.engine.destroy_cq(x.t[0].cq).unwrap();
    // A message to the other SRQ still lands.
    x.recv(1, 2, REGION, 64);
    x.post(2, SendOp::Send, 0, 8, 1);
    x.pair.drive();
    assert_eq!(outcomes(&x.wcs(1)), [(2, WcStatus::Success)]);
    assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn create_qp_refuses_receive_queues_on_an_xrc_ini_qp_and_makes_no_tgt_qp() {
    let mut n = node([10, 0, 0, 1], 1, QpType::Rc, QpCap::default());
    let plain = n.engine.create_srq(n.pd, 8, 1).unwrap();
    let ini = ini_attr(&n);
    for (what, attr) in [
        ("an SRQ", QpInitAttr { srq: Some(plain), ..ini }),
        ("max_recv_wr", QpInitAttr { cap: QpCap { max_recv_wr: 1, ..ini.cap }, ..ini }),
        ("max_recv_sge", QpInitAttr { cap: QpCap { max_recv_sge: 1, ..ini.cap }, ..ini }),
        ("XRC TGT", QpInitAttr { qp_type: QpType::XrcTgt, ..ini }),
    ] {
        let err = n.engine.create_qp(&attr).unwrap_err();
        assert!(matches!(err, VerbsError::Invalid(_)), "{what}: {err}");
    }
    let qp = n.engine.create_qp(&ini).unwrap();
    assert_eq!(n.engine.qp_state(qp), Some(QpState::Reset));
}

#[test]
fn xrc_qps_take_no_receives_and_a_tgt_qp_sends_nothing() {
    let mut x = xrc(Mtu::Mtu1024);
    let sge = x.pair.a.sge(0, 8);
    for n in [&mut x.pair.a, &mut x.pair.b] {
        let err = n.engine.post_recv(n.qp, &[RecvWr { wr_id: 1, sg_list: &[sge] }]).unwrap_err();
        assert_eq!(err.index, 0);
        assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("XRC SRQ")), "{err}");
    }
    let b = &mut x.pair.b;
    assert_eq!(b.engine.qp_state(b.qp), Some(QpState::Rts));
    let sge = b.sge(0, 8);
    let err = b.try_post_send(&[xwr(1, SendOp::Send, &[sge], x.t[0].srq)]).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("no send queue")), "{err}");
    x.pair.drive();
    assert!(x.pair.log.is_empty(), "nothing went out");
    assert_eq!(x.pair.b.poll_all(), []);
}

#[test]
fn an_xrc_send_without_a_valid_srq_number_is_refused_at_its_index() {
    let mut x = xrc(Mtu::Mtu1024);
    for i in 0..3 {
        x.recv(0, 1 + i, 0x1_0000 + 0x1000 * i, 64);
    }
    let sge = [x.pair.a.sge(0, 8)];
    let srq = x.t[0].srq;
    let rkey = x.t[0].keys.rkey;
    let cases: [(SendWr<'_>, &str); 3] = [
        (wr(11, SendOp::Send, &sge), "remote_srqn"),
        (SendWr { xrc_srqn: Some(0x100_0000), ..wr(11, SendOp::Send, &sge) }, "24 bits"),
        (xwr(11, SendOp::AtomicWrite { remote_addr: BASE, rkey, value: [0xee; 8] }, &[], srq), "ATOMIC_WRITE"),
    ];
    for (i, (bad, why)) in cases.into_iter().enumerate() {
        let good = [xwr(10 + 10 * i as u64, SendOp::Send, &sge, srq), xwr(12, SendOp::Send, &sge, srq)];
        let err = x.pair.a.try_post_send(&[good[0], bad, good[1]]).unwrap_err();
        assert_eq!(err.index, 1, "{why}");
        assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains(why)), "{why}: {err}");
    }
    x.pair.drive();
    // The WR before each bad one was posted; the one after it was not.
    assert_eq!(
        outcomes(&x.pair.a.poll_all()),
        [(10, WcStatus::Success), (20, WcStatus::Success), (30, WcStatus::Success)]
    );
    assert_eq!(outcomes(&x.wcs(0)), [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(x.pair.b.read(0, 8), [0; 8], "no ATOMIC_WRITE reached B");
}

#[test]
fn a_send_to_an_empty_xrc_srq_is_rnr_naked_until_a_receive_is_posted_there() {
    let mut x = xrc(Mtu::Mtu1024);
    x.recv(0, 1, 0x1_0000, 64); // SRQ 0 has a receive; the SEND names SRQ 1, which has none
    x.pair.a.fill(0, b"wait for me");
    x.post(1, SendOp::Send, 0, 11, 1);
    x.pair.drive_for(Duration::from_micros(5));
    let last = x.pair.log.last().expect("a NAK");
    assert_eq!((last.from_a, last.opcode()), (false, XRC_ACKNOWLEDGE));
    assert!(matches!(last.syndrome(), Some(Syndrome::RnrNak(_))), "{:?}", last.syndrome());
    assert_eq!(x.pair.b.engine.counters().rnr_naks_sent, 1);
    assert_eq!(x.wcs(0), [], "SRQ 0's receive is not SRQ 1's");

    x.pair.drive_for(Duration::from_micros(200));
    assert!(x.pair.b.engine.counters().rnr_naks_sent >= 2, "retried, still not ready");
    assert_eq!(x.pair.a.poll_all(), []);
    x.recv(1, 2, REGION + 0x40, 64);
    x.pair.drive();
    assert_eq!(outcomes(&x.pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(outcomes(&x.wcs(1)), [(2, WcStatus::Success)]);
    assert_eq!(x.pair.b.read(REGION + 0x40, 11), b"wait for me");
    assert_eq!(x.wcs(0), []);
    assert_eq!(x.pair.b.read(0x1_0000, 11), [0; 11]);
}

#[test]
fn a_tgt_qp_brought_through_reset_leaves_the_srqs_completions_and_serves_again() {
    // An XRC TGT QP has no CQ of its own (libmlx5 cleans none for it; the kernel's mlx5
    // skips IB_QPT_XRC_TGT): its SRQs' completions are theirs, and its reset leaves them.
    let mut x = xrc(Mtu::Mtu1024);
    let (ini, tgt) = (x.pair.a.qp, x.pair.b.qp);
    x.recv(0, 1, 0x1_0000, 64);
    x.recv(0, 2, 0x1_1000, 64);
    x.pair.a.fill(0, b"one");
    x.post(1, SendOp::Send, 0, 3, 0);
    x.pair.drive();
    let reset = QpAttr { qp_state: QpState::Reset, ..QpAttr::default() };
    x.pair.b.engine.modify_qp(tgt, &reset, AttrMask::STATE).unwrap();
    x.pair.a.engine.modify_qp(ini, &reset, AttrMask::STATE).unwrap();
    assert_eq!(outcomes(&x.pair.a.poll_all()), [], "the INI QP's own completions go with its reset");
    assert_eq!(outcomes(&x.wcs(0)), [(1, WcStatus::Success)], "SRQ 0's completion stays");

    let (aa, ba) = (x.pair.a.addr, x.pair.b.addr);
    connect_qp(&mut x.pair.a.engine, ini, tgt, ba, QpType::XrcIni, Mtu::Mtu1024, &|_| {});
    connect_qp(&mut x.pair.b.engine, tgt, ini, aa, QpType::XrcTgt, Mtu::Mtu1024, &|_| {});
    x.pair.a.fill(0, b"two");
    x.post(2, SendOp::Send, 0, 3, 0);
    x.pair.drive();
    assert_eq!(outcomes(&x.pair.a.poll_all()), [(2, WcStatus::Success)]);
    assert_eq!(outcomes(&x.wcs(0)), [(2, WcStatus::Success)]);
    assert_eq!(x.pair.b.read(0x1_1000, 3), b"two");
}

#[test]
fn a_non_xrc_qp_cannot_use_an_xrc_srq() {
    // ib_uverbs_create_qp: an SRQ of type XRC attached to a QP that is not XRC is EINVAL.
    let mut x = xrc(Mtu::Mtu1024);
    let b = &mut x.pair.b;
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let attr = QpInitAttr { srq: Some(x.t[0].srq), ..init_attr(b, qp_type) };
        let err = b.engine.create_qp(&attr).unwrap_err();
        assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("XRC SRQ")), "{qp_type}: {err}");
    }
}

// ---- modify_qp: the XRC columns ----------------------------------------------------------------

fn rtr_attr(peer: std::net::IpAddr, peer_qp: Qpn) -> QpAttr {
    let av = AddressVector { dgid: Gid::from_ip(peer), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qp.value(),
        rq_psn: 100,
        max_dest_rd_atomic: 2,
        min_rnr_timer: 1,
        ..QpAttr::default()
    }
}

#[test]
fn modify_qp_follows_the_xrc_columns_of_the_table() {
    let mut x = xrc(Mtu::Mtu1024);
    let ini = x.pair.a.engine.create_qp(&ini_attr(&x.pair.a)).unwrap();
    let tgt = x.pair.b.engine.create_xrc_tgt_qp(x.xrcd).unwrap();
    let (aa, ba) = (x.pair.a.addr, x.pair.b.addr);
    use AttrMask as M;
    let missing = |r: Result<(), VerbsError>, want: AttrMask| match r {
        Err(VerbsError::ModifyQp(ModifyQpError::MissingAttributes { missing, .. })) => assert_eq!(missing, want),
        other => panic!("expected {want:?} missing, got {other:?}"),
    };
    let unexpected = |r: Result<(), VerbsError>, want: AttrMask| match r {
        Err(VerbsError::ModifyQp(ModifyQpError::UnexpectedAttributes { unexpected, .. })) => {
            assert_eq!(unexpected, want)
        }
        other => panic!("expected {want:?} refused, got {other:?}"),
    };

    // RESET→INIT: both as RC, with access flags and no Q_Key.
    let init = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, ..QpAttr::default() };
    let init_mask = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    for (e, qp) in [(&mut x.pair.a.engine, ini), (&mut x.pair.b.engine, tgt)] {
        unexpected(e.modify_qp(qp, &init, init_mask | M::QKEY), M::QKEY);
        missing(e.modify_qp(qp, &init, init_mask - M::ACCESS_FLAGS), M::ACCESS_FLAGS);
        e.modify_qp(qp, &init, init_mask).unwrap();
    }

    // INIT→RTR: the TGT QP, a responder, needs RC's responder resources and RNR timer;
    // the INI QP, which answers nothing, takes neither.
    let uc_rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rc_rtr = uc_rtr | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let e = &mut x.pair.b.engine;
    missing(e.modify_qp(tgt, &rtr_attr(aa, ini), uc_rtr), M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER);
    e.modify_qp(tgt, &rtr_attr(aa, ini), rc_rtr).unwrap();
    let e = &mut x.pair.a.engine;
    unexpected(e.modify_qp(ini, &rtr_attr(ba, tgt), rc_rtr), M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER);
    e.modify_qp(ini, &rtr_attr(ba, tgt), uc_rtr).unwrap();

    // RTR→RTS: the INI QP, a requester, needs RC's retry parameters; the TGT QP only a
    // timeout and its send PSN, and takes no retry count.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 100,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 2,
        ..QpAttr::default()
    };
    let rc_rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    let tgt_rts = M::STATE | M::SQ_PSN | M::TIMEOUT;
    missing(e.modify_qp(ini, &rts, tgt_rts), M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC);
    unexpected(e.modify_qp(ini, &rts, rc_rts | M::MIN_RNR_TIMER), M::MIN_RNR_TIMER);
    e.modify_qp(ini, &rts, rc_rts).unwrap();
    let e = &mut x.pair.b.engine;
    missing(e.modify_qp(tgt, &rts, M::STATE | M::SQ_PSN), M::TIMEOUT);
    unexpected(e.modify_qp(tgt, &rts, tgt_rts | M::RETRY_CNT), M::RETRY_CNT);
    e.modify_qp(tgt, &rts, tgt_rts | M::MIN_RNR_TIMER).unwrap();
    assert_eq!(e.qp_state(tgt), Some(QpState::Rts));

    // RTS→RTS: the TGT QP may change its RNR timer, the INI QP has none.
    let rnr = QpAttr { min_rnr_timer: 2, ..QpAttr::default() };
    x.pair.b.engine.modify_qp(tgt, &rnr, M::MIN_RNR_TIMER).unwrap();
    unexpected(x.pair.a.engine.modify_qp(ini, &rnr, M::MIN_RNR_TIMER), M::MIN_RNR_TIMER);
    assert_eq!(x.pair.b.engine.query_qp(tgt).map(|(a, _)| (a.min_rnr_timer, a.dest_qp_num)), Some((2, ini.value())));

    // The two, connected by hand, carry a message into SRQ 1.
    x.recv(1, 9, REGION, 64);
    x.pair.a.fill(0, b"by hand");
    let sge = x.pair.a.sge(0, 7);
    x.pair.a.engine.post_send(ini, &[xwr(1, SendOp::Send, &[sge], x.t[1].srq)], &x.pair.a.mem).unwrap();
    x.pair.drive();
    assert_eq!(
        x.wcs(1).iter().map(|w| (w.wr_id, w.status, w.qp_num)).collect::<Vec<_>>(),
        [(9, WcStatus::Success, tgt)]
    );
    assert_eq!(x.pair.b.read(REGION, 7), b"by hand");
}
