//! Many users, one host: `softrdma perf` pairs of root and of two other users (the built
//! binary, copied where they can run it) at once on port 4791, RC and UD, while processes of
//! each user that hold the device come and go (killed at random), for 3 s. Every pair
//! finishes with its figures. Needs root (to start processes of other users); says SKIP otherwise.
#![allow(clippy::print_stdout)]

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Two users with no account: the kernel needs none.
const USER_A: u32 = 41_011;
const USER_B: u32 = 41_012;
const LIMIT: Duration = Duration::from_secs(120);

/// The built binary, copied into a directory every user can read.
struct Exe(PathBuf);

impl Exe {
    fn new() -> Exe {
        use std::os::unix::fs::PermissionsExt;
        // One directory per test: tests run at once, and each removes its own.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("softrdma-cli-users-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.join("softrdma");
        std::fs::copy(env!("CARGO_BIN_EXE_softrdma"), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        Exe(exe)
    }

    /// `softrdma ARGS` as `uid` (root for `None`), output piped; killed if the test ends
    /// first.
    fn spawn(&self, uid: Option<u32>, args: &[&str]) -> Running {
        let mut cmd = Command::new(&self.0);
        cmd.args(args)
            .current_dir("/")
            .env("HOME", "/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(uid) = uid {
            // As root, std drops the supplementary groups too.
            cmd.uid(uid).gid(uid);
        }
        // The copy was just written: a child that another test forked meanwhile holds the
        // written descriptor until its own exec, and an exec of the copy fails with ETXTBSY
        // until then (it did in CI). Wait for that moment to pass.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match cmd.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                spawned => return Running(spawned.unwrap()),
            }
        }
    }
}

/// A child killed by its PID and reaped if still running when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Drop for Exe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// Whether this test runs as root, which starting processes of other users needs (it
/// says SKIP otherwise).
fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        println!("SKIP: starting processes of other users needs root");
    }
    root
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port()
}

/// Waits for `child` (killing it past `LIMIT`), then returns its exit success and output.
fn finish(mut running: Running, what: &str) -> (bool, String) {
    let child = &mut running.0;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut out);
    let _ = child.stderr.take().unwrap().read_to_string(&mut out);
    println!("{what}: {status}");
    (status.success(), out)
}

/// The row of a perf client's table for `size`: its iterations and average bandwidth.
fn row(out: &str, size: &str) -> Option<(u64, f64)> {
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(size))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

/// The tests of this file one at a time: each counts whose sockets are on the port, and
/// the other's users would be among them.
static PORT: Mutex<()> = Mutex::new(());

#[test]
fn three_users_run_perf_pairs_at_once_while_others_come_and_go() {
    if !root() {
        return;
    }
    let _port = PORT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let exe = Exe::new();
    // Processes of each user that open the device and are killed at random.
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = [None, Some(USER_A), Some(USER_B)]
        .into_iter()
        .map(|uid| {
            let (exe, stop) = (Exe(exe.0.clone()), stop.clone());
            std::thread::spawn(move || {
                let mut runs = 0;
                let mut seed = u64::from(uid.unwrap_or(7)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let deadline = Instant::now() + LIMIT;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let c = exe.spawn(uid, &["perf", "write", "lat", "--loopback", "-n", "100000000"]);
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    std::thread::sleep(Duration::from_millis(100 + (seed >> 33) % 400));
                    drop(c); // killed (its loopback server ends with it)
                    runs += 1;
                }
                std::mem::forget(exe); // the directory is the test's to remove
                runs
            })
        })
        .collect();
    let (p1, p2, p3) = (free_port().to_string(), free_port().to_string(), free_port().to_string());
    // RC WRITE root → A, RC READ A → B, UD SEND B → root.
    let s1 = exe.spawn(None, &["perf", "write", "bw", "-p", &p1]);
    let s2 = exe.spawn(Some(USER_A), &["perf", "read", "bw", "-p", &p2]);
    let s3 = exe.spawn(Some(USER_B), &["perf", "send", "bw", "-c", "UD", "-p", &p3]);
    std::thread::sleep(Duration::from_millis(500));
    let c1 = exe.spawn(Some(USER_A), &["perf", "write", "bw", "127.0.0.1", "-p", &p1, "-D", "3", "-s", "16384"]);
    let c2 = exe.spawn(Some(USER_B), &["perf", "read", "bw", "127.0.0.1", "-p", &p2, "-D", "3", "-s", "16384"]);
    let c3 = exe.spawn(None, &["perf", "send", "bw", "-c", "UD", "127.0.0.1", "-p", &p3, "-D", "3", "-s", "1024"]);
    let results = [
        (finish(c1, "RC WRITE, client uid A to server root"), "16384"),
        (finish(c2, "RC READ, client uid B to server uid A"), "16384"),
        (finish(c3, "UD SEND, client root to server uid B"), "1024"),
    ];
    let servers = [finish(s1, "server root"), finish(s2, "server uid A"), finish(s3, "server uid B")];
    stop.store(true, Ordering::Relaxed);
    let runs: Vec<u32> = churn.into_iter().map(|h| h.join().unwrap()).collect();
    for ((ok, out), size) in &results {
        assert!(ok, "a client failed:\n{out}");
        let (n, bw) = row(out, size).unwrap_or_else(|| panic!("no row for {size} B:\n{out}"));
        assert!(n > 100, "{out}");
        assert!(bw > 0.0, "{out}");
        assert!(out.contains("Path: wire"), "processes of two users meet through the sockets:\n{out}");
    }
    for (ok, out) in &servers {
        assert!(ok, "a server failed:\n{out}");
    }
    assert!(runs.iter().all(|&r| r >= 1), "every user's processes came and went: {runs:?}");
    // Nothing of this test runs on (a killed run's loopback server, for one).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = running_from(&exe.0);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes of the test's binary run on: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes (not zombies) running the program at `exe`.
fn running_from(exe: &std::path::Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe))
        .collect()
}

/// The users of the unconnected UDP sockets on port 4791 (`/proc/net/udp` and `udp6`).
fn port_users() -> Vec<u32> {
    ["/proc/net/udp", "/proc/net/udp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
        })
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let connected = f.get(2)?.trim_start_matches('0') != ":0000";
            (f.get(1)?.ends_with(":12B7") && !connected).then(|| f.get(7)?.parse().ok())?
        })
        .collect()
}

#[test]
fn softrdma_host_holds_the_port_for_every_user() {
    use std::io::{BufRead, BufReader};
    if !root() {
        return;
    }
    let _port = PORT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let exe = Exe::new();
    let mut host = exe.spawn(None, &["host", "-d", "lo", "--for", "60"]);
    let mut lines = BufReader::new(host.0.stdout.take().unwrap()).lines();
    let line = lines.next().expect("a line").unwrap();
    assert!(line.contains("softrdma_lo") && line.contains("held for every user as user 0"), "{line}");
    // Two other users' processes run a pair: both are root's guests, so the port's sockets
    // are all root's (the group is root's, and neither user holds the other's).
    let port = free_port().to_string();
    let server = exe.spawn(Some(USER_A), &["perf", "write", "bw", "-p", &port]);
    std::thread::sleep(Duration::from_millis(500));
    // For a second, not a count: 20 000 WRITEs of 4 KiB can end within one look at the
    // port's sockets, before the guests' sockets are all there.
    let mut client =
        exe.spawn(Some(USER_B), &["perf", "write", "bw", "127.0.0.1", "-p", &port, "-D", "1", "-s", "4096"]);
    // The port's sockets while all three run: the most seen.
    let mut users = Vec::new();
    while client.0.try_wait().unwrap().is_none() {
        let now = port_users();
        if now.len() > users.len() {
            users = now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, out) = finish(client, "RC WRITE, client uid B to server uid A, beside softrdma host");
    let (served, _) = finish(server, "server uid A");
    assert!(ok && served, "{out}");
    assert!(row(&out, "4096").is_some_and(|(n, _)| n > 0), "{out}");
    assert!(
        users.len() >= 6 && users.iter().all(|&u| u == 0),
        "root's host process owns every socket on the port: {users:?}"
    );
    drop(host);
}
