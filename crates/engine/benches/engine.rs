//! The engine alone, two devices back to back with no network: what one message and one
//! packet cost in engine work (building, ICRC, parsing, checks, memory copies, ACKs and
//! completions on both sides).
//!
//! `cargo bench -p softrdma-engine`; throughput is reported per message, and a 4 KiB
//! WRITE at path MTU 4096 is exactly one request packet (plus its share of ACKs).
//!
//! On a machine whose timings swing (a shared VM), count instructions instead: with
//! `SOFTRDMA_ENGINE_BATCHES=send:400` (or `write:400`) the bench moves that many batches
//! of 256 messages of the "engine pair" group and exits, for
//! `valgrind --tool=callgrind target/release/deps/engine-*` (instructions per message =
//! the total over 102 400).

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{Criterion, Throughput, criterion_group};
use softrdma_engine::*;
use softrdma_wire::{Gid, QKey, Qpn};

const BASE: u64 = 0x1000_0000;
const LEN: usize = 1 << 20;

struct Side {
    engine: Engine,
    mem: VecMemory,
    cq: CqId,
    keys: MrKeys,
    qp: Qpn,
    ip: IpAddr,
}

/// The engine as the runtime configures it between processes of one host: a window per
/// peer (the runtime's 512 packets), congestion control, and no ICRC (the same-host path
/// needs none).
fn runtime_config() -> DeviceConfig {
    DeviceConfig {
        congestion: Some(congestion::DcqcnConfig::default()),
        peer_window: Some(512),
        defer_icrc: true,
        ..DeviceConfig::default()
    }
}

fn side(ip: [u8; 4], cap: QpCap, config: &DeviceConfig) -> Side {
    let ip = IpAddr::from(ip);
    let mut engine = Engine::new(DeviceConfig { addresses: vec![ip], ..config.clone() });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(1 << 16).unwrap();
    let keys = engine.reg_mr(pd, BASE, LEN as u64, Access::ALL).unwrap();
    let qp = engine
        .create_qp(&QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type: QpType::Rc, cap, sq_sig_all: false })
        .unwrap();
    Side { engine, mem: VecMemory::new(BASE, LEN), cq, keys, qp, ip }
}

fn connect(s: &mut Side, peer_qp: Qpn, peer_ip: IpAddr) {
    let init = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, qkey: QKey(0), ..QpAttr::default() };
    s.engine
        .modify_qp(s.qp, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS)
        .unwrap();
    let av =
        AddressVector { dgid: Gid::from_ip(peer_ip), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: peer_qp.value(),
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    s.engine.modify_qp(s.qp, &rtr, mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    s.engine.modify_qp(s.qp, &rts, mask).unwrap();
}

fn pair(config: &DeviceConfig) -> (Side, Side) {
    let cap = QpCap { max_send_wr: 512, max_recv_wr: 512, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    let mut a = side([10, 0, 0, 1], cap, config);
    let mut b = side([10, 0, 0, 2], cap, config);
    let (aq, bq, aip, bip) = (a.qp, b.qp, a.ip, b.ip);
    connect(&mut a, bq, bip);
    connect(&mut b, aq, aip);
    (a, b)
}

/// Moves every packet both ways until both are quiet, the clock moving 2 µs a round (the
/// congestion pacer and the timers see time pass). Returns packets moved.
fn pump(a: &mut Side, b: &mut Side, buf: &mut [u8], clock: &mut u64) -> usize {
    let mut moved = 0;
    let mut quiet = 0;
    while quiet < 50 {
        *clock += 2_000;
        let now = Instant::from_nanos(*clock);
        a.engine.handle_timeout(now);
        b.engine.handle_timeout(now);
        let mut any = false;
        while let Some(t) = a.engine.poll_transmit(now, &mut a.mem, buf) {
            b.engine.handle_checked_datagram(now, &t.envelope, IpInfo::default(), &buf[..t.len], &mut b.mem);
            moved += 1;
            any = true;
        }
        while let Some(t) = b.engine.poll_transmit(now, &mut b.mem, buf) {
            a.engine.handle_checked_datagram(now, &t.envelope, IpInfo::default(), &buf[..t.len], &mut a.mem);
            moved += 1;
            any = true;
        }
        quiet = if any { 0 } else { quiet + 1 };
    }
    moved
}

/// Posts `batch` WRs of `op` on `a` (and receives on `b` for SENDs), pumps, and drains CQs.
fn run_batch(a: &mut Side, b: &mut Side, buf: &mut [u8], clock: &mut u64, batch: usize, len: u32, send: bool) {
    let sge = Sge { addr: BASE, length: len, lkey: a.keys.lkey };
    let op = if send { SendOp::Send } else { SendOp::RdmaWrite { remote_addr: BASE + 0x8_0000, rkey: b.keys.rkey } };
    if send {
        let rsge = Sge { addr: BASE + 0x4_0000, length: len, lkey: b.keys.lkey };
        let rwrs: Vec<RecvWr<'_>> =
            (0..batch).map(|i| RecvWr { wr_id: i as u64, sg_list: std::slice::from_ref(&rsge) }).collect();
        b.engine.post_recv(b.qp, &rwrs).unwrap();
    }
    let wrs: Vec<SendWr<'_>> = (0..batch)
        .map(|i| SendWr {
            wr_id: i as u64,
            op,
            sg_list: std::slice::from_ref(&sge),
            flags: if i + 1 == batch { SendFlags::SIGNALED } else { SendFlags(0) },
            ud: None,
            xrc_srqn: None,
        })
        .collect();
    a.engine.post_send(a.qp, &wrs, &a.mem).unwrap();
    black_box(pump(a, b, buf, clock));
    while a.engine.poll_cq(a.cq).is_some() {}
    while b.engine.poll_cq(b.cq).is_some() {}
}

const BATCH: usize = 256;

fn bench(c: &mut Criterion) {
    let mut buf = vec![0u8; 4200];
    // As between two processes of one host.
    let mut g = c.benchmark_group("engine pair");
    for (name, len, send) in [("SEND 64 B", 64u32, true), ("WRITE 4 KiB", 4096, false)] {
        let (mut a, mut b) = pair(&runtime_config());
        let mut clock = 0;
        g.throughput(Throughput::Elements(BATCH as u64));
        g.bench_function(name, |bench| {
            bench.iter(|| run_batch(&mut a, &mut b, &mut buf, &mut clock, BATCH, len, send))
        });
    }
    g.finish();

    // Engine work per packet: one side's transmit of a 4 KiB WRITE packet plus the other
    // side's receive of it (ICRC both ways, checks, one memory copy each side).
    let (mut a, mut b) = pair(&DeviceConfig::default());
    let sge = Sge { addr: BASE, length: 4096, lkey: a.keys.lkey };
    let mut g = c.benchmark_group("per packet");
    g.throughput(Throughput::Elements(1));
    g.bench_function("4 KiB WRITE: requester emit + responder receive", |bench| {
        bench.iter(|| {
            let w = SendWr {
                wr_id: 0,
                op: SendOp::RdmaWrite { remote_addr: BASE + 0x8_0000, rkey: b.keys.rkey },
                sg_list: std::slice::from_ref(&sge),
                flags: SendFlags(0),
                ud: None,
                xrc_srqn: None,
            };
            a.engine.post_send(a.qp, &[w], &a.mem).unwrap();
            let t = a.engine.poll_transmit(Instant::ZERO, &mut a.mem, &mut buf).unwrap();
            b.engine.handle_datagram(Instant::ZERO, &t.envelope, &buf[..t.len], &mut b.mem);
            // Deliver b's ACK so the window never fills.
            while let Some(t) = b.engine.poll_transmit(Instant::ZERO, &mut b.mem, &mut buf) {
                a.engine.handle_datagram(Instant::ZERO, &t.envelope, &buf[..t.len], &mut a.mem);
            }
        })
    });
    g.finish();

    // The receive-side ICRC of a 4 KiB packet: with the identification the receiver
    // guesses (exact, as from softrdma), and with kernel rxe's changing ones (predicted:
    // one more multiplication in GF(2)[x] after the CRC).
    let mut g = c.benchmark_group("ICRC check, 4 KiB packet");
    g.throughput(Throughput::Elements(1));
    let guess = softrdma_wire::Envelope::rocev2([198, 18, 0, 2].into(), 0xc0de, [198, 18, 0, 3].into()).unwrap();
    let softrdma_wire::Envelope::V4(v4) = guess else { unreachable!() };
    let packets: Vec<Vec<u8>> = (0..64u16)
        .map(|k| {
            let mut p = vec![0u8; 12 + 16 + 4096 + 4];
            p[..12].copy_from_slice(&[0x0a, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, 1]);
            let id = softrdma_wire::Envelope::V4(softrdma_wire::icrc::Ipv4Envelope { identification: k, ..v4 });
            softrdma_wire::RocePacket::new_unchecked(&mut p[..]).fill_icrc(&id);
            p
        })
        .collect();
    let mut rx = Engine::new(DeviceConfig { addresses: vec![[198, 18, 0, 3].into()], ..DeviceConfig::default() });
    g.bench_function("exact (identification 0)", |bench| {
        bench.iter(|| black_box(rx.check_icrc(Instant::ZERO, &guess, &packets[0])))
    });
    let mut k = 0;
    g.bench_function("predicted (identification recovered)", |bench| {
        bench.iter(|| {
            k = (k + 1) % packets.len();
            black_box(rx.check_icrc(Instant::ZERO, &guess, &packets[k.max(1)]))
        })
    });
    g.finish();
}

/// `SOFTRDMA_ENGINE_BATCHES=send:N` or `write:N`: N batches of the "engine pair" group,
/// for an instruction count.
fn fixed(spec: &str) {
    let (op, n) = spec.split_once(':').expect("SOFTRDMA_ENGINE_BATCHES=send:N or write:N");
    let n: usize = n.parse().expect("a number of batches");
    let (len, send) = match op {
        "send" => (64, true),
        "write" => (4096, false),
        _ => panic!("SOFTRDMA_ENGINE_BATCHES: {op:?} is neither send nor write"),
    };
    let (mut a, mut b) = pair(&runtime_config());
    let (mut buf, mut clock) = (vec![0u8; 4200], 0);
    for _ in 0..n {
        run_batch(&mut a, &mut b, &mut buf, &mut clock, BATCH, len, send);
    }
}

criterion_group!(benches, bench);

fn main() {
    match std::env::var("SOFTRDMA_ENGINE_BATCHES") {
        Ok(spec) => fixed(&spec),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
