//! `softrdma loopback`: a real RoCEv2 run over the kernel's UDP loopback.
//!
//! Two softrdma devices in one process, one on 127.0.0.1 and one on 127.0.0.2, each with a
//! UDP socket on port 4791, connect an RC QP pair and move data with RDMA WRITE, READ or
//! SEND. Every packet is real RoCEv2 (BTH, RETH, AETH, ICRC) through the kernel; the ICRC
//! of every one is checked on receipt. Until the runtime and `softrdma perf` exist (issues 5
//! and 6) this is the end-to-end run: one thread polls both devices (busy polling).

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use softrdma_engine::{
    Access, AddressVector, AttrMask, CqId, DeviceConfig, Engine, Instant, IpInfo, MrKeys, Mtu, QpAttr, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, VecMemory, WcStatus,
};
use softrdma_pcap::CaptureWriter;
use softrdma_udp::{RecvBatch, RoceSocket};
use softrdma_wire::{Gid, Qpn};

/// What to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    /// RDMA WRITE from 127.0.0.1 into 127.0.0.2's memory.
    Write,
    /// RDMA READ by 127.0.0.1 from 127.0.0.2's memory.
    Read,
    /// SEND from 127.0.0.1 into receives posted at 127.0.0.2.
    Send,
}

/// Options of `softrdma loopback`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct Args {
    /// The operation.
    #[arg(long, value_enum, default_value_t = Op::Write)]
    op: Op,
    /// Bytes per message.
    #[arg(short, long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=1 << 24))]
    size: u32,
    /// Messages to move.
    #[arg(short = 'n', long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Messages in flight at once (1 measures latency).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    depth: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Also write every packet sent to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What a run measured.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    op: Op,
    bytes: u32,
    iterations: u32,
    depth: u32,
    mtu: u32,
    seconds: f64,
    gbit_per_sec: f64,
    messages_per_sec: f64,
    latency_us: Latency,
    packets_sent: u64,
    retransmitted: u64,
    icrc_errors: u64,
    verified: bool,
}

/// Completion latency of each message, from posting to its completion.
#[derive(Debug, Serialize)]
pub(crate) struct Latency {
    min: f64,
    median: f64,
    p99: f64,
    max: f64,
}

/// Why the run could not be made.
#[derive(Debug)]
pub(crate) struct LoopbackError(pub(crate) String);

impl std::fmt::Display for LoopbackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const PORT: u16 = 4791;

struct Dev {
    engine: Engine,
    mem: VecMemory,
    sock: RoceSocket,
    rx: RecvBatch,
    cq: CqId,
    keys: MrKeys,
    qp: Qpn,
    ip: IpAddr,
}

/// Source (or READ destination) at offset 0, target area after it, per message slot.
const BASE: u64 = 0x1000_0000;

fn device(ip: [u8; 4], seed: u64, len: usize) -> Result<Dev, LoopbackError> {
    let ip = IpAddr::from(ip);
    // Room for the RC window (128 packets of up to 4 KiB) in both directions.
    let config = softrdma_udp::Config {
        port: PORT,
        recv_buffer_size: Some(8 << 20),
        send_buffer_size: Some(8 << 20),
        ..softrdma_udp::Config::default()
    };
    let sock = RoceSocket::bind_with(ip, &config).map_err(|e| {
        LoopbackError(format!(
            "cannot bind {ip}:{PORT}: {e} (is another RoCE stack, such as kernel rxe, using the port?)"
        ))
    })?;
    // One socket per device: every packet leaves from port 4791, and the ICRC must say so.
    let config = DeviceConfig { addresses: vec![ip], seed, udp_source_port: Some(PORT), ..DeviceConfig::default() };
    let mut engine = Engine::new(config);
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(4096).map_err(|e| LoopbackError(e.to_string()))?;
    let keys = engine.reg_mr(pd, BASE, len as u64, Access::ALL).map_err(|e| LoopbackError(e.to_string()))?;
    let cap = QpCap { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type: QpType::Rc, cap, sq_sig_all: true };
    let qp = engine.create_qp(&init).map_err(|e| LoopbackError(e.to_string()))?;
    Ok(Dev { engine, mem: VecMemory::new(BASE, len), sock, rx: RecvBatch::new(64, 4200), cq, keys, qp, ip })
}

fn connect(d: &mut Dev, peer_qp: Qpn, peer_ip: IpAddr, mtu: Mtu) -> Result<(), LoopbackError> {
    let e = &mut d.engine;
    let err = |e: softrdma_engine::VerbsError| LoopbackError(e.to_string());
    let init = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, ..QpAttr::default() };
    e.modify_qp(d.qp, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS)
        .map_err(err)?;
    let av =
        AddressVector { dgid: Gid::from_ip(peer_ip), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: mtu,
        dest_qp_num: peer_qp.value(),
        rq_psn: 0,
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
    e.modify_qp(d.qp, &rtr, mask).map_err(err)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
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
    e.modify_qp(d.qp, &rts, mask).map_err(err)
}

/// One pass over a device: send what it has, receive what arrived, fire due timers.
fn poll(
    d: &mut Dev,
    now: Instant,
    buf: &mut [u8],
    pcap: &mut Option<CaptureWriter<io::BufWriter<std::fs::File>>>,
    since: Duration,
) -> io::Result<()> {
    while let Some(t) = d.engine.poll_transmit(now, &mut d.mem, buf) {
        if let Some(w) = pcap {
            w.write_roce(since + Duration::from_nanos(now.as_nanos()), &t.envelope, &buf[..t.len])
                .map_err(io::Error::other)?;
        }
        match d.sock.send(&t.envelope, &buf[..t.len]) {
            Ok(()) => {}
            // A full socket buffer loses the packet, as a congested link would: RC resends.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    match d.sock.recv(&mut d.rx) {
        Ok(_) => {
            for r in d.rx.iter() {
                let ip = r.ip();
                let info =
                    IpInfo { hop_limit: ip.hop_limit, traffic_class: ip.traffic_class, flow_label: ip.flow_label };
                d.engine.handle_datagram_with(now, &r.envelope(), info, r.payload, &mut d.mem);
            }
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    if d.engine.poll_timeout().is_some_and(|t| t <= now) {
        d.engine.handle_timeout(now);
    }
    Ok(())
}

/// Runs the loopback benchmark.
pub(crate) fn run(args: &Args) -> Result<Report, LoopbackError> {
    let mtu = match args.mtu {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        other => return Err(LoopbackError(format!("--mtu {other}: use 256, 512, 1024, 2048 or 4096"))),
    };
    let slots = args.depth as usize;
    let len = 2 * slots * args.size as usize;
    let mut a = device([127, 0, 0, 1], 1, len)?;
    let mut b = device([127, 0, 0, 2], 2, len)?;
    let (aq, bq, aip, bip) = (a.qp, b.qp, a.ip, b.ip);
    connect(&mut a, bq, bip, mtu)?;
    connect(&mut b, aq, aip, mtu)?;
    let mut pcap = match &args.pcap {
        Some(p) => Some(CaptureWriter::create(p).map_err(|e| LoopbackError(e.to_string()))?),
        None => None,
    };

    // The data: a pattern in every source slot (b's memory for a READ, a's otherwise).
    let pattern: Vec<u8> = (0..args.size).map(|i| (i as u8).wrapping_mul(97).wrapping_add(13)).collect();
    for slot in 0..slots {
        let at = BASE + (slot as u64) * u64::from(args.size);
        let dev = if args.op == Op::Read { &mut b } else { &mut a };
        dev.mem.slice_mut(at, args.size as usize).copy_from_slice(&pattern);
    }
    let dst_off = |slot: usize| (slots as u64 + slot as u64) * u64::from(args.size);

    let clock = std::time::Instant::now();
    let now = || Instant::from_nanos(clock.elapsed().as_nanos() as u64);
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut buf = vec![0u8; 4200];
    let mut posted = 0u32;
    let mut done = 0u32;
    let mut started_at = vec![Instant::ZERO; slots];
    let mut latencies = Vec::with_capacity(args.iters as usize);
    let deadline = std::time::Duration::from_secs(60);
    let io_err = |e: io::Error| LoopbackError(format!("socket error: {e}"));

    let post = |a: &mut Dev, b: &mut Dev, slot: usize| -> Result<(), LoopbackError> {
        let local = Sge { addr: BASE + slot as u64 * u64::from(args.size), length: args.size, lkey: a.keys.lkey };
        let op = match args.op {
            Op::Write => SendOp::RdmaWrite { remote_addr: BASE + dst_off(slot), rkey: b.keys.rkey },
            Op::Read => SendOp::RdmaRead { remote_addr: BASE + slot as u64 * u64::from(args.size), rkey: b.keys.rkey },
            Op::Send => {
                let r = Sge { addr: BASE + dst_off(slot), length: args.size, lkey: b.keys.lkey };
                b.engine
                    .post_recv(b.qp, &[RecvWr { wr_id: slot as u64, sg_list: &[r] }])
                    .map_err(|e| LoopbackError(e.to_string()))?;
                SendOp::Send
            }
        };
        let local = if args.op == Op::Read { Sge { addr: BASE + dst_off(slot), ..local } } else { local };
        let wr = SendWr { wr_id: slot as u64, op, sg_list: &[local], flags: SendFlags::SIGNALED, ud: None };
        a.engine.post_send(a.qp, &[wr], &a.mem).map_err(|e| LoopbackError(e.to_string()))
    };

    for (slot, started) in started_at.iter_mut().enumerate().take(args.iters as usize) {
        *started = now();
        post(&mut a, &mut b, slot)?;
        posted += 1;
    }
    while done < args.iters {
        if clock.elapsed() > deadline {
            return Err(LoopbackError(format!("no progress: {done} of {} messages completed in 60 s", args.iters)));
        }
        let t = now();
        poll(&mut a, t, &mut buf, &mut pcap, since).map_err(io_err)?;
        poll(&mut b, t, &mut buf, &mut pcap, since).map_err(io_err)?;
        while b.engine.poll_cq(b.cq).is_some() {}
        while let Some(wc) = a.engine.poll_cq(a.cq) {
            if wc.status != WcStatus::Success {
                return Err(LoopbackError(format!("message {} failed: {:?}", done, wc.status)));
            }
            let slot = wc.wr_id as usize;
            latencies.push(now().saturating_duration_since(started_at[slot]).as_secs_f64() * 1e6);
            done += 1;
            if posted < args.iters {
                started_at[slot] = now();
                post(&mut a, &mut b, slot)?;
                posted += 1;
            }
        }
    }
    let seconds = clock.elapsed().as_secs_f64();
    if let Some(w) = pcap {
        drop(w.into_inner());
    }

    // The data arrived intact in every slot used.
    let verified = (0..slots.min(args.iters as usize)).all(|slot| {
        let got = match args.op {
            Op::Read => a.mem.slice(BASE + dst_off(slot), args.size as usize),
            _ => b.mem.slice(BASE + dst_off(slot), args.size as usize),
        };
        got == &pattern[..]
    });
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    let (ca, cb) = (a.engine.counters(), b.engine.counters());
    let bytes = f64::from(args.iters) * f64::from(args.size);
    Ok(Report {
        op: args.op,
        bytes: args.size,
        iterations: args.iters,
        depth: args.depth,
        mtu: args.mtu,
        seconds,
        gbit_per_sec: bytes * 8.0 / seconds / 1e9,
        messages_per_sec: f64::from(args.iters) / seconds,
        latency_us: Latency { min: pick(0.0), median: pick(0.5), p99: pick(0.99), max: pick(1.0) },
        packets_sent: ca.sent_packets + cb.sent_packets,
        retransmitted: ca.retransmitted_packets + cb.retransmitted_packets,
        icrc_errors: ca.rcvd_icrc_errors + cb.rcvd_icrc_errors,
        verified,
    })
}

/// The report as perftest-style text.
pub(crate) fn text(r: &Report) -> String {
    let op = match r.op {
        Op::Write => "RDMA WRITE",
        Op::Read => "RDMA READ",
        Op::Send => "SEND",
    };
    format!(
        "softrdma loopback: RC {op}, 127.0.0.1 <-> 127.0.0.2, RoCEv2 over the kernel's UDP loopback, MTU {}, {} in flight\n\
         {:>10} {:>12} {:>16} {:>16}\n\
         {:>10} {:>12} {:>16.2} {:>16.0}\n\
         latency (post to completion, us): min {:.1}  median {:.1}  p99 {:.1}  max {:.1}\n\
         packets sent {}, retransmitted {}, ICRC errors {}, data verified: {}\n",
        r.mtu,
        r.depth,
        "#bytes",
        "#iterations",
        "BW avg [Gb/s]",
        "msg rate [/s]",
        r.bytes,
        r.iterations,
        r.gbit_per_sec,
        r.messages_per_sec,
        r.latency_us.min,
        r.latency_us.median,
        r.latency_us.p99,
        r.latency_us.max,
        r.packets_sent,
        r.retransmitted,
        r.icrc_errors,
        if r.verified { "yes" } else { "NO" },
    )
}
