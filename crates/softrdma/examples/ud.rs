//! UD datagrams found through rdma_cm's service resolution (SIDR), the way `udaddy` does
//! it: the client resolves the server's UD QP (number and Q_Key) from an address and port,
//! makes an address handle and sends datagrams; every receive buffer on the server starts
//! with the 40-byte GRH (here: 20 zero bytes and the sender's IPv4 header), then the
//! payload.
//!
//! ```sh
//! cargo run -p softrdma --example ud                       # both sides, this process
//! cargo run -p softrdma --example ud -- --server           # one side ...
//! cargo run -p softrdma --example ud -- --client 127.0.0.1 # ... the other
//! ```
//!
//! The server prints each datagram's source address (read from its GRH) and text.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program reports on its terminal

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use softrdma::{CmEndpoint, ConnParam, ContextOptions, QpCap, QpType, SendFlags, WcStatus};

const SERVICE: u16 = 7175;
const COUNT: usize = 4;
const T: Duration = Duration::from_secs(10);

fn cap() -> QpCap {
    QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

fn server(listen: CmEndpoint) -> softrdma::Result<bool> {
    let (ep, _request) = listen.get_request()?;
    let msgs = ep.reg_msgs(COUNT * 256)?;
    for i in 0..COUNT {
        ep.post_recv(i as u64, &msgs, i * 256..(i + 1) * 256)?;
    }
    ep.accept(&ConnParam::default())?; // the SIDR_REP: our QPN and Q_Key
    let mut ok = true;
    for _ in 0..COUNT {
        let wc = ep.get_recv_comp(T)?;
        let at = wc.wr_id as usize * 256;
        let mut buf = vec![0u8; wc.byte_len as usize];
        msgs.read(at, &mut buf)?;
        // IPv4 in the GRH: 20 zero bytes, then the IPv4 header, source address at 12..16.
        let from = Ipv4Addr::new(buf[32], buf[33], buf[34], buf[35]);
        let text = String::from_utf8_lossy(&buf[40..]);
        println!("server: {} bytes (40 of GRH) from {from} (QP {}): {text:?}", wc.byte_len, wc.src_qp.value());
        ok &= wc.status == WcStatus::Success && wc.grh.is_some() && text.starts_with("datagram ");
    }
    Ok(ok)
}

fn client(server: IpAddr, options: ContextOptions) -> softrdma::Result<bool> {
    let ep = CmEndpoint::connect_to(SocketAddr::new(server, SERVICE), QpType::Ud, cap(), options, T)?;
    let est = ep.connect(&ConnParam::default())?; // SIDR_REQ; ESTABLISHED carries the answer
    let ud = est.ud.expect("a UD ESTABLISHED carries the remote QP");
    println!("client: {server}:{SERVICE} is UD QP {} with Q_Key {:#x}", ud.remote_qpn, ud.qkey);
    let ah = ep.pd().expect("create_ep gives a PD").create_ah(ud.ah)?;
    let msgs = ep.reg_msgs(COUNT * 64)?;
    for i in 0..COUNT {
        let text = format!("datagram {i} from the client");
        msgs.write(i * 64, text.as_bytes())?;
        ep.post_ud_send(i as u64, &msgs, i * 64..i * 64 + text.len(), SendFlags::SIGNALED, &ah, &ud)?;
        if ep.get_send_comp(T)?.status != WcStatus::Success {
            return Ok(false);
        }
    }
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = ContextOptions::default();
    let listen = |ip: [u8; 4], timeout| {
        CmEndpoint::listen_on(SocketAddr::from((ip, SERVICE)), QpType::Ud, cap(), options.clone(), 4, timeout)
    };
    let result = match args.first().map(String::as_str) {
        Some("--server") => listen([0, 0, 0, 0], Duration::from_secs(3600)).and_then(server),
        Some("--client") => match args.get(1).and_then(|h| h.parse().ok()) {
            Some(host) => client(host, options.clone()),
            None => {
                eprintln!("usage: ud [--server | --client IP]");
                return ExitCode::from(2);
            }
        },
        None => listen([127, 0, 0, 1], T).and_then(|l| {
            let s = std::thread::spawn(move || server(l));
            let sent = client([127, 0, 0, 1].into(), options.clone())?;
            Ok(sent && s.join().expect("the server thread")?)
        }),
        Some(other) => {
            eprintln!("ud: unknown argument {other:?}; usage: ud [--server | --client IP]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("ud: a datagram went wrong");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ud: {e}");
            ExitCode::FAILURE
        }
    }
}
