//! Swarm simulation of regions registered on demand (`Access::ON_DEMAND`): for each seed, a
//! bad network drawn from the seed, and a target region some of whose pages are not mapped
//! and some read-only, as the pages of an on-demand region may be when the device reaches
//! them (the runtime's `Memory` faults where the access is not allowed). A random mix of
//! WRITE, READ, FETCH_ADD, CMP_SWAP and ATOMIC_WRITE over one RC connection touches it;
//! then the network heals and the run must converge. Checked here, outside the code under
//! test, against a model:
//!
//! - every WR completes exactly once, in posting order: successes, then at most one error,
//!   then only flushes; the error is a remote access error at the first WR that touches a
//!   page that does not allow it (or a retry error before it, from the network), never
//!   later;
//! - every WR before the error did all it should: written bytes are there, READs and
//!   atomics returned what the model says;
//! - no page that does not allow an access was changed, and no byte outside the targets.
//!
//! `SOFTRDMA_SEEDS=10000 cargo test -p softrdma-engine --release --test swarm_odp` runs
//! more seeds; `SOFTRDMA_SEED=0x...` replays one.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod common;

use common::{SimNode, connect_qp};
use softrdma_engine::*;
use softrdma_sim::{Fabric, FaultConfig, NodeId, SimRng, swarm};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 2 << 20;
const PAGE: u64 = 4096;
/// The region on demand at B: 64 pages from here.
const REGION: u64 = 1 << 20;
const PAGES: u64 = 64;
/// A's buffers: sources of WRITEs, destinations of READs and atomics' results.
const A_BUF: u64 = 0;
/// Runs whose QP failed at a page that refused it, and runs with no error at all: the
/// swarm must see both.
static FAULTED: AtomicUsize = AtomicUsize::new(0);
static CLEAN: AtomicUsize = AtomicUsize::new(0);

/// Memory whose pages may be unmapped or read-only, as an on-demand region's may be.
#[derive(Clone)]
struct Paged {
    mem: VecMemory,
    unmapped: BTreeSet<u64>,
    read_only: BTreeSet<u64>,
}

impl Paged {
    fn pages(addr: u64, len: usize) -> impl Iterator<Item = u64> {
        let last = addr + len.max(1) as u64 - 1;
        (addr / PAGE)..=(last / PAGE)
    }
    fn allows(&self, addr: u64, len: usize, write: bool) -> bool {
        Self::pages(addr, len).all(|p| !(self.unmapped.contains(&p) || (write && self.read_only.contains(&p))))
    }
    fn check(&self, addr: u64, len: usize, write: bool) -> Result<(), MemoryFault> {
        if self.allows(addr, len, write) { Ok(()) } else { Err(MemoryFault { addr, len }) }
    }
}

impl Memory for Paged {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.check(addr, buf.len(), false)?;
        self.mem.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        self.check(addr, data.len(), true)?;
        self.mem.write(addr, data)
    }
    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault> {
        self.check(addr, 8, true)?;
        self.mem.compare_swap(addr, compare, swap)
    }
    fn fetch_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault> {
        self.check(addr, 8, true)?;
        self.mem.fetch_add(addr, add)
    }
    fn atomic_write(&mut self, addr: u64, value: [u8; 8]) -> Result<(), MemoryFault> {
        self.check(addr, 8, true)?;
        self.mem.atomic_write(addr, value)
    }
}

type EngineNode = SimNode<Paged>;

/// One operation on the region, by its offset in it.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write { at: u64, len: u32 },
    Read { at: u64, len: u32 },
    FetchAdd { at: u64, add: u64 },
    CompareSwap { at: u64, swap: u64 },
    AtomicWrite { at: u64, value: u64 },
}

impl Op {
    /// The bytes of the region it touches, and whether it writes them.
    fn span(self) -> (u64, usize, bool) {
        match self {
            Op::Write { at, len } => (at, len as usize, true),
            Op::Read { at, len } => (at, len as usize, false),
            Op::FetchAdd { at, .. } | Op::CompareSwap { at, .. } | Op::AtomicWrite { at, .. } => (at, 8, true),
        }
    }
}

fn node(ip: [u8; 4], seed: u64) -> (EngineNode, PdId, CqId) {
    let ip = IpAddr::from(ip);
    let mut engine = Engine::new(DeviceConfig { addresses: vec![ip], seed, ..DeviceConfig::default() });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(1024).unwrap();
    let mem = Paged { mem: VecMemory::new(BASE, MEM), unmapped: BTreeSet::new(), read_only: BTreeSet::new() };
    (EngineNode { engine, mem, ip }, pd, cq)
}

fn run(seed: u64) -> Result<(), String> {
    let mut rng = SimRng::with_stream(seed, 11);
    let mut sim = Fabric::new(seed);
    let faults = FaultConfig::random(&mut SimRng::with_stream(seed, 1));
    let fault_rules = sim.add_faults(&faults);
    let (mut a, a_pd, a_cq) = node([10, 0, 0, 1], rng.next_u64());
    let (mut b, b_pd, b_cq) = node([10, 0, 0, 2], rng.next_u64());
    let a_keys = a.engine.reg_mr(a_pd, BASE, MEM as u64, Access::ALL).unwrap();
    let region = BASE + REGION;
    let b_keys = b.engine.reg_mr(b_pd, region, PAGES * PAGE, Access::ALL | Access::ON_DEMAND).unwrap();
    // Pages of the region that do not allow an access: about one in eight unmapped, one in
    // eight read-only; in a quarter of the seeds, none.
    if rng.next_u64() % 4 != 0 {
        for p in 0..PAGES {
            match rng.next_u64() % 8 {
                0 => b.mem.unmapped.insert(region / PAGE + p),
                1 => b.mem.read_only.insert(region / PAGE + p),
                _ => false,
            };
        }
    }
    let cap = QpCap { max_send_wr: 64, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init =
        |pd, cq| QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type: QpType::Rc, cap, sq_sig_all: false };
    let a_qp = a.engine.create_qp(&init(a_pd, a_cq)).unwrap();
    let b_qp = b.engine.create_qp(&init(b_pd, b_cq)).unwrap();
    // timeout 8: a 1 ms local ACK timeout, as the swarm's.
    let timeout = |rts: &mut QpAttr| rts.timeout = 8;
    connect_qp(&mut a.engine, a_qp, b_qp, b.ip, QpType::Rc, Mtu::Mtu1024, &timeout);
    connect_qp(&mut b.engine, b_qp, a_qp, a.ip, QpType::Rc, Mtu::Mtu1024, &timeout);

    // The workload: each op at a random place of the region; a's buffer per op.
    let n = 8 + (rng.next_u64() % 24) as usize;
    // READs from the region's first half, everything that writes to its second: a later
    // unfenced WRITE may change what an earlier READ returns (IBV_SEND_FENCE exists for
    // that), which is no fault of the region's.
    const HALF: u64 = PAGES * PAGE / 2;
    let ops: Vec<Op> = (0..n)
        .map(|i| {
            let word = HALF + (rng.next_u64() % (HALF / 8)) * 8;
            let len = 1 + (rng.next_u64() % 6000) as u32;
            let at = rng.next_u64() % (HALF - u64::from(len));
            match rng.next_u64() % 5 {
                0 => Op::Write { at: HALF + at, len },
                1 => Op::Read { at, len },
                2 => Op::FetchAdd { at: word, add: 1 + rng.next_u64() % 100 },
                3 => Op::CompareSwap { at: word, swap: 0xc0de_0000 + i as u64 },
                _ => Op::AtomicWrite { at: word, value: 0xa7a7_0000 + i as u64 },
            }
        })
        .collect();
    for (i, b_byte) in b.mem.mem.slice_mut(region, (PAGES * PAGE) as usize).iter_mut().enumerate() {
        *b_byte = (i as u8).wrapping_mul(7) ^ 0x3c;
    }
    let a_slot = |i: usize| BASE + A_BUF + (i as u64) * 8192;
    for (i, op) in ops.iter().enumerate() {
        let data: Vec<u8> = (0..8192u32).map(|k| (k as u8) ^ (i as u8).wrapping_mul(13)).collect();
        a.mem.mem.slice_mut(a_slot(i), 8192).copy_from_slice(&data);
        let rkey = b_keys.rkey;
        let at = |o: u64| region + o;
        let (sop, len) = match *op {
            Op::Write { at: o, len } => (SendOp::RdmaWrite { remote_addr: at(o), rkey }, len),
            Op::Read { at: o, len } => (SendOp::RdmaRead { remote_addr: at(o), rkey }, len),
            Op::FetchAdd { at: o, add } => (SendOp::FetchAdd { remote_addr: at(o), rkey, add }, 8),
            Op::CompareSwap { at: o, swap } => {
                // Compare with what the model will hold there: known only at run time, so
                // compare with 0 (fails unless zero) and check the returned value instead.
                (SendOp::CompareSwap { remote_addr: at(o), rkey, compare: 0, swap }, 8)
            }
            Op::AtomicWrite { at: o, value } => {
                (SendOp::AtomicWrite { remote_addr: at(o), rkey, value: value.to_ne_bytes() }, 0)
            }
        };
        let sge = [Sge { addr: a_slot(i), length: len, lkey: a_keys.lkey }];
        let sg: &[Sge] = if len == 0 { &[] } else { &sge };
        let wr = SendWr { wr_id: i as u64, op: sop, sg_list: sg, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        a.engine.post_send(a_qp, &[wr], &a.mem).map_err(|e| format!("post_send: {e}"))?;
    }

    let a_before = a.mem.clone();
    let b_before = b.mem.clone();
    let na: NodeId = sim.add_node(a);
    let nb: NodeId = sim.add_node(b);
    sim.run_for(Duration::from_millis(20)).map_err(|e| e.to_string())?;
    for rule in fault_rules {
        sim.remove_rule(rule);
    }
    sim.run_until_idle(Duration::from_secs(60)).map_err(|e| format!("no convergence after the heal: {e}"))?;
    let mut wcs = Vec::new();
    {
        let a = sim.node_mut::<EngineNode>(na);
        while let Some(wc) = a.engine.poll_cq(a_cq) {
            wcs.push(wc);
        }
    }
    let a_mem = sim.node::<EngineNode>(na).mem.clone();
    let b_mem = sim.node::<EngineNode>(nb).mem.clone();
    let ctx = |msg: String| format!("{msg}\n  ops: {ops:?}\n  faults: {faults:?}\n  statuses: {wcs:?}");

    // Exactly once, in order; successes, at most one error, flushes.
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    if ids != (0..n as u64).collect::<Vec<_>>() {
        return Err(ctx(format!("completions {ids:?}: not each WR once, in order")));
    }
    let first_fault = ops.iter().position(|op| {
        let (at, len, write) = op.span();
        !b_before.allows(region + at, len, write)
    });
    let error = wcs.iter().position(|w| w.status != WcStatus::Success);
    match (error, first_fault) {
        (None, None) => {}
        (Some(e), _) => {
            let s = wcs[e].status;
            let ok = match first_fault {
                Some(f) if e == f => s == WcStatus::RemAccessErr || s == WcStatus::RetryExcErr,
                Some(f) if e < f => s == WcStatus::RetryExcErr,
                None => s == WcStatus::RetryExcErr,
                Some(_) => false,
            };
            if !ok {
                return Err(ctx(format!("WR {e} failed with {s:?}; the first WR a page refuses is {first_fault:?}")));
            }
            if let Some(w) = wcs[e + 1..].iter().find(|w| w.status != WcStatus::WrFlushErr) {
                return Err(ctx(format!("WR {} completed {:?} after the error", w.wr_id, w.status)));
            }
        }
        (None, Some(f)) => return Err(ctx(format!("WR {f} touches a page that refuses it and succeeded"))),
    }
    let done = error.unwrap_or(n);
    match error {
        Some(e) if wcs[e].status == WcStatus::RemAccessErr => FAULTED.fetch_add(1, Ordering::Relaxed),
        None => CLEAN.fetch_add(1, Ordering::Relaxed),
        Some(_) => 0,
    };

    // The model of the region after the WRs that succeeded; what each returned.
    let mut model = b_before.mem.slice(region, (PAGES * PAGE) as usize).to_vec();
    let word = |m: &[u8], at: u64| u64::from_ne_bytes(m[at as usize..at as usize + 8].try_into().unwrap());
    let mut touched = vec![false; model.len()];
    for (i, op) in ops.iter().enumerate() {
        let (at, len, _) = op.span();
        if i >= done {
            // A failed or flushed WR may have touched its span (a WRITE cut off by a page
            // fault), never more; a page that refuses it stays as it was (checked below).
            touched[at as usize..at as usize + len].fill(true);
            continue;
        }
        let src = a_before.mem.slice(a_slot(i), 8192);
        let got = a_mem.mem.slice(a_slot(i), 8192);
        match *op {
            Op::Write { at, len } => model[at as usize..][..len as usize].copy_from_slice(&src[..len as usize]),
            Op::Read { at, len } => {
                if got[..len as usize] != model[at as usize..][..len as usize] {
                    return Err(ctx(format!("READ {i} returned other bytes than the region held")));
                }
            }
            Op::FetchAdd { at, add } => {
                let old = word(&model, at);
                if got[..8] != old.to_ne_bytes() {
                    return Err(ctx(format!("FETCH_ADD {i} returned {:?}, the region held {old:#x}", &got[..8])));
                }
                model[at as usize..][..8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
            }
            Op::CompareSwap { at, swap } => {
                let old = word(&model, at);
                if got[..8] != old.to_ne_bytes() {
                    return Err(ctx(format!("CMP_SWAP {i} returned {:?}, the region held {old:#x}", &got[..8])));
                }
                if old == 0 {
                    model[at as usize..][..8].copy_from_slice(&swap.to_ne_bytes());
                }
            }
            Op::AtomicWrite { at, value } => model[at as usize..][..8].copy_from_slice(&value.to_ne_bytes()),
        }
    }
    let now = b_mem.mem.slice(region, model.len());
    for (off, (&got, &want)) in now.iter().zip(&model).enumerate() {
        let page = (region + off as u64) / PAGE;
        let refuses_writes = b_before.unmapped.contains(&page) || b_before.read_only.contains(&page);
        if refuses_writes && got != b_before.mem.slice(region, model.len())[off] {
            return Err(ctx(format!("region offset {off:#x}: a page that refuses writes was written")));
        }
        if got != want && !touched[off] {
            return Err(ctx(format!("region offset {off:#x} holds {got:#x}, the model {want:#x}")));
        }
    }
    // Nothing outside the region changed at B.
    let outside = b_mem.mem.bytes().iter().zip(b_before.mem.bytes()).enumerate();
    for (off, (&x, &y)) in outside {
        let in_region = (REGION..REGION + PAGES * PAGE).contains(&(off as u64));
        if x != y && !in_region {
            return Err(ctx(format!("stray write at B offset {off:#x}")));
        }
    }
    Ok(())
}

#[test]
fn swarm_of_seeds_on_regions_on_demand_keeps_every_invariant() {
    let ran = swarm(300, run);
    assert!(ran >= 1);
    let (faulted, clean) = (FAULTED.load(Ordering::Relaxed) as u64, CLEAN.load(Ordering::Relaxed) as u64);
    println!("{ran} runs: {faulted} failed at a page that refused them, {clean} without an error");
    if ran >= 100 {
        assert!(faulted >= ran / 10 && clean >= ran / 10, "{faulted} faulted, {clean} clean of {ran}");
    }
}
