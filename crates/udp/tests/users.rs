//! Many users, one host: processes of root and of two other users (this test binary,
//! copied where they can run it, re-executed as them) join one device's port at once; the
//! first user's coordinator makes the others' sockets. Each gets its own datagrams, and a
//! hostile one that takes the group's program off and connects its socket to a sender
//! still gets none of the others'. Needs root (to start processes of other users); says
//! SKIP otherwise.
#![allow(clippy::print_stdout)]
// setsockopt(2) of the options a hostile member would try, which no safe crate offers.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

mod common;

use common::{data_packet, group, random, report, resume, stop};
use softrdma_udp::host::{HostConfig, Member};
use softrdma_udp::{Config, RecvBatch};

const CHILD_ENV: &str = "SOFTRDMA_USERS_CHILD";
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Two users with no account: the kernel needs none.
const USER_A: u32 = 41_001;
const USER_B: u32 = 41_002;

fn out(s: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "@@ {s}");
    let _ = o.flush();
}

/// `setsockopt(SOL_SOCKET, name)` with an `int` or a program; the errno, 0 for success.
fn sockopt(fd: i32, name: i32, value: &[u8]) -> i32 {
    // SAFETY: `value` is a live buffer of `value.len()` bytes for the call; the kernel
    // copies what it reads and keeps no pointer.
    let rc = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, name, value.as_ptr().cast(), value.len() as u32) };
    if rc == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(-1) }
}

/// The child: `member,DEVICE,PORT[,hostile=SENDER]` joins and reports what it receives;
/// hostile, it first tries to steer the group its way. `squat,NAME` holds an abstract name.
#[test]
fn users_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = spec.split(',').collect();
    // Exit when the parent goes away (it holds our stdin).
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    if parts[0] == "squat" {
        let fd =
            rustix::net::socket(rustix::net::AddressFamily::UNIX, rustix::net::SocketType::SEQPACKET, None).unwrap();
        rustix::net::bind(&fd, &rustix::net::SocketAddrUnix::new_abstract_name(parts[1].as_bytes()).unwrap()).unwrap();
        rustix::net::listen(&fd, 16).unwrap();
        out("ready 0 0".into());
        let mut held = Vec::new();
        loop {
            held.push(rustix::net::accept(&fd).unwrap());
        }
    }
    let config = HostConfig { device: parts[1].into(), port: parts[2].parse().unwrap(), socket: Config::default() };
    let start = Instant::now();
    let member = match Member::join(&[LOCALHOST], &config) {
        Ok(m) => m,
        Err(e) => return out(format!("join_err {e}")),
    };
    let took = start.elapsed().as_micros();
    out(format!("ready {} {} {took}", member.slot(), u8::from(member.is_coordinator())));
    let socket = &member.sockets()[0];
    if parts.get(3) == Some(&"detach") {
        let fd = socket.as_fd().as_raw_fd();
        out(format!("detach_program {}", sockopt(fd, libc::SO_DETACH_REUSEPORT_BPF, &0i32.to_ne_bytes())));
    }
    if let Some(sender) = parts.get(3).and_then(|p| p.strip_prefix("hostile=")) {
        let fd = socket.as_fd().as_raw_fd();
        // A program that steers everything to index 0, in place of the group's.
        let insn = libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 };
        let prog = libc::sock_fprog { len: 1, filter: (&raw const insn).cast_mut() };
        // SAFETY: reads the `sock_fprog` on our stack as bytes for the call.
        let prog_bytes = unsafe {
            std::slice::from_raw_parts((&raw const prog).cast::<u8>(), std::mem::size_of::<libc::sock_fprog>())
        };
        out(format!("attach {}", sockopt(fd, libc::SO_ATTACH_REUSEPORT_CBPF, prog_bytes)));
        out(format!("detach_filter {}", sockopt(fd, libc::SO_DETACH_FILTER, &0i32.to_ne_bytes())));
        out(format!("detach_program {}", sockopt(fd, libc::SO_DETACH_REUSEPORT_BPF, &0i32.to_ne_bytes())));
        let to: SocketAddr = sender.parse().unwrap();
        let connected = rustix::net::connect(socket.as_fd(), &to).map_or_else(|e| e.raw_os_error(), |()| 0);
        out(format!("connect {connected}"));
    }
    let mut batch = RecvBatch::new(32, 2048);
    loop {
        if socket.recv_timeout(&mut batch, Duration::from_millis(20)).unwrap_or(0) == 0 {
            continue;
        }
        report(&member, &batch, out);
    }
}

struct Proc {
    child: Child,
    lines: Receiver<String>,
    slot: u32,
    coordinator: bool,
    /// How long its join took.
    joined_in: Duration,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This test binary, where users without an account can run it.
struct Exe(PathBuf);

impl Exe {
    fn new() -> Exe {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("softrdma-users-{}-{}", std::process::id(), random() % 1_000_000));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.join("users-test");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        Exe(exe)
    }

    /// Starts the child as `uid` (its group the same number); `None`: as this process.
    fn start(&self, uid: Option<u32>, spec: &str) -> Proc {
        let mut cmd = Command::new(&self.0);
        cmd.args(["--exact", "users_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, spec)
            .current_dir(self.0.parent().unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(uid) = uid {
            // As root, std drops the supplementary groups too.
            cmd.uid(uid).gid(uid);
        }
        // Another test's thread copying its binary while this one forks can hold the copy
        // open for writing in its child until that child execs: ETXTBSY for a moment.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                r => break r.unwrap(),
            }
        };
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("@@ ") {
                    if tx.send(line[at + 3..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Proc { child, lines: rx, slot: 0, coordinator: false, joined_in: Duration::ZERO }
    }

    /// Starts a member and waits for it to join.
    fn member(&self, uid: Option<u32>, device: &str, port: u16, extra: &str) -> Proc {
        let mut p = self.start(uid, &format!("member,{device},{port}{extra}"));
        let line = p.line();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], "ready", "a member of uid {uid:?}: {line}");
        p.slot = f[1].parse().unwrap();
        p.coordinator = f[2] == "1";
        p.joined_in = Duration::from_micros(f[3].parse().unwrap());
        p
    }
}

impl Drop for Exe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

impl Proc {
    fn line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(10)).expect("the child answers within 10 s")
    }

    fn received(&self) -> BTreeSet<u64> {
        self.lines.try_iter().filter_map(|l| l.strip_prefix("rx ").map(|t| t.parse().unwrap())).collect()
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A test's binary copy, device, port and sender; `None`, having said SKIP, unless root.
fn setup() -> Option<(Exe, String, u16, UdpSocket)> {
    if !is_root() {
        println!("SKIP: starting processes of other users needs root");
        return None;
    }
    let (device, port) = group("users");
    Some((Exe::new(), device, port, UdpSocket::bind((LOCALHOST, 0)).unwrap()))
}

/// Sends `n` datagrams to each member's slot (tags `round << 32 | slot << 8 | i`); returns
/// what each received of the round.
fn round(sender: &UdpSocket, port: u16, procs: &[&Proc], round: u64, n: u32) -> Vec<BTreeSet<u64>> {
    for p in procs {
        for i in 0..n {
            let tag = round << 32 | u64::from(p.slot) << 8 | u64::from(i);
            sender.send_to(&data_packet(p.slot << 13 | i, tag), (LOCALHOST, port)).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(150));
    procs.iter().map(|p| p.received().into_iter().filter(|t| t >> 32 == round).collect()).collect()
}

fn own(p: &Proc, round: u64, n: u32) -> BTreeSet<u64> {
    (0..n).map(|i| round << 32 | u64::from(p.slot) << 8 | u64::from(i)).collect()
}

/// Rounds until every member gets exactly its own (within `within`); returns the round after.
fn until_steered(sender: &UdpSocket, port: u16, procs: &[&Proc], first: u64, within: Duration) -> u64 {
    let start = Instant::now();
    let mut r = first;
    loop {
        let got = round(sender, port, procs, r, 4);
        if procs.iter().zip(&got).all(|(p, g)| *g == own(p, r, 4)) {
            return r + 1;
        }
        assert!(start.elapsed() < within, "not steered within {within:?}: {got:x?}");
        r += 1;
    }
}

#[test]
fn three_users_share_a_port_and_stay_apart() {
    let Some((exe, device, port, sender)) = setup() else { return };
    let owner = exe.member(None, &device, port, "");
    let a = exe.member(Some(USER_A), &device, port, "");
    let b = exe.member(Some(USER_B), &device, port, "");
    let owner2 = exe.member(None, &device, port, "");
    assert!(owner.coordinator && !a.coordinator && !b.coordinator && !owner2.coordinator);
    let slots: BTreeSet<u32> = [&owner, &a, &b, &owner2].iter().map(|p| p.slot).collect();
    assert_eq!(slots.len(), 4, "distinct slots");
    let all = [&owner, &a, &b, &owner2];
    let mut r = until_steered(&sender, port, &all, 1, Duration::from_secs(3));
    let got = round(&sender, port, &all, r, 50);
    for (p, g) in all.iter().zip(&got) {
        assert_eq!(*g, own(p, r, 50), "slot {} gets exactly its own", p.slot);
    }
    r += 1;

    // A hostile guest of user A: it cannot put a program of its own in, but takes the
    // group's off (the kernel lets any member) and connects its socket to the sender, which
    // makes the kernel prefer it for every datagram from there. Its locked filter keeps
    // none of the others'.
    let hostile = exe.member(Some(USER_A), &device, port, &format!(",hostile={}", sender.local_addr().unwrap()));
    assert_eq!(hostile.line(), format!("attach {}", libc::EPERM), "no program of its own");
    assert_eq!(hostile.line(), format!("detach_filter {}", libc::EPERM), "its filter stays");
    assert_eq!(hostile.line(), "detach_program 0", "the kernel lets any member take the program off");
    assert_eq!(hostile.line(), "connect 0");
    let everyone = [&owner, &a, &b, &owner2, &hostile];
    for _ in 0..3 {
        let got = round(&sender, port, &everyone, r, 50);
        let theirs = &got[4];
        assert!(
            theirs.iter().all(|t| (t >> 8) & 0xff_ffff == u64::from(hostile.slot)),
            "the hostile guest read others' datagrams"
        );
        r += 1;
    }
    // Once it ends, the coordinator's next program steers everyone again.
    drop(hostile);
    r = until_steered(&sender, port, &all, r, Duration::from_secs(3));

    // One that only takes the program off: the coordinator attaches it again within a
    // second or so, while that guest lives on.
    let detacher = exe.member(Some(USER_B), &device, port, ",detach");
    assert_eq!(detacher.line(), "detach_program 0");
    let taken_off = Instant::now();
    r = until_steered(&sender, port, &[&owner, &a, &b, &owner2, &detacher], r, Duration::from_secs(3));
    println!("steered again {:?} after the program was taken off", taken_off.elapsed());
    drop(detacher);

    // The owner's coordinator ends: the other process of its user takes over, and the guests
    // register with it (their sockets pass its check) and stay steered; a new guest joins.
    drop(owner);
    let c = exe.member(Some(USER_B), &device, port, "");
    assert!(!c.coordinator);
    let rest = [&a, &b, &owner2, &c];
    until_steered(&sender, port, &rest, r, Duration::from_secs(3));
}

/// A third user with no account.
const USER_C: u32 = 41_003;

#[test]
fn guests_found_the_group_again_when_its_user_is_gone() {
    let Some((exe, device, port, sender)) = setup() else { return };
    let owner = exe.member(None, &device, port, "");
    let a = exe.member(Some(USER_A), &device, port, "");
    let a2 = exe.member(Some(USER_A), &device, port, "");
    let b = exe.member(Some(USER_B), &device, port, "");
    // A second process of root's: it holds copies of every socket for the coordinator.
    let holder = exe.member(None, &device, port, "");
    let mut r = until_steered(&sender, port, &[&owner, &a, &a2, &b, &holder], 1, Duration::from_secs(3));
    // Root's only process ends: the group lives on in the guests' sockets, with nobody who
    // can coordinate it. The guests found it again, keeping their slots (the datagrams to
    // their QPNs reach them), and a process of a third user joins.
    drop(owner);
    drop(holder);
    let start = Instant::now();
    let c = joins_within(&exe, USER_C, &device, port, Duration::from_secs(15)).expect("a third user's process joins");
    println!("a third user's process joined {:?} after the group's user's last one ended", start.elapsed());
    r = until_steered(&sender, port, &[&a, &a2, &b, &c], r, Duration::from_secs(5));
    let got = round(&sender, port, &[&a, &a2, &b, &c], r, 50);
    for (p, g) in [&a, &a2, &b, &c].iter().zip(&got) {
        assert_eq!(*g, own(p, r, 50), "slot {}", p.slot);
    }
}

/// The group's user's last process ends while a guest is in the group, and another process
/// of that user comes at once (perftest's client trying again after its first try found no
/// server, the server another user's guest). The newcomer coordinates the group the guest
/// is in, and the guest's datagrams reach it from the moment the newcomer's join returns.
/// They went to the newcomer before, all of `ib_send_bw -c UD`'s run lost: its first round
/// steered its own slot alone, and the guest re-registered a few milliseconds later.
#[test]
fn a_user_coming_back_to_its_group_steers_the_guest_in_it_first() {
    let Some((exe, _, _, sender)) = setup() else { return };
    for delay in [0, 10, 20, 40] {
        let (device, port) = group("users");
        let owner = exe.member(None, &device, port, "");
        let guest = exe.member(Some(USER_A), &device, port, "");
        let r = until_steered(&sender, port, &[&owner, &guest], 1, Duration::from_secs(3));
        drop(owner);
        std::thread::sleep(Duration::from_millis(delay));
        let next = exe.member(None, &device, port, "");
        let got = round(&sender, port, &[&guest, &next], r, 20);
        println!("{delay} ms after: the newcomer (slot {}) joined in {:?}", next.slot, next.joined_in);
        for (p, g) in [&guest, &next].iter().zip(&got) {
            assert_eq!(*g, own(p, r, 20), "{delay} ms after: slot {} gets exactly its own at once", p.slot);
        }
    }
}

/// Whether a process of `uid` joins within `within`, trying again every 200 ms.
fn joins_within(exe: &Exe, uid: u32, device: &str, port: u16, within: Duration) -> Option<Proc> {
    let start = Instant::now();
    loop {
        let mut p = exe.start(Some(uid), &format!("member,{device},{port}"));
        let line = p.line();
        let f: Vec<&str> = line.split(' ').collect();
        if f[0] == "ready" {
            p.slot = f[1].parse().unwrap();
            return Some(p);
        }
        if start.elapsed() >= within {
            return None;
        }
        drop(p);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_stopped_guest_keeps_the_group_until_it_runs_again() {
    let Some((exe, device, port, sender)) = setup() else { return };
    let owner = exe.member(None, &device, port, "");
    let a = exe.member(Some(USER_A), &device, port, "");
    let b = exe.member(Some(USER_B), &device, port, "");
    let r = until_steered(&sender, port, &[&owner, &a, &b], 1, Duration::from_secs(3));
    // B cannot answer: founding the group again without it would leave its socket on the
    // port and the others with none, so the others leave the group as it is.
    stop(b.child.id());
    drop(owner);
    assert!(
        joins_within(&exe, USER_C, &device, port, Duration::from_secs(3)).is_none(),
        "joined beside a stopped guest"
    );
    let r = until_steered(&sender, port, &[&a], r, Duration::from_secs(1));
    resume(b.child.id());
    let c = joins_within(&exe, USER_C, &device, port, Duration::from_secs(10)).expect("joins once every guest runs");
    until_steered(&sender, port, &[&a, &b, &c], r, Duration::from_secs(5));
}

#[test]
fn a_coordinator_name_held_by_another_user_gets_no_sockets() {
    let Some((exe, device, port, _)) = setup() else { return };
    // User A takes root's coordinator name before root's first process comes.
    let squatter = exe.start(Some(USER_A), &format!("squat,softrdma.0.{device}.{port}"));
    assert_eq!(squatter.line(), "ready 0 0");
    let victim = exe.start(None, &format!("member,{device},{port}"));
    let line = victim.line();
    assert!(line.starts_with("join_err") && line.contains(&format!("user {USER_A}")), "{line}");
}

/// What a join costs a process of the port's user and a guest, one after another beside
/// one coordinator: `cargo test --release -p softrdma-udp --test users -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark: run with --ignored --nocapture (as root)"]
fn join_cost() {
    let Some((exe, device, port, _)) = setup() else { return };
    let _owner = exe.member(None, &device, port, "");
    let mut kept = Vec::new();
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..20 {
        let (uid, k) = if i % 2 == 0 { (None, 0) } else { (Some(USER_A), 1) };
        let p = exe.member(uid, &device, port, "");
        times[k].push(p.joined_in);
        kept.push(p);
    }
    for (name, mut t) in ["the port's user", "a guest (another user)"].into_iter().zip(times) {
        t.sort();
        println!(
            "join of {name:<24} median {:>6} us  min {:>6} us  max {:>6} us",
            t[t.len() / 2].as_micros(),
            t[0].as_micros(),
            t[t.len() - 1].as_micros()
        );
    }
}
