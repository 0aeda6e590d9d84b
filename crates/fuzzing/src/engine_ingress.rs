//! The responder's ingress: whatever a peer sends, the engine never panics and never
//! touches memory outside the registration that allows it.
//!
//! The input is a sequence of datagrams (each prefixed by a length byte pair) delivered to a
//! device with connected RC and UC QPs and a UD QP, whose one remotely accessible region is
//! guarded on both sides. Every datagram is delivered twice: as fuzzed, and with its ICRC
//! recomputed, so the fuzzer reaches the responder's checks behind the ICRC. After each, the
//! engine transmits and fires its timers. At the end, memory outside the region must be
//! unchanged.
use softrdma_engine::*;
use softrdma_wire::{Envelope, Gid, QKey, Qpn, RocePacket};

const BASE: u64 = 0x1000_0000;
const LEN: usize = 0x3_0000;
/// The remotely accessible region, between two guard regions.
const REMOTE: u64 = BASE + 0x1_0000;
const REMOTE_LEN: u64 = 0x1_0000;

struct Target {
    e: Engine,
    mem: VecMemory,
    qps: [Qpn; 3],
}

fn target() -> Target {
    let me: std::net::IpAddr = [10, 0, 0, 2].into();
    let peer: std::net::IpAddr = [10, 0, 0, 1].into();
    let mut e = Engine::new(DeviceConfig { addresses: vec![me], ..DeviceConfig::default() });
    let pd = e.alloc_pd();
    let cq = e.create_cq(1 << 16).unwrap();
    let keys = e.reg_mr(pd, REMOTE, REMOTE_LEN, Access::ALL).unwrap();
    let mut qps = [Qpn::default(); 3];
    for (i, qp_type) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        let init =
            QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type, cap: QpCap::default(), sq_sig_all: false };
        let q = e.create_qp(&init).unwrap();
        qps[i] = q;
        let a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: Access::ALL,
            qkey: QKey(0x1111_1111),
            ..QpAttr::default()
        };
        let base = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        if qp_type == QpType::Ud {
            e.modify_qp(q, &a, base | AttrMask::QKEY).unwrap();
            e.modify_qp(q, &QpAttr { qp_state: QpState::Rtr, ..a }, AttrMask::STATE).unwrap();
            e.modify_qp(q, &QpAttr { qp_state: QpState::Rts, ..a }, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
        } else {
            e.modify_qp(q, &a, base | AttrMask::ACCESS_FLAGS).unwrap();
            let av = AddressVector {
                dgid: Gid::from_ip(peer),
                sgid_index: 0,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: Some(av),
                dest_qp_num: 0x99,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                ..a
            };
            let mut m = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
            if qp_type == QpType::Rc {
                m = m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
            }
            e.modify_qp(q, &rtr, m).unwrap();
            let rts = QpAttr { qp_state: QpState::Rts, timeout: 10, retry_cnt: 2, rnr_retry: 2, max_rd_atomic: 4, ..a };
            let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
            if qp_type == QpType::Rc {
                m = m | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
            }
            e.modify_qp(q, &rts, m).unwrap();
        }
        for k in 0..4u64 {
            let sge = Sge { addr: REMOTE + 0x2000 * (i as u64 * 4 + k), length: 0x1000, lkey: keys.lkey };
            e.post_recv(q, &[RecvWr { wr_id: k, sg_list: &[sge] }]).unwrap();
        }
    }
    Target { e, mem: VecMemory::new(BASE, LEN), qps }
}

fn outside(mem: &VecMemory) -> (Vec<u8>, Vec<u8>) {
    let b = mem.bytes();
    let lo = (REMOTE - BASE) as usize;
    (b[..lo].to_vec(), b[lo + REMOTE_LEN as usize..].to_vec())
}

/// Runs the target on one input; panics when an oracle above does not hold.
pub fn run(data: &[u8]) {
    let mut t = target();
    // A recognisable pattern in the guards, so that a stray write of anything shows.
    for (i, b) in t.mem.bytes_mut().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7) | 1;
    }
    let guards = outside(&t.mem);
    let envelope = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap();
    let mut now = Instant::ZERO;
    let mut buf = vec![0u8; 4200];
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % 4200;
        let take = len.min(rest.len() - 2);
        let mut dgram = rest[2..2 + take].to_vec();
        rest = &rest[2 + take..];
        // Steer the destination QP to one of ours now and then.
        if dgram.len() >= 8 && dgram[5] == 0xfe {
            let q = t.qps[usize::from(dgram[6]) % 3].value().to_be_bytes();
            dgram[5..8].copy_from_slice(&q[1..]);
        }
        t.e.handle_datagram(now, &envelope, &dgram, &mut t.mem);
        if dgram.len() >= 16 {
            RocePacket::new_unchecked(&mut dgram[..]).fill_icrc(&envelope);
            t.e.handle_datagram(now, &envelope, &dgram, &mut t.mem);
        }
        while t.e.poll_transmit(now, &mut t.mem, &mut buf).is_some() {}
        now += std::time::Duration::from_micros(500);
        t.e.handle_timeout(now);
    }
    assert!(outside(&t.mem) == guards, "memory outside the remote region changed");
}
