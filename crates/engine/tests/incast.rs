//! Incast through a switch: four senders stream RDMA WRITEs into one receiver whose switch
//! port is the bottleneck, while an honest fifth host ping-pongs 8-byte READs with the same
//! receiver. Without congestion control the port's buffer overflows, go-back-N resends
//! whole windows and the ping-pong waits behind a full queue; with it (ECN marks, CNPs,
//! DCQCN pacing) the queue stays short, nothing is lost and the total stays near the port's
//! rate. The simulator's switch model (`softrdma_sim::SwitchPort`) marks and drops.
//!
//! `cargo test -p softrdma-engine --release --test incast -- --nocapture` prints the
//! figures the README quotes.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::congestion::DcqcnConfig;
use softrdma_engine::*;
use softrdma_sim::{Config, DropReason, Fabric, NodeId, Red, SwitchPort, Time};

const RATE_BPS: u64 = 10_000_000_000;
const MSG: u32 = 65536;
const WRITES_PER_SENDER: u64 = 128;
const SENDERS: usize = 4;

/// A device at `ip` whose one QP (of [`Node::qp`]) waits to be connected, congestion
/// control on (`cc`) or off.
fn device(ip: [u8; 4], cc: bool) -> Node {
    let congestion = cc.then(|| DcqcnConfig { line_rate: RATE_BPS as f64 / 8.0, ..DcqcnConfig::default() });
    let cap = QpCap { max_send_wr: 256, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    node_configured(ip, 7, QpType::Rc, cap, &|c| c.congestion = congestion)
}

/// What one run measured.
#[derive(Debug)]
struct Outcome {
    /// WRITE bytes completed over the time the last one took, bytes per second.
    goodput: f64,
    dropped: u64,
    marked: u64,
    retransmitted: u64,
    cnps: u64,
    rtts: Vec<Duration>,
    failed: usize,
}

impl Outcome {
    fn p99(&self) -> Duration {
        let mut r = self.rtts.clone();
        r.sort();
        r[(r.len() * 99 / 100).min(r.len() - 1)]
    }
}

fn run(cc: bool) -> Outcome {
    // DCQCN's paper's marking: RED from 5 KB to 200 KB, at most 1 %.
    let red = Red { min_bytes: 5_000, max_bytes: 200_000, max_probability: 0.01 };
    let port = SwitchPort { bits_per_sec: RATE_BPS, buffer_bytes: 1024 * 1024, ecn: Some(red) };
    let config = Config {
        latency: Duration::from_micros(2),
        bandwidth_bits_per_sec: Some(RATE_BPS),
        switch: Some(port),
        ..Config::default()
    };
    let mut sim = Fabric::with_config(0x1ca57, config);
    let mut receiver = device([10, 0, 0, 100], cc);
    let mut senders: Vec<Node> = (0..SENDERS).map(|i| device([10, 0, 0, 1 + i as u8], cc)).collect();
    let mut pinger = device([10, 0, 0, 50], cc);
    let mut pairs = Vec::new();
    for s in senders.iter_mut().chain(std::iter::once(&mut pinger)) {
        let init =
            QpInitAttr { cap: QpCap { max_send_wr: 256, ..QpCap::default() }, ..init_attr(&receiver, QpType::Rc) };
        let theirs = connect_another(&mut receiver, &init, (s.qp, s.addr), Mtu::Mtu4096);
        connect(s, theirs, receiver.addr, QpType::Rc, Mtu::Mtu4096, &|_| {});
        pairs.push(s.qp);
    }
    let rkey = receiver.mr.rkey;
    for (s, &q) in senders.iter_mut().zip(&pairs) {
        for i in 0..WRITES_PER_SENDER {
            let sge = Sge { addr: BASE, length: MSG, lkey: s.mr.lkey };
            let wr = SendWr {
                wr_id: i,
                op: SendOp::RdmaWrite { remote_addr: BASE, rkey },
                sg_list: &[sge],
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: None,
            };
            s.engine.post_send(q, &[wr], &s.mem).unwrap();
        }
    }
    let ping_qp = pairs[SENDERS];
    let r = sim.add_node(receiver);
    let ids: Vec<NodeId> = senders.into_iter().map(|s| sim.add_node(s)).collect();
    let p = sim.add_node(pinger);

    let post_ping = |sim: &mut Fabric| {
        let n = sim.node_mut::<Node>(p);
        let sge = Sge { addr: BASE + 0x8000, length: 8, lkey: n.mr.lkey };
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead { remote_addr: BASE, rkey },
            sg_list: &[sge],
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: None,
        };
        n.engine.post_send(ping_qp, &[wr], &n.mem).unwrap();
    };
    let (mut done, mut failed, mut last_done) = (vec![0u64; SENDERS], 0, Time::ZERO);
    let mut rtts = Vec::new();
    post_ping(&mut sim);
    let mut ping_at = sim.now();
    let deadline = Time::ZERO + Duration::from_secs(2);
    while done.iter().sum::<u64>() < (SENDERS as u64) * WRITES_PER_SENDER && sim.now() < deadline {
        if !sim.step() {
            break;
        }
        let now = sim.now();
        for (k, &id) in ids.iter().enumerate() {
            let n = sim.node_mut::<Node>(id);
            while let Some(wc) = n.engine.poll_cq(n.cq) {
                done[k] += 1;
                failed += usize::from(wc.status != WcStatus::Success);
                last_done = now;
            }
        }
        let n = sim.node_mut::<Node>(p);
        if let Some(wc) = n.engine.poll_cq(n.cq) {
            assert_eq!(wc.status, WcStatus::Success, "the honest ping-pong survives");
            rtts.push(sim.now() - ping_at);
            post_ping(&mut sim);
            ping_at = sim.now();
        }
    }
    assert_eq!(
        done.iter().sum::<u64>(),
        SENDERS as u64 * WRITES_PER_SENDER,
        "every WRITE completed by {:?}",
        sim.now()
    );
    let bytes = (SENDERS as u64 * WRITES_PER_SENDER * u64::from(MSG)) as f64;
    let counters = |id: NodeId, sim: &Fabric| sim.node::<Node>(id).engine.counters();
    let retransmitted = ids.iter().map(|&id| counters(id, &sim).retransmitted_packets).sum();
    Outcome {
        goodput: bytes / (last_done - Time::ZERO).as_secs_f64(),
        dropped: sim.counters().dropped_by(DropReason::PortFull),
        marked: sim.counters().marked,
        retransmitted,
        cnps: counters(r, &sim).cnps_sent,
        rtts,
        failed,
    }
}

#[test]
fn congestion_control_keeps_an_incast_lossless_and_an_honest_ping_pong_fast() {
    let (off, on) = (run(false), run(true));
    let line = RATE_BPS as f64 / 8.0;
    for (name, o) in [("without congestion control", &off), ("with congestion control", &on)] {
        println!(
            "{name}: goodput {:.2} GB/s ({:.0} % of the port), {} dropped at the port, {} marked, {} retransmitted, {} CNPs, {} failed; ping-pong RTT p99 {:?} over {} pings",
            o.goodput / 1e9,
            100.0 * o.goodput / line,
            o.dropped,
            o.marked,
            o.retransmitted,
            o.cnps,
            o.failed,
            o.p99(),
            o.rtts.len()
        );
    }
    assert_eq!(on.failed, 0);
    assert!(off.dropped > 0, "the incast overflows the port without congestion control");
    assert!(on.dropped * 10 <= off.dropped, "with it, a tenth of the drops at most: {} vs {}", on.dropped, off.dropped);
    assert!(on.p99() < off.p99(), "the honest ping-pong's p99: {:?} vs {:?}", on.p99(), off.p99());
    assert!(
        on.goodput >= off.goodput,
        "and it costs no goodput: {:.2} vs {:.2} GB/s",
        on.goodput / 1e9,
        off.goodput / 1e9
    );
    assert!(on.cnps > 0 && off.cnps == 0);
}
