//! Link-local GIDs through the C libraries, between two network namespaces joined by a
//! veth pair whose ends have known addresses only (IPv4, a global IPv6 and two link-local
//! IPv6 addresses; no automatic link-local address): `ibv_query_gid`,
//! `ibv_query_gid_type`, `ibv_query_gid_ex`, `ibv_query_gid_table` (tests/c/gid_table.c)
//! and Debian's `ibv_devinfo -v` agree on every GID, the link-local ones included, and
//! Debian's `ibv_rc_pingpong -g N` runs between the namespaces over link-local GIDs. Skips,
//! saying why, where namespaces cannot be made (not root, no iproute2, no permission) or
//! the programs, compiler or headers are missing.
#![allow(clippy::print_stderr)]

mod common;

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const IFACE: [&str; 2] = ["srdma-la", "srdma-lb"];
const IPV4: [&str; 2] = ["10.78.0.1", "10.78.0.2"];
const GLOBAL6: [&str; 2] = ["fd78::1", "fd78::2"];
const LINK_LOCAL: [[&str; 2]; 2] = [["fe80::a:1", "fe80::a:2"], ["fe80::b:1", "fe80::b:2"]];

/// Two network namespaces joined by a veth pair (`IFACE`), each end with the addresses
/// above; removed on drop.
struct Netns {
    pair: NetnsPair,
}

impl Netns {
    /// The namespaces for test `tag`, or `None` (having said why) where they cannot be made.
    fn create_or_skip(tag: &str) -> Option<Netns> {
        let pair = NetnsPair::create_or_skip(&format!("iv{tag}"), IFACE)?;
        for i in 0..2 {
            pair.add_address(i, &format!("{}/24", IPV4[i]));
            for v6 in [GLOBAL6[i], LINK_LOCAL[i][0], LINK_LOCAL[i][1]] {
                pair.add_address(i, &format!("{v6}/64"));
            }
        }
        Some(Netns { pair })
    }

    /// Side `i`'s GID table as softrdma documents it: IPv4, global IPv6, then link-local
    /// IPv6, each in the order the kernel lists them (`ip addr`, the same netlink dump as
    /// getifaddrs).
    fn gid_order(&self, i: usize) -> Vec<IpAddr> {
        let out = run(&["ip", "-n", &self.pair.names[i], "-o", "addr", "show", "dev", IFACE[i]]).unwrap();
        let mut all: Vec<IpAddr> = out
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace().skip_while(|w| *w != "inet" && *w != "inet6");
                words.nth(1).map(|a| a.split('/').next().unwrap().parse().unwrap())
            })
            .collect();
        all.sort_by_key(|a| match a {
            IpAddr::V4(_) => 0,
            IpAddr::V6(v6) if v6.is_unicast_link_local() => 2,
            IpAddr::V6(_) => 1,
        });
        all
    }

    /// `program args` in namespace `i` over the libraries in `lib`.
    fn command(&self, i: usize, lib: &Path, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.names[i]]).arg(program).args(args).env("LD_LIBRARY_PATH", lib);
        c
    }
}

/// `GID[  2]:\t\tfe80::a:2, RoCE v2` lines, as ibv_devinfo prints them.
fn gid_lines(text: &str) -> Vec<String> {
    text.lines().filter(|l| l.trim_start().starts_with("GID[")).map(|l| l.trim().to_string()).collect()
}

fn show(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn every_gid_query_and_ibv_devinfo_agree_link_local_gids_included() {
    if !installed("ibv_devinfo") {
        eprintln!("SKIP: ibv_devinfo is not installed (apt-get install ibverbs-utils)");
        return;
    }
    let Some(ns) = Netns::create_or_skip("gid") else { return };
    let lib = lib_dir("link-local-gid");
    let Some(exe) = build_c("gid_table", &lib.path) else { return };
    let device = format!("softrdma_{}", IFACE[0]);

    let c = ns.command(0, &lib.path, &exe, &[&device, IFACE[0]]).output().unwrap();
    assert!(c.status.success() && String::from_utf8_lossy(&c.stdout).ends_with("ok\n"), "{}", show(&c));
    let devinfo = ns.command(0, &lib.path, Path::new("ibv_devinfo"), &["-v", "-d", &device]).output().unwrap();
    assert!(devinfo.status.success(), "{}", show(&devinfo));

    // The C program's lines (ibv_query_gid and the others, which agree) and Debian's
    // ibv_devinfo's (ibv_query_gid and ibv_query_gid_type) are the same table...
    let (queried, printed) = (gid_lines(&String::from_utf8_lossy(&c.stdout)), gid_lines(&show(&devinfo)));
    assert_eq!(queried, printed, "the GID queries against ibv_devinfo -v");
    // ...and it is the documented one, with both link-local addresses last.
    let want: Vec<String> = ns
        .gid_order(0)
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let gid = match ip {
                IpAddr::V4(v4) => format!("::ffff:{v4}"),
                IpAddr::V6(v6) => v6.to_string(),
            };
            format!("GID[{i:>3}]:\t\t{gid}, RoCE v2")
        })
        .collect();
    assert_eq!(printed, want);
    assert_eq!(want.len(), 4, "IPv4, global IPv6 and two link-local: {want:?}");
    for ll in LINK_LOCAL[0] {
        assert!(printed[2..].iter().any(|l| l.contains(&format!("\t{ll}, "))), "{ll} in {printed:?}");
    }
}

/// Runs `client` until it succeeds, at most 5 s, while `server` (which may not listen yet)
/// runs; then waits for the server. Their outputs.
fn serve(mut server: Child, mut client: impl FnMut() -> Output) -> (Output, Output) {
    let start = Instant::now();
    let c = loop {
        let c = client();
        if c.status.success() || start.elapsed() > Duration::from_secs(5) || server.try_wait().unwrap().is_some() {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if server.try_wait().unwrap().is_none() {
        let _ = server.kill(); // by its PID: the `ip netns exec` that became the program
    }
    (server.wait_with_output().unwrap(), c)
}

#[test]
fn ibv_rc_pingpong_runs_between_namespaces_over_link_local_gids() {
    if !installed("ibv_rc_pingpong") {
        eprintln!("SKIP: ibv_rc_pingpong is not installed (apt-get install ibverbs-utils)");
        return;
    }
    let Some(ns) = Netns::create_or_skip("pp") else { return };
    let lib = lib_dir("link-local-pingpong");
    // Each side's first link-local address, by its index in that side's own table.
    let index = |i: usize| {
        let ll: IpAddr = LINK_LOCAL[i][0].parse().unwrap();
        ns.gid_order(i).iter().position(|a| *a == ll).unwrap().to_string()
    };
    let (ga, gb) = (index(0), index(1));
    assert!(ga.parse::<usize>().unwrap() >= 2, "after the IPv4 and global IPv6 GIDs");
    let (da, db) = (format!("softrdma_{}", IFACE[0]), format!("softrdma_{}", IFACE[1]));
    let pingpong = Path::new("ibv_rc_pingpong");
    let server = ns
        .command(1, &lib.path, pingpong, &["-d", &db, "-g", &gb, "-n", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The ping-pong's own exchange goes over TCP to the server's IPv4 address.
    let (s, c) = serve(server, || {
        ns.command(0, &lib.path, pingpong, &["-d", &da, "-g", &ga, "-n", "200", IPV4[1]]).output().unwrap()
    });
    let (s_text, c_text) = (show(&s), show(&c));
    assert!(
        s.status.success() && c.status.success(),
        "server ({}):\n{s_text}\nclient ({}):\n{c_text}",
        s.status,
        c.status
    );
    let gid_of = |text: &str, which: &str| {
        text.lines().find(|l| l.contains(which)).and_then(|l| l.rsplit("GID ").next()).unwrap_or("").trim().to_string()
    };
    assert_eq!(gid_of(&c_text, "local address"), LINK_LOCAL[0][0], "{c_text}");
    assert_eq!(gid_of(&c_text, "remote address"), LINK_LOCAL[1][0], "{c_text}");
    assert_eq!(gid_of(&s_text, "remote address"), LINK_LOCAL[0][0], "{s_text}");
    assert!(c_text.contains("200 iters in"), "{c_text}");
}

#[test]
fn rping_connects_between_namespaces_to_a_scoped_link_local_address() {
    if !installed("rping") {
        eprintln!("SKIP: rping is not installed (apt-get install rdmacm-utils)");
        return;
    }
    let Some(ns) = Netns::create_or_skip("cm") else { return };
    let lib = lib_dir("link-local-rping");
    assert!(lib.rdmacm, "librdmacm.so.1 was not built");
    // rping resolves "ADDRESS%INTERFACE" with getaddrinfo: a sockaddr_in6 with the
    // interface's index as sin6_scope_id, in each namespace its own interface's.
    let server_at = format!("{}%{}", LINK_LOCAL[1][0], IFACE[1]);
    let client_to = format!("{}%{}", LINK_LOCAL[1][0], IFACE[0]);
    let rping = Path::new("rping");
    let server = ns
        .command(1, &lib.path, rping, &["-s", "-a", &server_at, "-p", "7471", "-v", "-C", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (s, c) = serve(server, || {
        ns.command(0, &lib.path, rping, &["-c", "-a", &client_to, "-p", "7471", "-v", "-C", "3"]).output().unwrap()
    });
    let (s_text, c_text) = (show(&s), show(&c));
    assert!(
        s.status.success() && c.status.success(),
        "server ({}):\n{s_text}\nclient ({}):\n{c_text}",
        s.status,
        c.status
    );
    assert!(c_text.contains("ping data: rdma-ping-2"), "{c_text}");
    assert!(s_text.contains("server ping data: rdma-ping-2"), "{s_text}");
}
