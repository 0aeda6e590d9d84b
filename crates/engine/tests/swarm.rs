//! Swarm simulation: for each seed, a bad network drawn from the seed (loss, duplication,
//! reordering, corruption), a random mix of every operation over RC, UC and UD (on devices
//! whose RC QPs share a small window per peer in a third of the seeds), then the
//! network heals and the run must converge. The invariants are checked here, outside the
//! code under test, against a reference model of what memory and completions must be:
//!
//! - every RC WR completes exactly once, in posting order; successes, then at most one
//!   error, then only flushes;
//! - target memory equals the model for every WR that succeeded; UC WRITEs land whole
//!   packets or nothing; no byte outside the targets changes;
//! - every receive completes at most once and carries exactly what was sent;
//! - after the heal, every RC QP has completed everything posted.
//!
//! `SOFTRDMA_SEEDS=10000 cargo test -p softrdma-engine --release --test swarm` runs more
//! seeds; `SOFTRDMA_SEED=0x...` replays one.

use std::net::IpAddr;
use std::time::Duration;

use softrdma_engine::*;
use softrdma_sim::{Fabric, FaultConfig, Node, NodeId, SimRng, Time, swarm};
use softrdma_wire::{Envelope, Gid, QKey, Qpn};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 4 << 20;

/// An engine and its memory, as a node of the simulated fabric.
struct EngineNode {
    engine: Engine,
    mem: VecMemory,
    ip: IpAddr,
}

impl Node for EngineNode {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.ip]
    }
    fn handle_datagram(&mut self, now: Time, envelope: &Envelope, payload: &[u8]) {
        self.engine.handle_datagram(now, envelope, payload, &mut self.mem);
    }
    fn handle_timeout(&mut self, now: Time) {
        self.engine.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        self.engine.poll_transmit(now, &mut self.mem, buf).map(|t| (t.envelope, t.len))
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.engine.poll_timeout()
    }
}

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
    let rc = qp_type == QpType::Rc;
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
    if rc {
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
    if rc {
        mask = mask | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
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
            let wr = SendWr { wr_id: i as u64, op, sg_list: &[sge], flags: SendFlags::SIGNALED, ud };
            a.engine.post_send(conn.a_qp, &[wr], &a.mem).map_err(|e| format!("post_send: {e}"))?;
        }
    }

    let b_before = b.mem.clone();
    let na: NodeId = sim.add_node(a);
    let nb: NodeId = sim.add_node(b);

    // The faulty phase, then heal and demand convergence: the fabric must go idle, with
    // nothing in flight and no timer armed, which a QP still retrying never is.
    sim.run_for(Duration::from_millis(20)).map_err(|e| e.to_string())?;
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
    {
        let b = sim.node_mut::<EngineNode>(nb);
        while let Some(wc) = b.engine.poll_cq(b_cq) {
            b_wcs.push(wc);
        }
    }
    let a_mem = sim.node::<EngineNode>(na).mem.clone();
    let b_mem = sim.node::<EngineNode>(nb).mem.clone();
    let state = {
        let (a, b) = (&sim.node::<EngineNode>(na).engine, &sim.node::<EngineNode>(nb).engine);
        let qps: Vec<String> = conns
            .iter()
            .map(|c| format!("{:?} a={:?} b={:?}", c.qp_type, a.qp_state(c.a_qp), b.qp_state(c.b_qp)))
            .collect();
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
