//! Shared set-up for the runtime tests: devices on loopback addresses of their own and a
//! port of their own, so tests running in parallel (and other softrdma users on the host)
//! never meet.

#![allow(dead_code, unreachable_pub, clippy::print_stdout)]

pub mod child;
pub mod netns;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use softrdma::*;

/// A port for one test: distinct per test in this binary and per test binary (pid).
pub fn test_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 2000) as u16 * 16;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 16
}

/// A device on loopback address `ip` (127.x.y.z), opened on `port`.
pub fn open(ip: [u8; 4], port: u16) -> Context {
    let device = Device::with_addresses("lo", vec![IpAddr::from(ip)]);
    let options = ContextOptions { port, ..ContextOptions::default() };
    device.open_with(&options).expect("open a loopback device")
}

/// One side of a connected RC pair: its QP, CQ and a registered buffer.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

/// Two device contexts on 127.0.0.1 (one address and port, shared through the host's
/// port-sharing group) with an RC QP each, connected.
pub fn rc_pair(len: usize) -> (Side, Side) {
    pair(QpType::Rc, len)
}

pub fn pair(qp_type: QpType, len: usize) -> (Side, Side) {
    pair_with(qp_type, len, [ContextOptions::default(), ContextOptions::default()])
}

/// [`pair`] with each side's context options (their ports replaced by one test port).
pub fn pair_with(qp_type: QpType, len: usize, options: [ContextOptions; 2]) -> (Side, Side) {
    pair_on(test_port(), qp_type, len, options)
}

/// [`pair_with`] on `port`.
pub fn pair_on(port: u16, qp_type: QpType, len: usize, options: [ContextOptions; 2]) -> (Side, Side) {
    let [a, b] = options.map(|o| {
        let device = Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
        let ctx = device.open_with(&ContextOptions { port, ..o }).expect("open a loopback device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let mut init = QpInit::new(qp_type, &cq);
        init.cap.max_send_wr = 128;
        init.cap.max_recv_wr = 128;
        let qp = pd.create_qp(&init).unwrap();
        let mr = pd.reg_mr(len, Access::ALL).unwrap();
        Side { ctx, pd, cq, qp, mr }
    });
    let (ea, eb) = (a.qp.endpoint(0, 100).unwrap(), b.qp.endpoint(0, 200).unwrap());
    let opts = ConnectOptions { timeout: 10, ..ConnectOptions::default() };
    a.qp.connect(100, &eb, &opts).unwrap();
    b.qp.connect(200, &ea, &opts).unwrap();
    (a, b)
}

/// A UD QP ready to send and receive (Q_Key 0x11112222) on a device on loopback address
/// `ip`, with an 8 KiB buffer.
pub fn ud_side(ip: [u8; 4], port: u16) -> Side {
    ud_side_with(ip, ContextOptions { port, ..ContextOptions::default() })
}

/// [`ud_side`] on a device opened with `options`.
pub fn ud_side_with(ip: [u8; 4], options: ContextOptions) -> Side {
    let device = Device::with_addresses("lo", vec![IpAddr::from(ip)]);
    let ctx = device.open_with(&options).expect("open a loopback device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq)).unwrap();
    qp.ready_ud(0x1111_2222, 0).unwrap();
    let mr = pd.reg_mr(8192, Access::LOCAL_WRITE).unwrap();
    Side { ctx, pd, cq, qp, mr }
}

pub const WAIT: Duration = Duration::from_secs(10);

/// The next completion of `s`'s CQ, busy-polled as a latency-bound program polls: the
/// application's thread takes what comes, so its answer follows at once (a waiting thread
/// lets the progress thread take the ping, which sends the ACK then).
pub fn busy_next(s: &Side) -> Wc {
    let deadline = std::time::Instant::now() + WAIT;
    let mut wc = [EMPTY_WC];
    while s.cq.poll(&mut wc) == 0 {
        assert!(std::time::Instant::now() < deadline, "no completion in {WAIT:?}");
    }
    wc[0]
}

pub fn wr<'a>(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
    SendWr { wr_id, op, sg_list, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }
}

/// Checks a capture: every frame is a RoCEv2 datagram whose ICRC verifies (softrdma's
/// codec) and, where tshark is installed, Wireshark decodes every frame as InfiniBand with
/// nothing malformed. Returns the opcodes seen.
pub fn assert_clean_capture(path: &std::path::Path) -> std::collections::BTreeSet<softrdma_wire::Opcode> {
    let mut reader = softrdma_pcap::CaptureReader::open(path).unwrap();
    let mut opcodes = std::collections::BTreeSet::new();
    let mut frames = 0;
    while let Some(frame) = reader.next_frame() {
        let frame = frame.unwrap();
        let ip = frame.ip_packet().unwrap();
        // Parses the IP, UDP and RoCE headers and checks the ICRC.
        let dgram = softrdma_wire::DatagramRepr::parse(ip).expect("a RoCEv2 datagram with a valid ICRC");
        opcodes.insert(dgram.roce.bth.opcode);
        frames += 1;
    }
    assert!(frames > 0, "{} holds no packet", path.display());
    if std::process::Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let out = std::process::Command::new("tshark")
            .arg("-r")
            .arg(path)
            .args(["-T", "fields", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), frames, "tshark sees every frame of {}", path.display());
        for line in &lines {
            let mut f = line.split('\t');
            assert!(!f.next().unwrap_or("").is_empty(), "tshark decodes every frame as InfiniBand: {line:?}");
            assert_eq!(f.next().unwrap_or(""), "", "malformed frame: {line:?}");
        }
    } else {
        println!("SKIP tshark half: tshark is not installed (apt-get install tshark; .ci/run does)");
    }
    opcodes
}
