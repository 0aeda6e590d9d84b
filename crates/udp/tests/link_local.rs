//! RoceSocket on link-local IPv6 addresses (`fe80::/10`): bound in the scope of its
//! interface ([`Config::scope_id`]), sending to link-local peers in that scope, and
//! reporting the scope of what it receives. The exchange runs between two network
//! namespaces joined by a veth pair, which the test makes (as root; it skips, saying why,
//! where it cannot) and removes; each socket is made by a thread that entered its
//! namespace (`setns`), then used from the test's own thread.

#![allow(clippy::print_stderr)]

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::Duration;

use softrdma_udp::{Config, RecvBatch, RoceSocket};
use softrdma_wire::{BthRepr, ExtHeaders, Opcode, PKey, Psn, Qpn, RocePacket, RoceRepr};

const WAIT: Duration = Duration::from_secs(2);
const IFACE: [&str; 2] = ["srdma-ua", "srdma-ub"];
const LINK_LOCAL: [&str; 2] = ["fe80::a:1", "fe80::b:1"];

#[test]
fn a_link_local_address_is_not_bound_without_its_interface() {
    let e = RoceSocket::bind_with("fe80::1".parse().unwrap(), &Config { port: 0, ..Config::default() }).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("fe80::1") && e.to_string().contains("Config::scope_id"), "{e}");
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Two namespaces joined by a veth pair, each end with one link-local address and no
/// other; removed on drop.
struct Netns {
    names: [String; 2],
}

impl Netns {
    /// The namespaces of test `tag` (tests run in parallel), or `None` having said why
    /// they cannot be made.
    fn create_or_skip(tag: &str) -> Option<Netns> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: creating network namespaces needs root");
            return None;
        }
        let names = ["a", "b"].map(|s| format!("srdma-udp{}-{tag}-{s}", std::process::id() % 100_000));
        if let Err(e) = run(&["ip", "netns", "add", &names[0]]) {
            eprintln!("skipped: `ip netns add` is not possible here: {e}");
            return None;
        }
        let ns = Netns { names };
        ns.build().unwrap_or_else(|e| panic!("building two namespaces joined by veth: {e}"));
        Some(ns)
    }

    fn build(&self) -> Result<(), String> {
        let [a, b] = [&self.names[0], &self.names[1]];
        run(&["ip", "netns", "add", b])?;
        run(&["ip", "link", "add", IFACE[0], "netns", a, "type", "veth", "peer", IFACE[1], "netns", b])?;
        for (n, dev) in self.names.iter().zip(IFACE) {
            run(&["ip", "-n", n, "link", "set", dev, "addrgenmode", "none"])?;
            run(&["ip", "-n", n, "link", "set", dev, "up"])?;
        }
        // Added once the links are up (added before, they answer no neighbour solicitation
        // for about a second), without duplicate address detection (bindable at once).
        for ((n, dev), ll) in self.names.iter().zip(IFACE).zip(LINK_LOCAL) {
            run(&["ip", "-n", n, "addr", "add", &format!("{ll}/64"), "dev", dev, "nodad"])?;
        }
        Ok(())
    }

    fn ifindex(&self, i: usize) -> u32 {
        let out = run(&["ip", "-n", &self.names[i], "-o", "link", "show", "dev", IFACE[i]]).unwrap();
        out.split(':').next().unwrap().trim().parse().unwrap()
    }

    /// Runs `f` in a thread that entered namespace `i`: sockets it makes live there.
    fn within<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.names[i]);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
                    .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn send_only(payload: &[u8]) -> RoceRepr<'_> {
    RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: false,
            mig_req: true,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x11).unwrap(),
            ack_req: true,
            psn: Psn::new(1).unwrap(),
        },
        ext: ExtHeaders::default(),
        payload,
    }
}

#[test]
fn link_local_sockets_talk_in_their_interfaces_scope() {
    let Some(ns) = Netns::create_or_skip("tx") else { return };
    let scope = [ns.ifindex(0), ns.ifindex(1)];
    let ll = LINK_LOCAL.map(|a| a.parse::<Ipv6Addr>().unwrap());
    let bind = |i: usize| {
        let config = Config { scope_id: Some(scope[i]), ..Config::default() };
        ns.within(i, || RoceSocket::bind_with(IpAddr::V6(ll[i]), &config)).unwrap()
    };
    let sockets = [bind(0), bind(1)];
    for i in 0..2 {
        let want = SocketAddr::V6(SocketAddrV6::new(ll[i], 4791, 0, scope[i]));
        assert_eq!(sockets[i].local_addr(), want, "bound in its interface's scope");
    }
    for (from, to) in [(0, 1), (1, 0)] {
        // The envelope holds addresses only, as the ICRC covers them: no scope. The socket
        // adds its own to the link-local destination.
        let envelope = sockets[from].envelope_to(SocketAddr::new(ll[to].into(), 4791)).unwrap();
        let mut buf = [0u8; 256];
        let len = send_only(b"over fe80").emit(&envelope, &mut buf).unwrap();
        sockets[from].send(&envelope, &buf[..len]).unwrap();
        let mut batch = RecvBatch::new(4, 2048);
        assert_eq!(sockets[to].recv_timeout(&mut batch, WAIT).unwrap(), 1, "{from} → {to}");
        let d = batch.iter().next().unwrap();
        assert_eq!(d.source, SocketAddr::V6(SocketAddrV6::new(ll[from], 4791, 0, scope[to])), "scoped source");
        assert_eq!(d.destination, sockets[to].local_addr(), "scoped destination");
        assert_eq!(d.ifindex, scope[to]);
        assert_eq!(d.envelope(), envelope, "what the ICRC is checked against");
        let packet = RocePacket::new_checked(d.payload).unwrap();
        let repr = RoceRepr::parse(&packet, &d.envelope()).expect("the ICRC verifies");
        assert_eq!(repr.payload, b"over fe80");
    }
}

#[test]
fn a_tentative_link_local_address_binds() {
    let Some(ns) = Netns::create_or_skip("dad") else { return };
    // With duplicate address detection: tentative for a second after it is added (the
    // state of every link-local address of a link that just came up).
    let tentative = "fe80::d:1";
    run(&["ip", "-n", &ns.names[0], "addr", "add", &format!("{tentative}/64"), "dev", IFACE[0]]).unwrap();
    let shown = run(&["ip", "-n", &ns.names[0], "-o", "addr", "show", "dev", IFACE[0]]).unwrap();
    assert!(shown.lines().any(|l| l.contains(tentative) && l.contains("tentative")), "{shown}");
    let config = Config { scope_id: Some(ns.ifindex(0)), ..Config::default() };
    let s = ns.within(0, || RoceSocket::bind_with(tentative.parse().unwrap(), &config));
    assert!(s.is_ok(), "binding tentative {tentative}: {:?}", s.err());
}

/// IPv6 multicast (no `lo`: it has no IPv6 multicast route) between the namespaces: a
/// group socket ([`RoceSocket::bind_group`]) joined on each end gets the datagram a
/// link-local socket sends to the group by its interface ([`Config::multicast_interface`]),
/// the sender's own namespace by loopback, both with the group as the destination the ICRC
/// covers.
#[test]
fn ipv6_groups_reach_every_member_on_the_link() {
    let Some(ns) = Netns::create_or_skip("mc") else { return };
    let scope = [ns.ifindex(0), ns.ifindex(1)];
    let ll = LINK_LOCAL.map(|a| a.parse::<Ipv6Addr>().unwrap());
    for group in ["ff0e::db8:77", "ff12::db8:77"] {
        let group: IpAddr = group.parse().unwrap();
        let member = |i: usize| {
            let config = Config { port: 4791, ..Config::default() };
            ns.within(i, || RoceSocket::bind_group(group, scope[i], &config)).unwrap()
        };
        let members = [member(0), member(1)];
        let config = Config { scope_id: Some(scope[0]), multicast_interface: Some(scope[0]), ..Config::default() };
        let tx = ns.within(0, || RoceSocket::bind_with(IpAddr::V6(ll[0]), &config)).unwrap();
        let envelope = tx.envelope_to(SocketAddr::new(group, 4791)).unwrap();
        let mut buf = [0u8; 256];
        let len = send_only(b"to the group").emit(&envelope, &mut buf).unwrap();
        tx.send(&envelope, &buf[..len]).unwrap();
        for (i, m) in members.iter().enumerate() {
            let mut batch = RecvBatch::new(4, 2048);
            assert_eq!(m.recv_timeout(&mut batch, WAIT).unwrap(), 1, "{group}: member in namespace {i}");
            let d = batch.iter().next().unwrap();
            assert_eq!((d.ifindex, d.hop_limit), (scope[i], 1), "{group}: by the link, hop limit 1");
            assert_eq!(d.envelope(), envelope, "{group}: the group is the destination");
            let packet = RocePacket::new_checked(d.payload).unwrap();
            assert_eq!(RoceRepr::parse(&packet, &d.envelope()).expect("the ICRC verifies").payload, b"to the group");
        }
    }
}
