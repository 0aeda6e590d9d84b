//! Link-local GIDs (`fe80::/10`) between two hosts: two network namespaces joined by a veth
//! pair whose ends have known addresses only (an IPv4 address, a global IPv6 address and
//! two link-local ones, no automatic link-local address, no duplicate address detection).
//! The GID table lists the link-local addresses after the others, RC traffic flows between
//! link-local GIDs, and rdma_cm resolves a link-local address with a scope to the device
//! of the interface the scope names.
//!
//! Children are this test binary run again inside a namespace (`ip netns exec`, which also
//! gives them the namespace's `/sys/class/net`), in the role named by `SOFTRDMA_TEST_ROLE`;
//! `child_entry` is their entry point and does nothing otherwise. The tests skip, saying
//! why, where namespaces cannot be made (not root, no iproute2, no permission).

// Tests talk to the child processes they start over stdout, and say why they skip.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use common::child::*;
use common::netns::{NetnsPair, run};
use common::*;
use softrdma::*;

const ENTRY: &str = "child_entry";

/// The veth ends, one in each namespace, and their addresses.
const IFACE: [&str; 2] = ["srdma-la", "srdma-lb"];
const IPV4: [&str; 2] = ["10.78.0.1", "10.78.0.2"];
const GLOBAL6: [&str; 2] = ["fd78::1", "fd78::2"];
/// Added in this order; the kernel lists the later one of a scope first.
const LINK_LOCAL: [[&str; 2]; 2] = [["fe80::a:1", "fe80::a:2"], ["fe80::b:1", "fe80::b:2"]];
/// The rdma_cm service port of the server.
const SERVICE: u16 = 7471;

/// Runs the child role named in the environment; a no-op when this is not a child.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    match role.as_str() {
        "gids" => gids(),
        "rc-initiator" => rc_side(true),
        "rc-target" => rc_side(false),
        "cm-server" => cm_server(),
        "cm-client" => cm_client(),
        other => panic!("unknown child role {other}"),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ---- the namespaces ---------------------------------------------------------------------

/// Two network namespaces joined by a veth pair (`IFACE`), each end with the addresses
/// above; removed on drop.
struct Netns {
    pair: NetnsPair,
}

impl Netns {
    /// The namespaces for test `tag`, or `None` (having said why) where they cannot be made.
    fn create_or_skip(tag: &str) -> Option<Netns> {
        let pair = NetnsPair::create_or_skip(tag, IFACE)?;
        for i in 0..2 {
            pair.add_address(i, &format!("{}/24", IPV4[i]));
            for v6 in [GLOBAL6[i], LINK_LOCAL[i][0], LINK_LOCAL[i][1]] {
                pair.add_address(i, &format!("{v6}/64"));
            }
        }
        Some(Netns { pair })
    }

    /// The interface index of side `i`'s veth end, in its namespace.
    fn ifindex(&self, i: usize) -> u32 {
        self.pair.ifindex(i)
    }

    /// Side `i`'s addresses as the kernel lists them (`ip addr`, which reads the same
    /// netlink dump as getifaddrs).
    fn kernel_addresses(&self, i: usize) -> Vec<IpAddr> {
        let out = run(&["ip", "-n", &self.pair.names[i], "-o", "addr", "show", "dev", IFACE[i]]).unwrap();
        out.lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace().skip_while(|w| *w != "inet" && *w != "inet6");
                words.nth(1).map(|a| ip(a.split('/').next().unwrap()))
            })
            .collect()
    }

    fn spawn(&self, i: usize, role: &str, env: &[(&str, String)]) -> ChildProc {
        let mut env = env.to_vec();
        env.push(("SOFTRDMA_TEST_IFACE", IFACE[i].to_string()));
        ChildProc::spawn(ENTRY, role, &env, Some(&self.pair.names[i]))
    }
}

// ---- the GID table ------------------------------------------------------------------------

#[test]
fn the_gid_table_lists_link_local_addresses_last_in_the_kernels_order() {
    let Some(ns) = Netns::create_or_skip("gid") else { return };
    let mut child = ns.spawn(0, "gids", &[]);
    let line = child.expect_line("GIDS ", WAIT);
    assert!(child.wait_success(WAIT), "the child checks the context's view: {line}");
    let mut words = line.split_whitespace().skip(1);
    let ifindex: u32 = words.next().unwrap().parse().unwrap();
    let table: Vec<IpAddr> = words.map(ip).collect();

    // IPv4, global IPv6, then the link-local addresses in the order the kernel lists them.
    let kernel = ns.kernel_addresses(0);
    let link_local: Vec<IpAddr> =
        kernel.iter().copied().filter(|a| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local())).collect();
    let mut want = vec![ip(IPV4[0]), ip(GLOBAL6[0])];
    want.extend(&link_local);
    assert_eq!(table, want, "the kernel lists {kernel:?}");
    let mut both: Vec<IpAddr> = link_local.clone();
    both.sort();
    assert_eq!(both, vec![ip(LINK_LOCAL[0][0]), ip(LINK_LOCAL[0][1])], "both link-local addresses, no other");
    assert_eq!(ifindex, ns.ifindex(0), "the device's interface index (the link-local scope)");
}

/// Lists the device's GID table as `GIDS <ifindex> <address>...`, after checking that an
/// opened context (which binds a socket on every address, the link-local ones in their
/// scope) agrees with it.
fn gids() {
    let device = softrdma::device(&env("SOFTRDMA_TEST_IFACE")).expect("the veth end is a device");
    let ctx = device.open().expect("open the device: bind every address, link-local ones in their scope");
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.gid_tbl_len as usize, device.addresses().len());
    for (i, a) in device.addresses().iter().enumerate() {
        let index = u8::try_from(i).unwrap();
        assert_eq!(ctx.gid(index), Some(Gid::from_ip(*a)), "GID {i}");
        assert_eq!(device.gid_index(*a), Some(index));
    }
    let list: Vec<String> = device.addresses().iter().map(ToString::to_string).collect();
    say(&format!("GIDS {} {}", device.interface_index(), list.join(" ")));
}

// ---- RC over link-local GIDs ----------------------------------------------------------------

const RC_LEN: usize = 1 << 20;

#[test]
fn rc_write_and_read_between_link_local_gids_of_two_namespaces() {
    let Some(ns) = Netns::create_or_skip("rc") else { return };
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("initiator.pcap");
    // The second link-local address of each side: any GID, not just the first of a kind.
    let side_env = |i: usize| vec![("SOFTRDMA_TEST_IP", LINK_LOCAL[i][1].to_string())];
    let mut initiator_env = side_env(0);
    initiator_env.push((CAPTURE_ENV, capture.display().to_string()));
    let mut a = ns.spawn(0, "rc-initiator", &initiator_env);
    let mut b = ns.spawn(1, "rc-target", &side_env(1));
    let (ea, eb) = (a.expect_line("EP ", WAIT), b.expect_line("EP ", WAIT));
    a.send_line(&eb);
    b.send_line(&ea);
    let done = a.expect_line("DONE", Duration::from_secs(60));
    assert_eq!(done, "DONE ok", "WRITE then READ back over link-local GIDs");
    b.send_line(&format!("CHECK 0 {RC_LEN} 7"));
    assert_eq!(b.expect_line("CHECK", WAIT), "CHECK ok", "the WRITEs landed at the target");
    a.close_stdin();
    b.close_stdin();
    assert!(a.wait_success(WAIT) && b.wait_success(WAIT));

    // On the wire: IPv6 between the two link-local addresses, every ICRC valid.
    let opcodes = assert_clean_capture(&capture);
    assert!(opcodes.contains(&softrdma_wire::Opcode::RC_RDMA_WRITE_FIRST), "{opcodes:?}");
    let mut reader = softrdma_pcap::CaptureReader::open(&capture).unwrap();
    let (ll_a, ll_b): (Ipv6Addr, Ipv6Addr) = (LINK_LOCAL[0][1].parse().unwrap(), LINK_LOCAL[1][1].parse().unwrap());
    while let Some(frame) = reader.next_frame() {
        let frame = frame.unwrap();
        let dgram = softrdma_wire::DatagramRepr::parse(frame.ip_packet().unwrap()).unwrap();
        let softrdma_wire::IpRepr::V6(h) = dgram.ip else { panic!("an IPv4 packet: {:?}", dgram.ip) };
        let (src, dst) = (Ipv6Addr::from(h.source), Ipv6Addr::from(h.destination));
        assert!((src, dst) == (ll_a, ll_b) || (src, dst) == (ll_b, ll_a), "a packet from {src} to {dst}");
    }
}

/// One side of the RC test: the device of the veth end with its whole GID table, a QP
/// whose source GID is the link-local `SOFTRDMA_TEST_IP`. The initiator WRITEs a pattern
/// to the target and READs it back; the target checks what landed when asked.
fn rc_side(initiator: bool) {
    let device = softrdma::device(&env("SOFTRDMA_TEST_IFACE")).unwrap();
    let me: IpAddr = env("SOFTRDMA_TEST_IP").parse().unwrap();
    let sgid_index = device.gid_index(me).expect("the link-local address is a GID");
    let ctx = device.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 64;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(2 * RC_LEN, Access::ALL).unwrap();
    let advert = Advert { qpn: qp.qpn(), ip: me, psn: 1000, addr: mr.addr(), rkey: mr.rkey(), len: RC_LEN as u64 };
    say(&advert.line());
    let peer = Advert::parse(&read_stdin_line().expect("the peer's EP line"));
    assert!(matches!(peer.ip, IpAddr::V6(v6) if v6.is_unicast_link_local()), "{peer:?}");
    qp.connect(advert.psn, &peer.endpoint(), &ConnectOptions { sgid_index, ..ConnectOptions::default() }).unwrap();
    if initiator {
        mr.write(0, &pattern(RC_LEN, 7)).unwrap();
        let chunk = 64 << 10;
        for (i, off) in (0..RC_LEN).step_by(chunk).enumerate() {
            let sge = [mr.sge(off..off + chunk).unwrap()];
            let op = SendOp::RdmaWrite { remote_addr: peer.addr + off as u64, rkey: peer.rkey() };
            qp.post_send(&[wr(i as u64, op, &sge)]).unwrap();
        }
        for _ in (0..RC_LEN).step_by(chunk) {
            let wc = cq.wait(WAIT).unwrap();
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        let sge = [mr.sge(RC_LEN..2 * RC_LEN).unwrap()];
        let op = SendOp::RdmaRead { remote_addr: peer.addr, rkey: peer.rkey() };
        qp.post_send(&[wr(99, op, &sge)]).unwrap();
        let wc = cq.wait(WAIT).unwrap();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let mut back = vec![0u8; RC_LEN];
        mr.read(RC_LEN, &mut back).unwrap();
        say(if back == pattern(RC_LEN, 7) { "DONE ok" } else { "DONE the READ brought back other bytes" });
    }
    while let Some(line) = read_stdin_line() {
        let f: Vec<usize> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        let mut got = vec![0u8; f[1]];
        mr.read(f[0], &mut got).unwrap();
        say(if got == pattern(f[1], f[2] as u64) { "CHECK ok" } else { "CHECK mismatch" });
    }
}

// ---- rdma_cm ----------------------------------------------------------------------------------

#[test]
fn rdma_cm_resolves_a_scoped_link_local_address_to_its_interfaces_device() {
    let Some(ns) = Netns::create_or_skip("cm") else { return };
    let mut server = ns.spawn(1, "cm-server", &[]);
    server.expect_line("LISTENING", WAIT);
    // The client names the server's address in its own scope: its veth end's index.
    let dst = SocketAddrV6::new(LINK_LOCAL[1][0].parse().unwrap(), SERVICE, 0, ns.ifindex(0));
    let mut client = ns.spawn(0, "cm-client", &[("SOFTRDMA_TEST_DST", dst.to_string())]);
    let local = client.expect_line("LOCAL ", WAIT);
    let peer = server.expect_line("PEER ", WAIT);
    assert_eq!(client.expect_line("ECHO", WAIT), "ECHO ok");
    assert!(client.wait_success(WAIT) && server.wait_success(WAIT));

    // Both report link-local addresses with their own interface's index as the scope.
    let local: SocketAddr = local.split_whitespace().nth(1).unwrap().parse().unwrap();
    let peer: SocketAddr = peer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (SocketAddr::V6(local), SocketAddr::V6(peer)) = (local, peer) else { panic!("{local} {peer}") };
    assert!(LINK_LOCAL[0].contains(&local.ip().to_string().as_str()), "the client's source: {local}");
    assert_eq!(local.scope_id(), ns.ifindex(0));
    assert_eq!((*peer.ip(), peer.port()), (*local.ip(), local.port()), "the server sees the client's address");
    assert_eq!(peer.scope_id(), ns.ifindex(1));
}

/// Listens on its first link-local address, in its scope; takes one connection, says the
/// peer's address, echoes one message and waits for the disconnect.
fn cm_server() {
    let ch = EventChannel::new().unwrap();
    let listen = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    let device = softrdma::device(&env("SOFTRDMA_TEST_IFACE")).unwrap();
    let me = device.socket_addr(ip(LINK_LOCAL[1][0]), SERVICE);
    assert_eq!(me, SocketAddrV6::new(LINK_LOCAL[1][0].parse().unwrap(), SERVICE, 0, device.interface_index()).into());
    listen.bind_addr(me).unwrap();
    assert_eq!(listen.local_addr(), Some(me), "bound in its scope");
    assert_eq!(listen.context().unwrap().device().interface(), env("SOFTRDMA_TEST_IFACE"));
    listen.listen(4).unwrap();
    say("LISTENING");
    let id = ch.expect(CmEventKind::ConnectRequest, WAIT).unwrap().id;
    assert_eq!(id.local_addr(), Some(me), "the request's ID is on the listener's address");
    say(&format!("PEER {}", id.peer_addr().unwrap()));
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cm_cap()).unwrap();
    let msgs = id.reg_msgs(256).unwrap();
    id.post_recv(1, &msgs, 0..256).unwrap();
    id.accept(&ConnParam::default()).unwrap();
    ch.expect(CmEventKind::Established, WAIT).unwrap();
    let wc = id.get_recv_comp(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    id.post_send(2, &msgs, 0..wc.byte_len as usize, SendFlags::SIGNALED).unwrap();
    assert_eq!(id.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    ch.expect(CmEventKind::Disconnected, WAIT).unwrap();
    id.disconnect().unwrap();
}

/// Resolves `SOFTRDMA_TEST_DST` (link-local, with a scope), connects, and has a message
/// echoed. A link-local destination without a scope is refused first, saying what is
/// missing.
fn cm_client() {
    let dst: SocketAddrV6 = env("SOFTRDMA_TEST_DST").parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let unscoped = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    let e = unscoped.resolve_addr(None, SocketAddrV6::new(*dst.ip(), dst.port(), 0, 0).into()).unwrap_err();
    assert!(e.to_string().contains("sin6_scope_id"), "{e}");
    drop(unscoped);

    let id = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    id.resolve_addr(None, dst.into()).unwrap();
    ch.expect(CmEventKind::AddrResolved, WAIT).unwrap();
    assert_eq!(id.context().unwrap().device().interface(), env("SOFTRDMA_TEST_IFACE"), "the scope's device");
    say(&format!("LOCAL {}", id.local_addr().unwrap()));
    assert_eq!(id.peer_addr(), Some(dst.into()));
    id.resolve_route().unwrap();
    ch.expect(CmEventKind::RouteResolved, WAIT).unwrap();
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cm_cap()).unwrap();
    id.connect(&ConnParam::default()).unwrap();
    ch.expect(CmEventKind::Established, WAIT).unwrap();
    let msgs = id.reg_msgs(256).unwrap();
    id.post_recv(1, &msgs, 128..256).unwrap();
    msgs.write(0, b"over link-local").unwrap();
    id.post_send(2, &msgs, 0..15, SendFlags::SIGNALED).unwrap();
    assert_eq!(id.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    let wc = id.get_recv_comp(WAIT).unwrap();
    let mut got = [0u8; 15];
    msgs.read(128, &mut got).unwrap();
    say(if wc.status == WcStatus::Success && &got == b"over link-local" { "ECHO ok" } else { "ECHO wrong" });
    id.disconnect().unwrap();
    ch.expect(CmEventKind::Disconnected, WAIT).unwrap();
}

fn cm_cap() -> QpCap {
    QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}
