//! Shared set-up for the runtime tests: devices on loopback addresses of their own and a
//! port of their own, so tests running in parallel (and other softrdma users on the host)
//! never meet.

#![allow(dead_code, unreachable_pub, clippy::print_stdout)]

pub mod child;

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
    let port = test_port();
    let mk = |ip: [u8; 4]| {
        let ctx = open(ip, port);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let mut init = QpInit::new(qp_type, &cq);
        init.cap.max_send_wr = 128;
        init.cap.max_recv_wr = 128;
        let qp = pd.create_qp(&init).unwrap();
        let mr = pd.reg_mr(len, Access::ALL).unwrap();
        Side { ctx, pd, cq, qp, mr }
    };
    let a = mk([127, 0, 0, 1]);
    let b = mk([127, 0, 0, 1]);
    let (ea, eb) = (a.qp.endpoint(0, 100).unwrap(), b.qp.endpoint(0, 200).unwrap());
    let opts = ConnectOptions { timeout: 10, ..ConnectOptions::default() };
    a.qp.connect(100, &eb, &opts).unwrap();
    b.qp.connect(200, &ea, &opts).unwrap();
    (a, b)
}

pub const WAIT: Duration = Duration::from_secs(10);

pub fn wr<'a>(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
    SendWr { wr_id, op, sg_list, flags: SendFlags::SIGNALED, ud: None }
}
