//! Swarm simulation: for each seed, a bad network drawn from the seed (loss, duplication,
//! reordering, corruption), a random mix of every operation over RC, UC, UD and XRC (on devices
//! whose RC QPs share a small window per peer in a third of the seeds), then the
//! network heals and the run must converge. The invariants are checked here, outside the
//! code under test, against a reference model of what memory and completions must be:
//!
//! - every RC WR completes exactly once, in posting order; successes, then at most one
//!   error, then only flushes;
//! - target memory equals the model for every WR that succeeded; UC WRITEs land whole
//!   packets or nothing; no byte outside the targets changes;
//! - every receive completes at most once and carries exactly what was sent;
//! - after the heal, every RC and XRC INI QP has completed everything posted; retries run
//!   out only while the network is bad (an error from them comes at the latest one ACK
//!   timeout after the heal);
//! - memory windows (a fourth connection, RC): B's windows, bound by B's QP, give A what
//!   each was bound with and nothing more (bounds, rights, invalidation by A's fenced
//!   SEND_WITH_INVs); A's binds and local invalidations of its own windows, interleaved with
//!   the traffic and its retransmissions, are done once each and complete in order; at
//!   most one operation breaks a rule on purpose and must fail with the status IBTA/rxe
//!   give, the rest flushing; every window ends in the state the model says;
//! - XRC (a fifth connection): A's XRC INI QP sends to B's XRC TGT QP, whose domain has 2
//!   or 3 XRC SRQs in two PDs, each with its own CQ and region. Every operation names a
//!   random SRQ and reaches a region of that SRQ's PD: its WRs complete exactly once, in
//!   order, as RC's do; each SEND or WRITE_WITH_IMM takes the next receive of the SRQ it
//!   named, whose CQ (and no other) completes it once, in order, with the TGT QPN, its
//!   length and its data or immediate; WRITEs, READs and atomics (exactly once each) act
//!   on the region they named; in a quarter of the seeds one operation uses a key of
//!   another PD than its SRQ's and must fail with REM_ACCESS_ERR (or the retries of a
//!   READ or atomic before it, whose answer was lost, run out: the TGT QP, then in error,
//!   answers nothing), changing nothing; nothing after it executes.
//!
//! `SOFTRDMA_SEEDS=10000 cargo test -p softrdma-engine --release --test swarm` runs more
//! seeds; `SOFTRDMA_SEED=0x...` replays one.

use std::net::IpAddr;
use std::time::Duration;

mod common;

use common::SimNode;
use softrdma_engine::*;
use softrdma_sim::{Fabric, FaultConfig, NodeId, SimRng, Time, swarm};
use softrdma_wire::{Gid, QKey, Qpn, RKey};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 4 << 20;

/// An engine and its memory, as a node of the simulated fabric.
type EngineNode = SimNode<VecMemory>;

/// One operation of the workload, with what the model expects of it.
#[derive(Clone, Debug)]
enum Op {
    Send { len: u32, recv_slot: u64 },
    Write { len: u32, target: u64 },
    WriteImm { len: u32, target: u64, recv_slot: u64 },
    Read { len: u32, source: u64, dest: u64 },
    FetchAdd { add: u64, result: u64 },
    CompareSwap { word: u64, result: u64 },
}

struct Conn {
    qp_type: QpType,
    a_qp: Qpn,
    b_qp: Qpn,
    mtu: u32,
    ops: Vec<Op>,
}

/// The local ACK timeout `connect` sets (timeout 8: 4.096 µs × 2^8).
const ACK_TIMEOUT: Duration = Duration::from_nanos(4096 << 8);

/// Retries run out only while the network is bad: once it has healed, the next retry of a
/// QP that has one left is answered, so a QP fails at the latest when the ACK timer then
/// running fires (with 200 µs of slack for packets delayed across the heal). A later
/// failure is a requester that retries without learning from the answers.
fn late_failure(w: &Wc, healed: Time) -> Result<(), String> {
    let deadline = healed + ACK_TIMEOUT + Duration::from_micros(200);
    match w.completed_at {
        Some(at) if at > deadline => Err(format!(
            "WR {} failed {:?} at {at:?}, {:?} after the network healed: retries that would have been answered",
            w.wr_id,
            w.status,
            at.saturating_duration_since(healed)
        )),
        _ => Ok(()),
    }
}

/// Bytes that identify message `i` of connection `c`: distinct everywhere.
fn payload(c: usize, i: usize, len: u32) -> Vec<u8> {
    let mut x = (c as u64) << 32 | i as u64 | 0x5a00_0000_0000_0000;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 1 // never 0: untouched memory is 0
        })
        .collect()
}

struct Layout;
impl Layout {
    // On A: source data per op at 64 KiB slots from 0; READ destinations from 2 MiB.
    fn src(c: usize, i: usize) -> u64 {
        ((c * 16 + i) as u64) << 13
    }
    fn read_dest(c: usize, i: usize) -> u64 {
        (2 << 20) + (((c * 16 + i) as u64) << 13)
    }
    // On B: write targets, receive slots, READ sources, atomic words.
    fn target(c: usize, i: usize) -> u64 {
        ((c * 16 + i) as u64) << 13
    }
    fn recv(c: usize, i: usize) -> u64 {
        (1 << 20) + (((c * 16 + i) as u64) << 13)
    }
    fn read_src(c: usize, i: usize) -> u64 {
        (2 << 20) + (((c * 16 + i) as u64) << 13)
    }
    fn counter() -> u64 {
        (3 << 20) + 0x1000
    }
    fn word(i: usize) -> u64 {
        (3 << 20) + 0x2000 + 8 * i as u64
    }
}

const OPS_PER_CONN: usize = 16;

fn device(ip: [u8; 4], seed: u64, peer_window: Option<u32>) -> (EngineNode, PdId, CqId, MrKeys) {
    let ip = IpAddr::from(ip);
    let mut engine = Engine::new(DeviceConfig { addresses: vec![ip], seed, peer_window, ..DeviceConfig::default() });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(4096).unwrap();
    let keys = engine.reg_mr(pd, BASE, MEM as u64, Access::ALL).unwrap();
    (EngineNode { engine, mem: VecMemory::new(BASE, MEM), ip }, pd, cq, keys)
}

fn connect(n: &mut EngineNode, qp: Qpn, qp_type: QpType, peer: (Qpn, IpAddr), mtu: Mtu) {
    let e = &mut n.engine;
    let init =
        QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, qkey: QKey(0x4242), ..QpAttr::default() };
    if qp_type == QpType::Ud {
        e.modify_qp(qp, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY).unwrap();
        e.modify_qp(qp, &QpAttr { qp_state: QpState::Rtr, ..init }, AttrMask::STATE).unwrap();
        e.modify_qp(qp, &QpAttr { qp_state: QpState::Rts, ..init }, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
        return;
    }
    e.modify_qp(qp, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS).unwrap();
    let av =
        AddressVector { dgid: Gid::from_ip(peer.1), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    // The responders (RC, XRC TGT) take responder resources and an RNR timer on RTR; the
    // requesters (RC, XRC INI) their retry parameters on RTS; an XRC TGT only a timeout.
    let responder = matches!(qp_type, QpType::Rc | QpType::XrcTgt);
    let requester = matches!(qp_type, QpType::Rc | QpType::XrcIni);
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: mtu,
        dest_qp_num: peer.0.value(),
        rq_psn: 0xfff000,
        max_dest_rd_atomic: 8,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let mut mask = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    if responder {
        mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    }
    e.modify_qp(qp, &rtr, mask).unwrap();
    // timeout 8: a 1 ms local ACK timeout; 7 retries.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0xfff000,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
    if requester {
        mask = mask | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
    } else if qp_type == QpType::XrcTgt {
        mask |= AttrMask::TIMEOUT;
    }
    e.modify_qp(qp, &rts, mask).unwrap();
}

fn pick<T: Copy>(rng: &mut SimRng, items: &[T]) -> T {
    items[(rng.next_u64() % items.len() as u64) as usize]
}

fn run(seed: u64) -> Result<(), String> {
    let mut rng = SimRng::with_stream(seed, 7);
    let mut sim = Fabric::new(seed);
    let faults = FaultConfig::random(&mut SimRng::with_stream(seed, 1));
    let fault_rules = sim.add_faults(&faults);

    // In a third of the seeds, the RC QPs share a window of 1 to 48 packets per peer.
    let w = rng.next_u64();
    let peer_window = (w % 3 == 0).then(|| 1 + ((w >> 8) % 48) as u32);
    let (mut a, a_pd, a_cq, a_keys) = device([10, 0, 0, 1], rng.next_u64(), peer_window);
    let (mut b, b_pd, b_cq, b_keys) = device([10, 0, 0, 2], rng.next_u64(), peer_window);
    let cap = QpCap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };

    // Three connections: RC, UC, UD, each with its own MTU.
    let mut conns = Vec::new();
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let init = |pd, cq| QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type, cap, sq_sig_all: false };
        let a_qp = a.engine.create_qp(&init(a_pd, a_cq)).unwrap();
        let b_qp = b.engine.create_qp(&init(b_pd, b_cq)).unwrap();
        let mtu = pick(&mut rng, &[Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]);
        let mtu = if qp_type == QpType::Ud { Mtu::Mtu4096 } else { mtu };
        connect(&mut a, a_qp, qp_type, (b_qp, b.ip), mtu);
        connect(&mut b, b_qp, qp_type, (a_qp, a.ip), mtu);
        conns.push(Conn { qp_type, a_qp, b_qp, mtu: mtu.bytes(), ops: Vec::new() });
    }
    let ah = a
        .engine
        .create_ah(
            a_pd,
            AddressVector { dgid: Gid::from_ip(b.ip), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 },
        )
        .unwrap();

    // The workload and the model's expectations.
    let mut counter_model = 0u64;
    for (c, conn) in conns.iter_mut().enumerate() {
        let n = 4 + (rng.next_u64() % (OPS_PER_CONN as u64 - 4)) as usize;
        for i in 0..n {
            let len = match rng.next_u64() % 4 {
                0 => 0,
                1 => 1 + (rng.next_u64() % 64) as u32,
                2 => 1 + (rng.next_u64() % 3000) as u32,
                _ => 1 + (rng.next_u64() % 8000) as u32,
            };
            let op = match conn.qp_type {
                QpType::Ud => Op::Send { len: len.min(4096 - 40).min(conn.mtu), recv_slot: Layout::recv(c, i) },
                QpType::Uc => match rng.next_u64() % 3 {
                    0 => Op::Send { len, recv_slot: Layout::recv(c, i) },
                    1 => Op::Write { len, target: Layout::target(c, i) },
                    _ => Op::WriteImm { len, target: Layout::target(c, i), recv_slot: Layout::recv(c, i) },
                },
                _ => match rng.next_u64() % 6 {
                    0 => Op::Send { len, recv_slot: Layout::recv(c, i) },
                    1 => Op::Write { len, target: Layout::target(c, i) },
                    2 => Op::WriteImm { len, target: Layout::target(c, i), recv_slot: Layout::recv(c, i) },
                    3 => Op::Read { len, source: Layout::read_src(c, i), dest: Layout::read_dest(c, i) },
                    4 => {
                        let add = rng.next_u64() % 1000;
                        let op = Op::FetchAdd { add, result: counter_model };
                        counter_model += add;
                        op
                    }
                    _ => Op::CompareSwap { word: Layout::word(i), result: 0 },
                },
            };
            conn.ops.push(op);
        }
    }

    // Fill sources, post receives on B, post everything on A.
    for (c, conn) in conns.iter().enumerate() {
        for (i, op) in conn.ops.iter().enumerate() {
            match *op {
                Op::Send { len, recv_slot } | Op::WriteImm { len, recv_slot, .. } => {
                    a.mem.slice_mut(BASE + Layout::src(c, i), len as usize).copy_from_slice(&payload(c, i, len));
                    let extra = if conn.qp_type == QpType::Ud { 40 } else { 0 };
                    let sge = Sge { addr: BASE + recv_slot, length: 8192 + extra, lkey: b_keys.lkey };
                    b.engine
                        .post_recv(conn.b_qp, &[RecvWr { wr_id: i as u64, sg_list: &[sge] }])
                        .map_err(|e| e.to_string())?;
                }
                Op::Write { len, .. } => {
                    a.mem.slice_mut(BASE + Layout::src(c, i), len as usize).copy_from_slice(&payload(c, i, len));
                }
                Op::Read { len, source, .. } => {
                    b.mem.slice_mut(BASE + source, len as usize).copy_from_slice(&payload(c, i, len));
                }
                _ => {}
            }
        }
    }
    for (c, conn) in conns.iter().enumerate() {
        for (i, op) in conn.ops.iter().enumerate() {
            let src = Sge { addr: BASE + Layout::src(c, i), length: 0, lkey: a_keys.lkey };
            let rkey = b_keys.rkey;
            let (op, sge) = match *op {
                Op::Send { len, .. } => (SendOp::Send, Sge { length: len, ..src }),
                Op::Write { len, target } => {
                    (SendOp::RdmaWrite { remote_addr: BASE + target, rkey }, Sge { length: len, ..src })
                }
                Op::WriteImm { len, target, .. } => (
                    SendOp::RdmaWriteWithImm { remote_addr: BASE + target, rkey, imm: (i as u32).to_be_bytes() },
                    Sge { length: len, ..src },
                ),
                Op::Read { len, source, dest } => (
                    SendOp::RdmaRead { remote_addr: BASE + source, rkey },
                    Sge { addr: BASE + dest, length: len, lkey: a_keys.lkey },
                ),
                Op::FetchAdd { add, .. } => {
                    (SendOp::FetchAdd { remote_addr: BASE + Layout::counter(), rkey, add }, Sge { length: 8, ..src })
                }
                Op::CompareSwap { word, .. } => (
                    SendOp::CompareSwap { remote_addr: BASE + word, rkey, compare: 0, swap: 0xabcd_0000 + i as u64 },
                    Sge { length: 8, ..src },
                ),
            };
            let ud =
                (conn.qp_type == QpType::Ud).then_some(UdDest { ah, remote_qpn: conn.b_qp, remote_qkey: QKey(0x4242) });
            let wr = SendWr { wr_id: i as u64, op, sg_list: &[sge], flags: SendFlags::SIGNALED, ud, xrc_srqn: None };
            a.engine.post_send(conn.a_qp, &[wr], &a.mem).map_err(|e| format!("post_send: {e}"))?;
        }
    }

    let mut mw = mw_setup(&mut rng, &mut a, &mut b, (a_pd, a_cq, a_keys.lkey), (b_pd, b_cq, b_keys.lkey), cap)?;
    let xrc = xrc_setup(&mut rng, &mut a, &mut b, (a_pd, a_cq, a_keys.lkey), cap)?;
    let b_before = b.mem.clone();
    let na: NodeId = sim.add_node(a);
    let nb: NodeId = sim.add_node(b);

    // The faulty phase, then heal and demand convergence: the fabric must go idle, with
    // nothing in flight and no timer armed, which a QP still retrying never is.
    sim.run_for(Duration::from_millis(20)).map_err(|e| e.to_string())?;
    let healed = sim.now();
    for rule in fault_rules {
        sim.remove_rule(rule);
    }
    sim.run_until_idle(Duration::from_secs(60)).map_err(|e| format!("no convergence after the heal: {e}"))?;

    // Collect completions.
    let mut a_wcs: Vec<Wc> = Vec::new();
    let mut b_wcs: Vec<Wc> = Vec::new();
    {
        let a = sim.node_mut::<EngineNode>(na);
        while let Some(wc) = a.engine.poll_cq(a_cq) {
            a_wcs.push(wc);
        }
    }
    let mut srq_wcs: Vec<Vec<Wc>> = Vec::new();
    {
        let b = sim.node_mut::<EngineNode>(nb);
        while let Some(wc) = b.engine.poll_cq(b_cq) {
            b_wcs.push(wc);
        }
        for s in &xrc.srqs {
            srq_wcs.push(std::iter::from_fn(|| b.engine.poll_cq(s.cq)).collect());
        }
    }
    // Borrowed, not cloned: a fresh 4 MiB per seed is page faults the allocator may not
    // spare (glibc maps blocks that large anew each time until a larger one was freed).
    let a_mem = &sim.node::<EngineNode>(na).mem;
    let b_mem = &sim.node::<EngineNode>(nb).mem;
    let state = {
        let (a, b) = (&sim.node::<EngineNode>(na).engine, &sim.node::<EngineNode>(nb).engine);
        let mut qps: Vec<String> = conns
            .iter()
            .map(|c| format!("{:?} a={:?} b={:?}", c.qp_type, a.qp_state(c.a_qp), b.qp_state(c.b_qp)))
            .collect();
        qps.push(format!("XRC a={:?} b={:?}", a.qp_state(xrc.ini), b.qp_state(xrc.tgt)));
        format!("{qps:?}\n  a: {:?}\n  b: {:?}\n  fabric: {:?}", a.counters(), b.counters(), sim.counters())
    };
    let ctx = |msg: String| format!("{msg}\n  faults: {faults:?}\n  {state}");

    let mut touched = vec![false; MEM];
    let mut mark = |off: u64, len: usize| touched[off as usize..off as usize + len].fill(true);
    mark(Layout::counter(), 8);
    for i in 0..OPS_PER_CONN {
        mark(Layout::word(i), 8);
    }

    for (c, conn) in conns.iter().enumerate() {
        let sends: Vec<&Wc> = a_wcs.iter().filter(|w| w.qp_num == conn.a_qp).collect();
        let recvs: Vec<&Wc> = b_wcs.iter().filter(|w| w.qp_num == conn.b_qp).collect();
        let kind = format!("{:?}", conn.qp_type);
        // Every WR completes exactly once, in order.
        let ids: Vec<u64> = sends.iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = (0..conn.ops.len() as u64).collect();
        if ids != want {
            return Err(ctx(format!("{kind}: send completions {ids:?}, expected {want:?} (exactly once, in order)")));
        }
        // Successes, at most one error, then flushes only.
        let mut seen_error = false;
        for w in &sends {
            match (seen_error, w.status) {
                (false, WcStatus::Success) => {}
                (false, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr) if conn.qp_type == QpType::Rc => {
                    late_failure(w, healed).map_err(&ctx)?;
                    seen_error = true
                }
                (true, WcStatus::WrFlushErr) => {}
                (_, s) => {
                    return Err(ctx(format!("{kind}: WR {} completed {s:?} (after error: {seen_error})", w.wr_id)));
                }
            }
        }
        if conn.qp_type != QpType::Rc && seen_error {
            return Err(ctx(format!("{kind}: unreliable transports never fail a send")));
        }
        // Receive WQEs complete at most once each, in the order they were posted.
        let mut last = None;
        for r in &recvs {
            if last.is_some_and(|l| r.wr_id <= l) {
                return Err(ctx(format!("{kind}: receive {} completed out of order or twice", r.wr_id)));
            }
            last = Some(r.wr_id);
        }
        let grh = if conn.qp_type == QpType::Ud { 40 } else { 0 };
        // Which message each receive holds. RC consumes one receive per message, in order.
        // UC and UD lose messages without consuming receives, and a network that reorders
        // or duplicates reorders or duplicates them too (rxe accepts any FIRST or ONLY on
        // UC): there each delivery must be exactly some message that was sent, told by its
        // immediate data or its unique bytes.
        let mut matched: Vec<Option<&Wc>> = vec![None; conn.ops.len()];
        if conn.qp_type == QpType::Rc {
            for r in recvs.iter().filter(|r| r.status == WcStatus::Success) {
                matched[r.wr_id as usize] = Some(*r);
            }
        } else {
            // Any receive may hold the first packets of a message whose rest was lost.
            for i in 0..conn.ops.len() {
                mark(Layout::recv(c, i), (8192 + grh) as usize);
            }
            for r in recvs.iter().filter(|r| r.status == WcStatus::Success) {
                let slot = Layout::recv(c, r.wr_id as usize);
                mark(slot, (8192 + grh) as usize);
                let found = (0..conn.ops.len()).find(|&j| match conn.ops[j] {
                    Op::WriteImm { .. } => r.imm_data == Some((j as u32).to_be_bytes()),
                    Op::Send { len, .. } => {
                        r.imm_data.is_none()
                            && r.byte_len == len + grh
                            && b_mem.slice(BASE + slot + u64::from(grh), len as usize) == payload(c, j, len)
                    }
                    _ => false,
                });
                let Some(j) = found else {
                    return Err(ctx(format!("{kind}: receive {} holds no message that was sent: {r:?}", r.wr_id)));
                };
                matched[j] = Some(*r);
            }
        }
        for (i, op) in conn.ops.iter().enumerate() {
            let ok = sends[i].status == WcStatus::Success;
            let recv = matched[i];
            match *op {
                Op::Send { len, recv_slot } => {
                    mark(recv_slot, (len + grh) as usize);
                    if conn.qp_type == QpType::Rc && ok && recv.is_none() {
                        return Err(ctx(format!("{kind}: SEND {i} acknowledged but no receive completed")));
                    }
                    if let Some(r) = recv.filter(|_| conn.qp_type == QpType::Rc) {
                        if r.byte_len != len + grh {
                            return Err(ctx(format!("{kind}: receive {i} byte_len {} != {}", r.byte_len, len + grh)));
                        }
                        if b_mem.slice(BASE + recv_slot + u64::from(grh), len as usize) != payload(c, i, len) {
                            return Err(ctx(format!("{kind}: receive {i} data differs")));
                        }
                    }
                    if let Some(r) = recv {
                        if conn.qp_type == QpType::Ud && r.grh.is_none() {
                            return Err(ctx(format!("{kind}: UD receive {i} without GRH flag")));
                        }
                    }
                }
                Op::Write { len, target } | Op::WriteImm { len, target, .. } => {
                    mark(target, len as usize);
                    if let Op::WriteImm { recv_slot, .. } = *op {
                        if conn.qp_type == QpType::Rc && ok && recv.is_none() {
                            return Err(ctx(format!("{kind}: WRITE_IMM {i} acknowledged but no receive completed")));
                        }
                        if let Some(r) = recv {
                            if r.imm_data != Some((i as u32).to_be_bytes()) || r.opcode != WcOpcode::RecvRdmaWithImm {
                                return Err(ctx(format!("{kind}: WRITE_IMM {i} completion {r:?}")));
                            }
                        }
                        let _ = recv_slot;
                    }
                    let got = b_mem.slice(BASE + target, len as usize);
                    let want = payload(c, i, len);
                    if (conn.qp_type == QpType::Rc && ok) || recv.is_some() {
                        if got != want {
                            return Err(ctx(format!("{kind}: WRITE {i} ({len} B) did not land whole")));
                        }
                    } else if conn.qp_type == QpType::Uc {
                        // UC: each packet lands whole or not at all.
                        for (k, chunk) in got.chunks(conn.mtu as usize).enumerate() {
                            let new = &want[k * conn.mtu as usize..k * conn.mtu as usize + chunk.len()];
                            if chunk != new && chunk.iter().any(|&x| x != 0) {
                                return Err(ctx(format!("{kind}: WRITE {i} packet {k} is neither old nor new")));
                            }
                        }
                    }
                }
                Op::Read { len, source, dest } => {
                    mark(source, len as usize);
                    if ok && a_mem.slice(BASE + dest, len as usize) != payload(c, i, len) {
                        return Err(ctx(format!("{kind}: READ {i} ({len} B) data differs")));
                    }
                }
                Op::FetchAdd { result, .. } => {
                    if ok && a_mem.slice(BASE + Layout::src(c, i), 8) != result.to_ne_bytes() {
                        return Err(ctx(format!("{kind}: FETCH_ADD {i} returned the wrong value")));
                    }
                }
                Op::CompareSwap { word, result } => {
                    if ok {
                        if a_mem.slice(BASE + Layout::src(c, i), 8) != result.to_ne_bytes() {
                            return Err(ctx(format!("{kind}: CMP_SWAP {i} returned the wrong value")));
                        }
                        if b_mem.slice(BASE + word, 8) != (0xabcd_0000 + i as u64).to_ne_bytes() {
                            return Err(ctx(format!("{kind}: CMP_SWAP {i} did not store")));
                        }
                    }
                }
            }
        }
    }
    // The atomic counter holds exactly the sum of the fetch-adds that succeeded... or, if
    // the QP failed, at least those: a request whose answer was lost may have executed.
    let rc = &conns[0];
    let rc_sends: Vec<&Wc> = a_wcs.iter().filter(|w| w.qp_num == rc.a_qp).collect();
    let all_ok = rc_sends.iter().all(|w| w.status == WcStatus::Success);
    let mut sum = 0u64;
    for (i, op) in rc.ops.iter().enumerate() {
        if let Op::FetchAdd { add, .. } = op {
            if rc_sends[i].status == WcStatus::Success {
                sum += add;
            }
        }
    }
    let counter = u64::from_ne_bytes(b_mem.slice(BASE + Layout::counter(), 8).try_into().unwrap());
    if (all_ok && counter != sum) || counter < sum {
        return Err(ctx(format!("atomic counter {counter}, model {sum} (all succeeded: {all_ok})")));
    }
    // The memory-window connection, against its model.
    let a_mws: Vec<Option<MwInfo>> = mw.a_mws.iter().map(|&w| sim.node::<EngineNode>(na).engine.query_mw(w)).collect();
    let b_mws: Vec<Option<MwInfo>> =
        mw.wins.iter().map(|w| w.as_ref().and_then(|w| sim.node::<EngineNode>(nb).engine.query_mw(w.id))).collect();
    mw.a_infos = a_mws;
    mw.b_infos = b_mws;
    mw_check(&mw, &a_wcs, &b_wcs, a_mem, b_mem, &b_before, &mut mark).map_err(|e| {
        let done: Vec<String> = a_wcs
            .iter()
            .filter(|w| w.qp_num == mw.a_qp)
            .map(|w| format!("{:?}: {:?}", mw.ops[w.wr_id as usize], w.status))
            .collect();
        ctx(format!("{e}\n  MW ops: {done:#?}\n  bad: {:?}", mw.bad))
    })?;

    // The XRC connection, against its model.
    xrc_check(&xrc, &a_wcs, &b_wcs, &srq_wcs, a_mem, b_mem, &b_before, healed, &mut mark).map_err(|e| {
        let done: Vec<String> = a_wcs
            .iter()
            .filter(|w| w.qp_num == xrc.ini)
            .map(|w| format!("{:?}: {:?}", xrc.ops[w.wr_id as usize], w.status))
            .collect();
        ctx(format!("{e}\n  XRC ops: {done:#?}\n  bad: {:?}\n  SRQ completions: {srq_wcs:?}", xrc.bad))
    })?;

    // Nothing outside the targets changed.
    for (off, (&now, &before)) in b_mem.bytes().iter().zip(b_before.bytes()).enumerate() {
        if now != before && !touched[off] {
            return Err(ctx(format!("stray write at B offset {off:#x}")));
        }
    }
    Ok(())
}

#[test]
fn swarm_of_seeds_keeps_every_invariant() {
    let ran = swarm(500, run);
    assert!(ran >= 1);
}

// ---- memory windows ------------------------------------------------------------------------

/// The memory-window connection's index in [`Layout`] (after RC, UC and UD).
const MW_CONN: usize = 3;
/// A's own windows (the last one type 1, the others type 2), each over a 4 KiB page from
/// here.
const A_WIN_REGION: u64 = 3 << 20;
const A_WINS: usize = 4;

fn a_type(k: usize) -> MwType {
    if k == A_WINS - 1 { MwType::Type1 } else { MwType::Type2 }
}

/// `ibv_inc_rkey`.
fn inc_rkey(rkey: RKey) -> RKey {
    RKey((rkey.0 & !0xff) | (rkey.0.wrapping_add(1) & 0xff))
}

/// One operation of the memory-window connection.
#[derive(Clone, Copy, Debug)]
enum MwOp {
    /// WRITE `len` bytes at `off` in the op's own window of B's.
    Write { off: u64, len: u32 },
    /// READ `len` bytes at `off` in the op's own window, into `Layout::read_dest`.
    Read { off: u64, len: u32 },
    /// FETCH_ADD on the word at `off` in the op's own window.
    FetchAdd { off: u64, add: u64 },
    /// SEND_WITH_INV (fenced) of `len` bytes invalidating the window of op `target`.
    SendInv { target: usize, len: u32 },
    /// BIND_MW of A's window `k` (`A_WINS`: one deallocated before the run), its R_Key
    /// then `to`, to `len` bytes of its page.
    Bind { k: usize, to: RKey, len: u64 },
    /// LOCAL_INV of A's window `k` by R_Key.
    Inv { k: usize, rkey: RKey },
}

impl MwOp {
    /// The window of A's the op binds or invalidates.
    fn a_window(&self) -> Option<usize> {
        match *self {
            MwOp::Bind { k, .. } | MwOp::Inv { k, .. } if k < A_WINS => Some(k),
            _ => None,
        }
    }
}

/// A window of B's, bound before the run over part of its op's 8 KiB slot.
#[derive(Clone, Copy, Debug)]
struct BWin {
    id: MwId,
    rkey: RKey,
    mw_type: MwType,
    /// Its first byte, as an offset in B's memory.
    start: u64,
    len: u64,
    access: Access,
}

impl BWin {
    /// The remote address of byte `off` of the window.
    fn remote(&self, off: u64) -> u64 {
        if self.access.contains(Access::ZERO_BASED) { off } else { BASE + self.start + off }
    }
}

struct MwConn {
    a_qp: Qpn,
    b_qp: Qpn,
    ops: Vec<MwOp>,
    /// Each op's B window (ops that reach B's memory, and a bad SEND_WITH_INV's type 1
    /// target).
    wins: Vec<Option<BWin>>,
    /// The op that breaks a rule on purpose, and the status it must fail with.
    bad: Option<(usize, WcStatus)>,
    a_mws: Vec<MwId>,
    /// A's windows' R_Key and whether bound: before the first op, and after each op.
    a_initial: Vec<(RKey, bool)>,
    a_model: Vec<Vec<(RKey, bool)>>,
    /// What the devices say at the end.
    a_infos: Vec<Option<MwInfo>>,
    b_infos: Vec<Option<MwInfo>>,
}

fn rand(rng: &mut SimRng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// The memory-window connection: its QPs; B's region (binding, no remote right of its own)
/// and one window per operation that reaches B's memory, bound now by B's QP; A's region
/// and windows; the workload and its model, posted on A.
fn mw_setup(
    rng: &mut SimRng,
    a: &mut EngineNode,
    b: &mut EngineNode,
    (a_pd, a_cq, a_lkey): (PdId, CqId, LKey),
    (b_pd, b_cq, b_lkey): (PdId, CqId, LKey),
    cap: QpCap,
) -> Result<MwConn, String> {
    let c = MW_CONN;
    let init =
        |pd, cq| QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type: QpType::Rc, cap, sq_sig_all: false };
    let a_qp = a.engine.create_qp(&init(a_pd, a_cq)).unwrap();
    let b_qp = b.engine.create_qp(&init(b_pd, b_cq)).unwrap();
    let mtu = pick(rng, &[Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]);
    connect(a, a_qp, QpType::Rc, (b_qp, b.ip), mtu);
    connect(b, b_qp, QpType::Rc, (a_qp, a.ip), mtu);
    let (first, end) = (Layout::target(c, 0), Layout::target(c, OPS_PER_CONN));
    let b_region = b.engine.reg_mr(b_pd, BASE + first, end - first, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    for i in 0..OPS_PER_CONN {
        b.mem.slice_mut(BASE + Layout::target(c, i), 8192).copy_from_slice(&slot_bytes(i));
    }
    let a_region = a
        .engine
        .reg_mr(a_pd, BASE + A_WIN_REGION, (A_WINS as u64) << 12, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    let mut a_mws = Vec::new();
    let mut a_state = Vec::new();
    for k in 0..A_WINS {
        let (id, rkey) = a.engine.alloc_mw(a_pd, a_type(k)).unwrap();
        a_mws.push(id);
        a_state.push((rkey, false));
    }
    let a_initial = a_state.clone();
    let (gone, _) = a.engine.alloc_mw(a_pd, MwType::Type2).unwrap();
    a.engine.dealloc_mw(gone).unwrap();

    // The workload, op by op against the model: which of B's windows a SEND_WITH_INV frees,
    // and A's windows' keys and bindings. At most one op, in the second half, breaks a rule.
    let n = 4 + rand(rng, OPS_PER_CONN as u64 - 4) as usize;
    let bad_at = (rand(rng, 3) == 0).then(|| n / 2 + rand(rng, (n - n / 2) as u64) as usize);
    let (mut ops, mut freed, mut bad, mut a_model) = (Vec::new(), Vec::new(), None, Vec::new());
    let mut wins: Vec<Option<BWin>> = Vec::new();
    // A window for op `i` over its slot giving `access` (and zero based, maybe, if type 2),
    // holding `need` bytes from its start, or one byte less when `short`. Bound now, by B.
    let mut win_for = |rng: &mut SimRng, i: usize, need: u64, access: Access, t: Option<MwType>, short: bool| {
        let mw_type = t.unwrap_or(if rand(rng, 2) == 0 { MwType::Type1 } else { MwType::Type2 });
        let zero_based = mw_type == MwType::Type2 && rand(rng, 2) == 0;
        let lo = 8 * rand(rng, 256);
        let len = if short { need - 1 } else { need + rand(rng, 8192 - lo - need + 1) };
        let access = if zero_based { access | Access::ZERO_BASED } else { access };
        let (id, rkey) = b.engine.alloc_mw(b_pd, mw_type).unwrap();
        let start = Layout::target(c, i) + lo;
        let bind = MwBind { mr: b_region.lkey, addr: BASE + start, length: len, access };
        let op = SendOp::BindMw { mw: id, rkey: inc_rkey(rkey), bind };
        let wr =
            SendWr { wr_id: 1000 + i as u64, op, sg_list: &[], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        b.engine.post_send(b_qp, &[wr], &b.mem).unwrap();
        BWin { id, rkey: inc_rkey(rkey), mw_type, start, len, access }
    };
    let rights = |rng: &mut SimRng, need: Access| {
        need | [Access(0), Access::REMOTE_READ, Access::REMOTE_WRITE | Access::REMOTE_ATOMIC][rand(rng, 3) as usize]
    };
    for i in 0..n {
        let len = 1 + match rand(rng, 3) {
            0 => rand(rng, 64),
            1 => rand(rng, 1500),
            _ => rand(rng, 4096),
        } as u32;
        let off = 8 * rand(rng, 64);
        let need = off + u64::from(len);
        let mut win = None;
        let kind = rand(rng, 8);
        let op = if bad_at != Some(i) {
            match kind {
                0 | 1 => {
                    let r = rights(rng, Access::REMOTE_WRITE);
                    win = Some(win_for(rng, i, need, r, None, false));
                    MwOp::Write { off, len }
                }
                2 => {
                    let r = rights(rng, Access::REMOTE_READ);
                    win = Some(win_for(rng, i, need, r, None, false));
                    MwOp::Read { off, len }
                }
                3 => {
                    let r = rights(rng, Access::REMOTE_ATOMIC);
                    win = Some(win_for(rng, i, off + 8, r, None, false));
                    MwOp::FetchAdd { off, add: rand(rng, 1000) }
                }
                4 | 5 => {
                    // Invalidates a type 2 window an earlier op reached B through.
                    let target = (0..i).find(|&j| {
                        wins[j].is_some_and(|w| w.mw_type == MwType::Type2)
                            && !freed.contains(&j)
                            && !matches!(ops[j], MwOp::SendInv { .. })
                    });
                    if let Some(target) = target {
                        freed.push(target);
                        MwOp::SendInv { target, len }
                    } else {
                        let r = rights(rng, Access::REMOTE_WRITE);
                        win = Some(win_for(rng, i, need, r, None, false));
                        MwOp::Write { off, len }
                    }
                }
                _ => {
                    // A's own windows: a bound type 2 one is invalidated, any other bound.
                    let k = rand(rng, A_WINS as u64) as usize;
                    let (rkey, bound) = a_state[k];
                    if a_type(k) == MwType::Type2 && bound {
                        a_state[k].1 = false;
                        MwOp::Inv { k, rkey }
                    } else {
                        a_state[k] = (inc_rkey(rkey), true);
                        MwOp::Bind { k, to: inc_rkey(rkey), len: 1 + rand(rng, 4096) }
                    }
                }
            }
        } else {
            let (op, status) = match kind % 6 {
                // One byte past its window.
                0 => {
                    win = Some(win_for(rng, i, need, Access::REMOTE_WRITE, None, true));
                    (MwOp::Write { off, len }, WcStatus::RemAccessErr)
                }
                // Through a window that only reads.
                1 => {
                    win = Some(win_for(rng, i, need, Access::REMOTE_READ, None, false));
                    (MwOp::Write { off, len }, WcStatus::RemAccessErr)
                }
                // A SEND_WITH_INV of a type 1 window: class J at B.
                2 => {
                    win = Some(win_for(rng, i, 8, Access::REMOTE_READ, Some(MwType::Type1), false));
                    (MwOp::SendInv { target: i, len }, WcStatus::RemInvReqErr)
                }
                // A LOCAL_INV of a free window of A's, or of its type 1 one.
                3 => {
                    let k = (0..A_WINS).find(|&k| !a_state[k].1).unwrap_or(A_WINS - 1);
                    (MwOp::Inv { k, rkey: a_state[k].0 }, WcStatus::LocQpOpErr)
                }
                // A BIND_MW of a bound type 2 window of A's, or of a deallocated one.
                4 => {
                    let k = (0..A_WINS - 1).find(|&k| a_state[k].1).unwrap_or(A_WINS);
                    let to = a_state.get(k).map_or(RKey(0), |&(rkey, _)| inc_rkey(rkey));
                    (MwOp::Bind { k, to, len: 64 }, WcStatus::MwBindErr)
                }
                // Through a window a SEND_WITH_INV freed, if any; else past its window.
                _ => match freed.first().and_then(|&j| wins[j]) {
                    Some(w) => {
                        win = Some(w);
                        (MwOp::Write { off: 0, len: len.min(w.len as u32) }, WcStatus::RemAccessErr)
                    }
                    None => {
                        win = Some(win_for(rng, i, need, Access::REMOTE_WRITE, None, true));
                        (MwOp::Write { off, len }, WcStatus::RemAccessErr)
                    }
                },
            };
            bad = Some((i, status));
            op
        };
        ops.push(op);
        wins.push(win);
        a_model.push(a_state.clone());
    }

    // B's binds run now (local operations: no packet), each a success.
    let mut buf = vec![0u8; 4200];
    if b.engine.poll_transmit(Time::ZERO, &mut b.mem, &mut buf).is_some() {
        return Err("B sent a packet before the run".into());
    }
    while let Some(wc) = b.engine.poll_cq(b_cq) {
        if (wc.status, wc.opcode) != (WcStatus::Success, WcOpcode::BindMw) {
            return Err(format!("B's bind {} completed {:?} {:?}", wc.wr_id, wc.status, wc.opcode));
        }
    }

    // A's sources, B's receives, and A's work requests.
    for (i, op) in ops.iter().enumerate() {
        let src = Sge { addr: BASE + Layout::src(c, i), length: 0, lkey: a_lkey };
        let win = wins[i];
        let w = || win.expect("the op's window");
        let mut flags = SendFlags::SIGNALED;
        let (op, sge) = match *op {
            MwOp::Write { off, len } => {
                a.mem.slice_mut(src.addr, len as usize).copy_from_slice(&payload(c, i, len));
                (SendOp::RdmaWrite { remote_addr: w().remote(off), rkey: w().rkey }, Some(Sge { length: len, ..src }))
            }
            MwOp::Read { off, len } => {
                let dest = Sge { addr: BASE + Layout::read_dest(c, i), length: len, lkey: a_lkey };
                (SendOp::RdmaRead { remote_addr: w().remote(off), rkey: w().rkey }, Some(dest))
            }
            MwOp::FetchAdd { off, add } => {
                (SendOp::FetchAdd { remote_addr: w().remote(off), rkey: w().rkey, add }, Some(Sge { length: 8, ..src }))
            }
            MwOp::SendInv { target, len } => {
                a.mem.slice_mut(src.addr, len as usize).copy_from_slice(&payload(c, i, len));
                let slot = Sge { addr: BASE + Layout::recv(c, i), length: 8192, lkey: b_lkey };
                b.engine.post_recv(b_qp, &[RecvWr { wr_id: i as u64, sg_list: &[slot] }]).map_err(|e| e.to_string())?;
                flags = flags | SendFlags::FENCE; // behind the READs and atomics before it
                let rkey = wins[target].expect("a window to invalidate").rkey;
                (SendOp::SendWithInv { rkey }, Some(Sge { length: len, ..src }))
            }
            MwOp::Bind { k, to, len } => {
                let addr = BASE + A_WIN_REGION + ((k.min(A_WINS - 1) as u64) << 12);
                let bind = MwBind { mr: a_region.lkey, addr, length: len, access: Access::REMOTE_READ };
                (SendOp::BindMw { mw: a_mws.get(k).copied().unwrap_or(gone), rkey: to, bind }, None)
            }
            MwOp::Inv { rkey, .. } => (SendOp::LocalInv { rkey }, None),
        };
        let sg_list: &[Sge] = match &sge {
            Some(s) => std::slice::from_ref(s),
            None => &[],
        };
        let wr = SendWr { wr_id: i as u64, op, sg_list, flags, ud: None, xrc_srqn: None };
        a.engine.post_send(a_qp, &[wr], &a.mem).map_err(|e| format!("post_send: {e}"))?;
    }
    Ok(MwConn { a_qp, b_qp, ops, wins, bad, a_mws, a_initial, a_model, a_infos: Vec::new(), b_infos: Vec::new() })
}

/// What B's 8 KiB slot `i` of the memory-window connection holds before the run.
fn slot_bytes(i: usize) -> Vec<u8> {
    payload(MW_CONN + 100, i, 8192)
}

/// The memory-window connection's invariants (see the module's documentation).
#[allow(clippy::too_many_arguments)]
fn mw_check(
    mw: &MwConn,
    a_wcs: &[Wc],
    b_wcs: &[Wc],
    a_mem: &VecMemory,
    b_mem: &VecMemory,
    b_before: &VecMemory,
    mark: &mut dyn FnMut(u64, usize),
) -> Result<(), String> {
    let c = MW_CONN;
    let n = mw.ops.len();
    let sends: Vec<&Wc> = a_wcs.iter().filter(|w| w.qp_num == mw.a_qp).collect();
    let ids: Vec<u64> = sends.iter().map(|w| w.wr_id).collect();
    if ids != (0..n as u64).collect::<Vec<_>>() {
        return Err(format!("MW: send completions {ids:?}, expected 0..{n} (exactly once, in order)"));
    }
    // Successes up to the first error; that error is the planned one at its op, or retries
    // running out at or before it; flushes after.
    let first_error = sends.iter().position(|w| w.status != WcStatus::Success).unwrap_or(n);
    if let Some(w) = sends.get(first_error) {
        let planned = mw.bad.is_some_and(|(i, s)| i == first_error && s == w.status);
        let retries = matches!(w.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr)
            && mw.bad.is_none_or(|(i, _)| first_error <= i);
        if !planned && !retries {
            return Err(format!(
                "MW: op {first_error} {:?} completed {:?} (planned: {:?})",
                mw.ops[first_error], w.status, mw.bad
            ));
        }
    } else if let Some((i, s)) = mw.bad {
        return Err(format!("MW: op {i} {:?} succeeded; it must fail with {s:?}", mw.ops[i]));
    }
    if let Some(w) = sends.iter().skip(first_error + 1).find(|w| w.status != WcStatus::WrFlushErr) {
        return Err(format!("MW: op {} completed {:?} after the error", w.wr_id, w.status));
    }
    let expected_wc = |op: &MwOp| match op {
        MwOp::Write { .. } => WcOpcode::RdmaWrite,
        MwOp::Read { .. } => WcOpcode::RdmaRead,
        MwOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        MwOp::SendInv { .. } => WcOpcode::Send,
        MwOp::Bind { .. } => WcOpcode::BindMw,
        MwOp::Inv { .. } => WcOpcode::LocalInv,
    };
    for (i, w) in sends.iter().enumerate() {
        if w.opcode != expected_wc(&mw.ops[i]) {
            return Err(format!("MW: op {i} {:?} completed as {:?}", mw.ops[i], w.opcode));
        }
    }

    // B's receives: only SEND_WITH_INVs consume them, in order; each carries its message
    // and the R_Key it invalidated.
    let recvs: Vec<&Wc> = b_wcs.iter().filter(|w| w.qp_num == mw.b_qp).collect();
    let mut last = None;
    for r in &recvs {
        let i = r.wr_id as usize;
        if last.is_some_and(|l| i <= l) {
            return Err(format!("MW: receive {i} completed out of order or twice"));
        }
        last = Some(i);
        let Some(&MwOp::SendInv { target, len }) = mw.ops.get(i) else {
            return Err(format!("MW: a receive {i} completed that no SEND_WITH_INV was posted for"));
        };
        let planned_j = mw.bad.is_some_and(|(b, s)| b == i && s == WcStatus::RemInvReqErr);
        match r.status {
            WcStatus::Success if !planned_j => {
                let rkey = mw.wins[target].map(|w| w.rkey);
                if r.invalidated_rkey != rkey || r.byte_len != len || r.imm_data.is_some() {
                    return Err(format!("MW: SEND_WITH_INV {i}'s receive {r:?}, expected R_Key {rkey:?}, {len} B"));
                }
                if b_mem.slice(BASE + Layout::recv(c, i), len as usize) != payload(c, i, len) {
                    return Err(format!("MW: SEND_WITH_INV {i}'s data differs"));
                }
            }
            WcStatus::RemInvReqErr if planned_j => {}
            WcStatus::WrFlushErr => {}
            s => return Err(format!("MW: receive {i} completed {s:?}")),
        }
        mark(Layout::recv(c, i), 8192);
    }
    for (i, op) in mw.ops.iter().enumerate() {
        if let (MwOp::SendInv { len, .. }, true) = (op, i < first_error) {
            let got = recvs.iter().find(|r| r.wr_id == i as u64 && r.status == WcStatus::Success);
            if got.is_none() {
                return Err(format!("MW: SEND_WITH_INV {i} ({len} B) acknowledged but no receive completed"));
            }
        }
    }

    // Memory: what succeeded landed exactly; the planned failure landed nothing (its bytes
    // are not marked, so the stray-write check holds it to that); what may have executed
    // after an error may have landed.
    for (i, op) in mw.ops.iter().enumerate() {
        let ok = i < first_error;
        let planned = mw.bad.is_some_and(|(b, _)| b == i);
        let Some(w) = mw.wins[i] else { continue };
        match *op {
            MwOp::Write { off, len } => {
                let at = w.start + off;
                if ok && b_mem.slice(BASE + at, len as usize) != payload(c, i, len) {
                    return Err(format!("MW: WRITE {i} ({len} B through {w:?}) did not land whole"));
                }
                if !planned {
                    mark(at, len as usize);
                }
            }
            MwOp::Read { off, len } => {
                let at = w.start + off - Layout::target(c, i);
                let want = &slot_bytes(i)[at as usize..at as usize + len as usize];
                if ok && a_mem.slice(BASE + Layout::read_dest(c, i), len as usize) != want {
                    return Err(format!("MW: READ {i} ({len} B through {w:?}) data differs"));
                }
            }
            MwOp::FetchAdd { off, add } => {
                let at = w.start + off;
                let before = u64::from_ne_bytes(b_before.slice(BASE + at, 8).try_into().unwrap());
                let after = u64::from_ne_bytes(b_mem.slice(BASE + at, 8).try_into().unwrap());
                if ok {
                    let got = a_mem.slice(BASE + Layout::src(c, i), 8);
                    if got != before.to_ne_bytes() || after != before.wrapping_add(add) {
                        return Err(format!("MW: FETCH_ADD {i} through {w:?}: {before} + {add} -> {after}"));
                    }
                }
                mark(at, 8);
            }
            _ => {}
        }
    }

    // B's windows: bound as bound, but those a successful SEND_WITH_INV freed.
    for (j, w) in mw.wins.iter().enumerate() {
        let Some(w) = w else { continue };
        if mw.wins[..j].iter().flatten().any(|earlier| earlier.id == w.id) {
            continue; // a write through a freed window borrows that window
        }
        let Some(info) = mw.b_infos[j] else { return Err(format!("MW: B's window {j} is gone")) };
        let inv = mw.ops.iter().position(|op| matches!(*op, MwOp::SendInv { target, .. } if target == j));
        let planned_j = mw.bad.is_some_and(|(b, s)| Some(b) == inv && s == WcStatus::RemInvReqErr);
        let want_bound = match inv {
            Some(k) if k < first_error && !planned_j => Some(false),
            Some(_) if !planned_j => None, // may or may not have run at B
            _ => Some(true),
        };
        if info.rkey != w.rkey || want_bound.is_some_and(|b| b != info.binding.is_some()) {
            return Err(format!("MW: B's window {j} ({w:?}) ended {info:?}; expected bound: {want_bound:?}"));
        }
    }
    // A's windows: as the model has them after the last op that succeeded, unless an op
    // on them at or after the first error (other than the planned one, which changes
    // nothing) may have run.
    let model = if first_error == 0 { &mw.a_initial } else { &mw.a_model[first_error - 1] };
    for (k, (info, want)) in mw.a_infos.iter().zip(model).enumerate() {
        let unsure = mw
            .ops
            .iter()
            .enumerate()
            .skip(first_error)
            .any(|(i, op)| op.a_window() == Some(k) && mw.bad.is_none_or(|(b, _)| b != i));
        let info = info.ok_or_else(|| format!("MW: A's window {k} is gone"))?;
        if !unsure && (info.rkey, info.binding.is_some()) != *want {
            return Err(format!("MW: A's window {k} ended {info:?}; the model says {want:?}"));
        }
    }
    Ok(())
}

// ---- XRC -----------------------------------------------------------------------------------

/// The XRC connection's index in [`Layout`] and [`payload`] (after the memory-window one).
const XRC_CONN: usize = MW_CONN + 1;
/// B's XRC SRQs' regions: SRQ `k`'s is `XRC_REGION_LEN` bytes from `XRC_REGIONS + k *
/// XRC_REGION_LEN`, registered in the SRQ's PD: 8 KiB slot `i` for op `i` (the buffer of
/// its SEND's receive, or its target), slot `16 + i` for the receive of its WRITE_WITH_IMM.
const XRC_REGIONS: u64 = 0x32_0000;
const XRC_REGION_LEN: u64 = 0x4_0000;

fn xrc_slot(k: usize, i: usize) -> u64 {
    XRC_REGIONS + k as u64 * XRC_REGION_LEN + ((i as u64) << 13)
}

/// The PD (of two) of SRQ `k`: SRQ 1 has its own, SRQs 0 and 2 share one.
fn xrc_pd(k: usize) -> usize {
    usize::from(k == 1)
}

/// One operation of the XRC connection. An atomic acts on the word at the op's slot, which
/// holds `old` before the run.
#[derive(Clone, Copy, Debug)]
enum XrcKind {
    Send { len: u32 },
    Write { len: u32 },
    WriteImm { len: u32 },
    Read { len: u32 },
    FetchAdd { old: u64, add: u64 },
    CompareSwap { old: u64, compare: u64, swap: u64 },
}

/// An XRC operation: what, the SRQ it names, and the region (of the SRQ's PD, but for the
/// bad op) whose key and memory it uses.
#[derive(Clone, Copy, Debug)]
struct XrcOp {
    kind: XrcKind,
    srq: usize,
    region: usize,
}

struct XrcSrq {
    cq: CqId,
}

struct XrcConn {
    ini: Qpn,
    tgt: Qpn,
    srqs: Vec<XrcSrq>,
    ops: Vec<XrcOp>,
    /// The op that uses a key of another PD than its SRQ's: it must fail.
    bad: Option<usize>,
}

/// The XRC connection: A's INI QP, B's TGT QP and XRC SRQs (with their PDs, CQs and
/// regions), the workload and its model; receives posted on B's SRQs, WRs on A.
fn xrc_setup(
    rng: &mut SimRng,
    a: &mut EngineNode,
    b: &mut EngineNode,
    (a_pd, a_cq, a_lkey): (PdId, CqId, LKey),
    cap: QpCap,
) -> Result<XrcConn, String> {
    let c = XRC_CONN;
    let cap = QpCap { max_recv_wr: 0, max_recv_sge: 0, ..cap };
    let init = QpInitAttr {
        pd: a_pd,
        send_cq: a_cq,
        recv_cq: a_cq,
        srq: None,
        qp_type: QpType::XrcIni,
        cap,
        sq_sig_all: false,
    };
    let ini = a.engine.create_qp(&init).unwrap();
    let xrcd = b.engine.alloc_xrcd().unwrap();
    let tgt = b.engine.create_xrc_tgt_qp(xrcd).unwrap();
    let mtu = pick(rng, &[Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]);
    connect(a, ini, QpType::XrcIni, (tgt, b.ip), mtu);
    connect(b, tgt, QpType::XrcTgt, (ini, a.ip), mtu);
    let pds = [b.engine.alloc_pd(), b.engine.alloc_pd()];
    let n_srqs = 2 + rand(rng, 2) as usize;
    let (mut srqs, mut ids, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..n_srqs {
        let pd = pds[xrc_pd(k)];
        let cq = b.engine.create_cq(64).unwrap();
        ids.push(b.engine.create_xrc_srq(pd, xrcd, cq, 2 * OPS_PER_CONN as u32, 1).unwrap());
        keys.push(b.engine.reg_mr(pd, BASE + xrc_slot(k, 0), XRC_REGION_LEN, Access::ALL).unwrap());
        srqs.push(XrcSrq { cq });
    }

    // The workload. At most one op, in the second half, uses a region of the other PD.
    let n = 4 + rand(rng, OPS_PER_CONN as u64 - 4) as usize;
    let bad = (rand(rng, 4) == 0).then(|| n / 2 + rand(rng, (n - n / 2) as u64) as usize);
    let mut ops = Vec::new();
    for i in 0..n {
        let srq = rand(rng, n_srqs as u64) as usize;
        let len = match rand(rng, 4) {
            0 => 0,
            1 => 1 + rand(rng, 64) as u32,
            2 => 1 + rand(rng, 3000) as u32,
            _ => 1 + rand(rng, 8000) as u32,
        };
        let old = rng.next_u64();
        let mut kind = match rand(rng, 6) {
            0 => XrcKind::Send { len },
            1 => XrcKind::Write { len },
            2 => XrcKind::WriteImm { len },
            3 => XrcKind::Read { len },
            4 => XrcKind::FetchAdd { old, add: rng.next_u64() % 1000 },
            _ => {
                let compare = if rand(rng, 2) == 0 { old } else { old ^ 1 };
                XrcKind::CompareSwap { old, compare, swap: rng.next_u64() }
            }
        };
        let pd_wanted = if bad == Some(i) { 1 - xrc_pd(srq) } else { xrc_pd(srq) };
        let regions: Vec<usize> = (0..n_srqs).filter(|&r| xrc_pd(r) == pd_wanted).collect();
        let region = regions[rand(rng, regions.len() as u64) as usize];
        if bad == Some(i) {
            // A key matters: an operation on memory, of one byte at least (C9-88: a
            // zero-length one needs no valid key).
            kind = match kind {
                XrcKind::Send { len } | XrcKind::Write { len } => XrcKind::Write { len: len.max(1) },
                XrcKind::WriteImm { len } => XrcKind::WriteImm { len: len.max(1) },
                XrcKind::Read { len } => XrcKind::Read { len: len.max(1) },
                atomic => atomic,
            };
        }
        ops.push(XrcOp { kind, srq, region });
    }

    // Sources, B's receives (each SRQ's in the order of the messages naming it), A's WRs.
    for (i, op) in ops.iter().enumerate() {
        let target = xrc_slot(op.region, i);
        let src = Sge { addr: BASE + Layout::src(c, i), length: 0, lkey: a_lkey };
        let recv = |slot: u64| Sge { addr: BASE + slot, length: 8192, lkey: keys[op.srq].lkey };
        let (rkey, remote) = (keys[op.region].rkey, BASE + target);
        let (wop, sge, recv) = match op.kind {
            XrcKind::Send { len } => (SendOp::Send, Sge { length: len, ..src }, Some(recv(xrc_slot(op.srq, i)))),
            XrcKind::Write { len } => {
                (SendOp::RdmaWrite { remote_addr: remote, rkey }, Sge { length: len, ..src }, None)
            }
            XrcKind::WriteImm { len } => (
                SendOp::RdmaWriteWithImm { remote_addr: remote, rkey, imm: (i as u32).to_be_bytes() },
                Sge { length: len, ..src },
                Some(recv(xrc_slot(op.srq, OPS_PER_CONN + i))),
            ),
            XrcKind::Read { len } => {
                b.mem.slice_mut(remote, len as usize).copy_from_slice(&payload(c, i, len));
                let dest = Sge { addr: BASE + Layout::read_dest(c, i), length: len, lkey: a_lkey };
                (SendOp::RdmaRead { remote_addr: remote, rkey }, dest, None)
            }
            XrcKind::FetchAdd { old, add } => {
                b.mem.slice_mut(remote, 8).copy_from_slice(&old.to_ne_bytes());
                (SendOp::FetchAdd { remote_addr: remote, rkey, add }, Sge { length: 8, ..src }, None)
            }
            XrcKind::CompareSwap { old, compare, swap } => {
                b.mem.slice_mut(remote, 8).copy_from_slice(&old.to_ne_bytes());
                (SendOp::CompareSwap { remote_addr: remote, rkey, compare, swap }, Sge { length: 8, ..src }, None)
            }
        };
        if let XrcKind::Send { len } | XrcKind::Write { len } | XrcKind::WriteImm { len } = op.kind {
            a.mem.slice_mut(src.addr, len as usize).copy_from_slice(&payload(c, i, len));
        }
        if let Some(r) = recv {
            let wr = RecvWr { wr_id: i as u64, sg_list: &[r] };
            b.engine.post_srq_recv(ids[op.srq], &[wr]).map_err(|e| format!("post_srq_recv: {e}"))?;
        }
        let wr = SendWr {
            wr_id: i as u64,
            op: wop,
            sg_list: &[sge],
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: Some(ids[op.srq].0),
        };
        a.engine.post_send(ini, &[wr], &a.mem).map_err(|e| format!("post_send: {e}"))?;
    }
    Ok(XrcConn { ini, tgt, srqs, ops, bad })
}

/// Whether op `i` executed at B, as far as A's completions tell.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ran {
    Yes,
    Maybe,
    No,
}

/// The XRC connection's invariants (see the module's documentation).
#[allow(clippy::too_many_arguments)]
fn xrc_check(
    x: &XrcConn,
    a_wcs: &[Wc],
    b_wcs: &[Wc],
    srq_wcs: &[Vec<Wc>],
    a_mem: &VecMemory,
    b_mem: &VecMemory,
    b_before: &VecMemory,
    healed: Time,
    mark: &mut dyn FnMut(u64, usize),
) -> Result<(), String> {
    let c = XRC_CONN;
    let n = x.ops.len();
    // A's WRs: each completes once, in order; successes, then the planned error or retries
    // running out at or before it, then flushes.
    let sends: Vec<&Wc> = a_wcs.iter().filter(|w| w.qp_num == x.ini).collect();
    let ids: Vec<u64> = sends.iter().map(|w| w.wr_id).collect();
    if ids != (0..n as u64).collect::<Vec<_>>() {
        return Err(format!("XRC: send completions {ids:?}, expected 0..{n} (exactly once, in order)"));
    }
    let first_error = sends.iter().position(|w| w.status != WcStatus::Success).unwrap_or(n);
    if let Some(w) = sends.get(first_error) {
        let planned = x.bad == Some(first_error) && w.status == WcStatus::RemAccessErr;
        let retries = matches!(w.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr)
            && x.bad.is_none_or(|b| first_error <= b);
        if !planned && !retries {
            return Err(format!("XRC: op {first_error} {:?} completed {:?}", x.ops[first_error], w.status));
        }
        if retries && x.bad.is_none() {
            // (After a bad op the TGT QP may be in error, and nothing answers a retry.)
            late_failure(w, healed).map_err(|e| format!("XRC: {e}"))?;
        }
    } else if let Some(b) = x.bad {
        return Err(format!("XRC: op {b} {:?} succeeded with a key of another PD than its SRQ's", x.ops[b]));
    }
    if let Some(w) = sends.iter().skip(first_error + 1).find(|w| w.status != WcStatus::WrFlushErr) {
        return Err(format!("XRC: op {} completed {:?} after the error", w.wr_id, w.status));
    }
    for (w, op) in sends.iter().zip(&x.ops) {
        let want = match op.kind {
            XrcKind::Send { .. } => WcOpcode::Send,
            XrcKind::Write { .. } | XrcKind::WriteImm { .. } => WcOpcode::RdmaWrite,
            XrcKind::Read { .. } => WcOpcode::RdmaRead,
            XrcKind::FetchAdd { .. } => WcOpcode::FetchAdd,
            XrcKind::CompareSwap { .. } => WcOpcode::CompSwap,
        };
        if w.opcode != want {
            return Err(format!("XRC: op {} {op:?} completed as {:?}", w.wr_id, w.opcode));
        }
    }
    // What ran at B: everything A saw succeed; nothing from the bad op on (refused, the
    // TGT QP then in error); what lies between may have, its answer lost.
    let ran = |i: usize| match i {
        i if i < first_error => Ran::Yes,
        i if x.bad.is_some_and(|b| i >= b) => Ran::No,
        _ => Ran::Maybe,
    };

    // Receives: none on B's own CQ; on each SRQ's CQ, the messages that named it, a prefix
    // of them in order, each once, with the TGT QPN, its length, its data or immediate.
    if let Some(w) = b_wcs.iter().find(|w| w.qp_num == x.tgt) {
        return Err(format!("XRC: a completion of the TGT QP on B's own CQ: {w:?}"));
    }
    for (k, got) in srq_wcs.iter().enumerate() {
        let named: Vec<usize> = (0..n)
            .filter(|&i| x.ops[i].srq == k && matches!(x.ops[i].kind, XrcKind::Send { .. } | XrcKind::WriteImm { .. }))
            .collect();
        let got_ids: Vec<usize> = got.iter().map(|w| w.wr_id as usize).collect();
        if got_ids.len() > named.len() || got_ids != named[..got_ids.len()] {
            return Err(format!("XRC: SRQ {k}'s CQ completed {got_ids:?}; the messages naming it are {named:?}"));
        }
        for w in got {
            let i = w.wr_id as usize;
            let (len, opcode, imm) = match x.ops[i].kind {
                XrcKind::Send { len } => (len, WcOpcode::Recv, None),
                XrcKind::WriteImm { len } => (len, WcOpcode::RecvRdmaWithImm, Some((i as u32).to_be_bytes())),
                _ => unreachable!("only messages that take a receive are named"),
            };
            if (w.status, w.opcode, w.byte_len, w.imm_data, w.qp_num) != (WcStatus::Success, opcode, len, imm, x.tgt) {
                return Err(format!("XRC: op {i} {:?}'s receive on SRQ {k}: {w:?}", x.ops[i]));
            }
        }
        for &i in &named {
            let done = got_ids.contains(&i);
            if (ran(i) == Ran::Yes && !done) || (ran(i) == Ran::No && done) {
                return Err(format!("XRC: op {i} {:?} ran: {:?}, its receive completed: {done}", x.ops[i], ran(i)));
            }
        }
    }

    // Memory: what ran landed exactly where it named; what may have, may have; the rest
    // (the bad op included) is not marked, so the stray-write check holds it to nothing.
    let word = |m: &VecMemory, at: u64| u64::from_ne_bytes(m.slice(BASE + at, 8).try_into().unwrap());
    for (i, op) in x.ops.iter().enumerate() {
        let at = xrc_slot(op.region, i);
        let r = ran(i);
        let received = srq_wcs[op.srq].iter().any(|w| w.wr_id == i as u64);
        match op.kind {
            XrcKind::Send { len } => {
                let slot = xrc_slot(op.srq, i);
                if received && b_mem.slice(BASE + slot, len as usize) != payload(c, i, len) {
                    return Err(format!("XRC: SEND {i} to SRQ {}: its receive's data differs", op.srq));
                }
                if r != Ran::No {
                    mark(slot, len as usize);
                }
            }
            XrcKind::Write { len } | XrcKind::WriteImm { len } => {
                if (r == Ran::Yes || received) && b_mem.slice(BASE + at, len as usize) != payload(c, i, len) {
                    return Err(format!("XRC: WRITE {i} ({len} B, region {}) did not land whole", op.region));
                }
                if r != Ran::No {
                    mark(at, len as usize);
                }
            }
            XrcKind::Read { len } => {
                let dest = a_mem.slice(BASE + Layout::read_dest(c, i), len as usize);
                if r == Ran::Yes && dest != payload(c, i, len) {
                    return Err(format!("XRC: READ {i} ({len} B, region {}) data differs", op.region));
                }
                if r == Ran::No && dest.iter().any(|&b| b != 0) {
                    return Err(format!("XRC: READ {i} brought data back though it never ran"));
                }
            }
            XrcKind::FetchAdd { old, .. } | XrcKind::CompareSwap { old, .. } => {
                let new = match op.kind {
                    XrcKind::FetchAdd { add, .. } => old.wrapping_add(add),
                    XrcKind::CompareSwap { compare, swap, .. } if compare == old => swap,
                    _ => old,
                };
                let (now, result) = (word(b_mem, at), a_mem.slice(BASE + Layout::src(c, i), 8));
                let before = word(b_before, at);
                let ok = match r {
                    Ran::Yes => now == new && result == old.to_ne_bytes(),
                    Ran::Maybe => now == new || now == old,
                    Ran::No => now == old && result == [0; 8],
                };
                if before != old || !ok {
                    return Err(format!(
                        "XRC: atomic {i} {op:?}: {before:#x} -> {now:#x}, returned {result:?} (ran: {r:?})"
                    ));
                }
                if r != Ran::No {
                    mark(at, 8);
                }
            }
        }
    }
    Ok(())
}
