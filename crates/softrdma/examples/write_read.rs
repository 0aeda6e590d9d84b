//! RDMA WRITE, READ and atomics over rdma_cm, as `rdma_server`/`rdma_client` would do them.
//!
//! ```sh
//! cargo run -p softrdma --example write_read                  # both sides, this process
//! cargo run -p softrdma --example write_read -- --server      # one side ...
//! cargo run -p softrdma --example write_read -- --client 127.0.0.1   # ... and the other
//! ```
//!
//! The server registers a buffer peers may WRITE and READ and an 8-byte counter, and puts
//! where they are (address, rkey) in the private data of its `accept`. The client WRITEs a
//! pattern into the buffer, READs it back into another buffer and compares, then
//! fetch-adds and compare-swaps the counter, checking every value. It prints what it
//! checked; the exit status is 0 only if everything matched.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program reports on its terminal

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use softrdma::{
    Access, CmEndpoint, ConnParam, ContextOptions, QpCap, QpType, RKey, SendFlags, SendOp, SendWr, WcStatus,
};

const SERVICE: u16 = 7174;
const LEN: usize = 64 * 1024;
const T: Duration = Duration::from_secs(10);

fn cap() -> QpCap {
    QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Where the server's memory is, in 24 bytes of private data: the buffer's address and
/// rkey, then the counter's.
fn encode(buf: u64, buf_rkey: u32, counter: u64, counter_rkey: u32) -> Vec<u8> {
    let mut v = buf.to_le_bytes().to_vec();
    v.extend_from_slice(&buf_rkey.to_le_bytes());
    v.extend_from_slice(&counter.to_le_bytes());
    v.extend_from_slice(&counter_rkey.to_le_bytes());
    v
}

fn decode(d: &[u8]) -> ((u64, RKey), (u64, RKey)) {
    let u64_at = |at: usize| u64::from_le_bytes(d[at..at + 8].try_into().expect("8 bytes"));
    let key_at = |at: usize| RKey(u32::from_le_bytes(d[at..at + 4].try_into().expect("4 bytes")));
    ((u64_at(0), key_at(8)), (u64_at(12), key_at(20)))
}

fn server(listen: CmEndpoint) -> softrdma::Result<()> {
    let (ep, _request) = listen.get_request()?;
    let pd = ep.pd().expect("get_request gives a PD");
    let buf = pd.reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let counter = pd.reg_mr(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ)?;
    counter.write(0, &100u64.to_ne_bytes())?;
    let private_data = encode(buf.addr(), buf.rkey(), counter.addr(), counter.rkey());
    ep.accept(&ConnParam { private_data, responder_resources: 4, initiator_depth: 4, ..ConnParam::default() })?;
    println!("server: accepted a connection from {:?}; waiting for the client to finish", ep.peer_addr());
    // The target only waits: the device answers WRITEs, READs and atomics by itself.
    let _ = ep.next_event()?;
    println!("server: counter is now {}", counter.read_u64(0)?);
    Ok(())
}

fn client(server: IpAddr, options: ContextOptions) -> softrdma::Result<bool> {
    let ep = CmEndpoint::connect_to(SocketAddr::new(server, SERVICE), QpType::Rc, cap(), options, T)?;
    let est = ep.connect(&ConnParam { responder_resources: 4, initiator_depth: 4, ..ConnParam::default() })?;
    let ((addr, rkey), (counter_addr, counter_rkey)) = decode(&est.private_data);
    println!("client: connected to {:?}; its buffer is at {addr:#x} (rkey {:#x})", ep.peer_addr(), rkey.0);
    let pd = ep.pd().expect("create_ep gives a PD");
    let local = pd.reg_mr(2 * LEN, Access::LOCAL_WRITE)?;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    local.write(0, &pattern)?;
    let mut ok = true;

    ep.post_write(1, &local, 0..LEN, SendFlags::SIGNALED, addr, rkey)?;
    ok &= check("RDMA WRITE of 64 KiB", ep.get_send_comp(T)?.status == WcStatus::Success);
    ep.post_read(2, &local, LEN..2 * LEN, SendFlags::SIGNALED, addr, rkey)?;
    ok &= check("RDMA READ of it back", ep.get_send_comp(T)?.status == WcStatus::Success);
    let mut back = vec![0u8; LEN];
    local.read(LEN, &mut back)?;
    ok &= check("the bytes read equal the bytes written", back == pattern);

    let qp = ep.qp().expect("create_ep gives a QP");
    let atomic = |wr_id: u64, op: SendOp| -> softrdma::Result<u64> {
        let sge = [local.sge(0..8)?];
        qp.post_send(&[SendWr { wr_id, op, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])?;
        let wc = ep.get_send_comp(T)?;
        if wc.status != WcStatus::Success {
            return Ok(u64::MAX);
        }
        local.read_u64(0)
    };
    let old = atomic(3, SendOp::FetchAdd { remote_addr: counter_addr, rkey: counter_rkey, add: 5 })?;
    ok &= check("fetch-add 5 returns the old value 100", old == 100);
    let old = atomic(4, SendOp::CompareSwap { remote_addr: counter_addr, rkey: counter_rkey, compare: 105, swap: 7 })?;
    ok &= check("compare-swap 105 -> 7 returns 105", old == 105);
    let old = atomic(5, SendOp::FetchAdd { remote_addr: counter_addr, rkey: counter_rkey, add: 0 })?;
    ok &= check("the counter now holds 7", old == 7);
    ep.disconnect()?;
    Ok(ok)
}

fn check(what: &str, ok: bool) -> bool {
    println!("client: {} {what}", if ok { "ok  " } else { "FAIL" });
    ok
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = ContextOptions::default();
    let result = match args.first().map(String::as_str) {
        Some("--server") => CmEndpoint::listen_on(
            SocketAddr::from(([0, 0, 0, 0], SERVICE)),
            QpType::Rc,
            cap(),
            options.clone(),
            4,
            Duration::from_secs(3600),
        )
        .and_then(server)
        .map(|()| true),
        Some("--client") => match args.get(1).and_then(|h| h.parse().ok()) {
            Some(host) => client(host, options),
            None => {
                eprintln!("usage: write_read [--server | --client IP]");
                return ExitCode::from(2);
            }
        },
        None => {
            CmEndpoint::listen_on(SocketAddr::from(([127, 0, 0, 1], SERVICE)), QpType::Rc, cap(), options.clone(), 4, T)
                .and_then(|listen| {
                    let s = std::thread::spawn(move || server(listen));
                    let ok = client([127, 0, 0, 1].into(), options)?;
                    s.join().expect("the server thread")?;
                    Ok(ok)
                })
        }
        Some(other) => {
            eprintln!("write_read: unknown argument {other:?}; usage: write_read [--server | --client IP]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("write_read: {e}");
            ExitCode::FAILURE
        }
    }
}
