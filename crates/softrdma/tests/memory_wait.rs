//! A C program that polls its CQ and then waits in its own memory for the peer's WRITE,
//! calling no verb: the WRITE lands without the program's next poll, through the same-host
//! path and over the sockets. In a file of its own, its tests one at a time, so that
//! nothing runs beside them: what they check is how soon the waiting side's progress thread
//! wakes, which a second core busy with another test's threads delays.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::*;
use softrdma::*;

/// Held by each test: they run one at a time.
static ALONE: Mutex<()> = Mutex::new(());

const ROUNDS: u64 = 40;

/// [`ROUNDS`] rounds of: `b` polls its CQ (nothing comes), then waits in its memory, reading
/// its buffer by address as a C program does, for the WRITE that `a` then posts, polling
/// for its completion. Returns how long each WRITE took to land.
#[allow(unsafe_code)] // The waiting side plays a C program: it reads its buffer by address.
fn rounds(a: &Side, b: &Side) -> Vec<Duration> {
    let target = b.mr.remote(0..8).unwrap();
    let word = b.mr.addr() as *const u64;
    let (go, went) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The requester: a WRITE of the round's number, then polls until it completes.
            for round in went {
                a.mr.write(0, &round.to_ne_bytes()).unwrap();
                let sge = [a.mr.sge(0..8).unwrap()];
                a.qp.post_send(&[wr(round, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)])
                    .unwrap();
                let wc = busy_next(a);
                assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
            }
        });
        let mut waited = Vec::new();
        for round in 1..=ROUNDS {
            let mut wc = [EMPTY_WC];
            assert_eq!(b.cq.poll(&mut wc), 0);
            let start = std::time::Instant::now();
            go.send(round).unwrap();
            // SAFETY: `word` is the first 8 bytes of `b.mr`, which outlives the loop; the
            // device writes them when the WRITE lands, and a volatile read sees that, as a
            // C program's spin on its buffer does.
            while unsafe { std::ptr::read_volatile(word) } != round {
                assert!(start.elapsed() < WAIT, "round {round}: the WRITE did not land in {WAIT:?}");
                std::hint::spin_loop();
            }
            waited.push(start.elapsed());
        }
        drop(go);
        waited
    })
}

/// Runs [`rounds`] until at least half of a batch's WRITEs landed within half of the
/// window the progress thread leaves to a polling application, which they all waited for
/// before, up to three batches (a host that took the CPUs away for a while delays the
/// progress thread's wake-up as much as the window's end: with a third thread busy on the
/// two cores, 4 to 9 rounds of 40 came so). Returns the quick batch.
fn quick_batch(a: &Side, b: &Side) -> Vec<Duration> {
    let mut batches = Vec::new();
    for _ in 0..3 {
        let waited = rounds(a, b);
        let quick = waited.iter().filter(|&&w| w < APP_POLL_WINDOW / 2).count();
        if quick >= waited.len() / 2 {
            return waited;
        }
        batches.push((quick, waited));
    }
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    panic!(
        "in three batches of {ROUNDS}, only {:?} WRITEs to memory waited on landed within half of \
         APP_POLL_WINDOW ({APP_POLL_WINDOW:?}): {batches:?}\n{ca:?}\n{cb:?}",
        batches.iter().map(|b| b.0).collect::<Vec<_>>()
    );
}

/// For `APP_POLL_WINDOW` after a poll the device's progress thread leaves the inbox to the
/// application, so the WRITE waited there until the thread's next look, 1 to 2 ms; now its
/// sender, polling for the WRITE's completion, rings the waiting side's bell once the
/// packet has stayed untaken (`same_host_nudges_sent`), and the progress thread takes it
/// (`same_host_nudges_taken`). Nudged, a WRITE lands in 120-150 us, in every round here;
/// without, 2 to 8 rounds of 40 came within half the window (where the progress thread's
/// look fell so).
#[test]
fn a_write_to_an_application_waiting_in_its_memory_lands_without_its_next_poll() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (a, b) = rc_pair(4096);
    quick_batch(&a, &b);
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert!(ca.same_host_nudges_sent > 0, "the requester rang no bell: {ca:?}");
    assert!(cb.same_host_nudges_taken > 0, "the waiting side's progress thread took nothing on a ring: {cb:?}");
}

/// Over the sockets no sender can ring: the waiting side's progress thread watches them
/// while its application polls, and takes a readable one that the application does not
/// poll for within a few microseconds (`SocketGuard` in the driver,
/// `sockets_left_by_app`). Without the watch, 1 to 5 rounds of 40 came within half the
/// window.
#[test]
fn a_write_over_the_sockets_to_an_application_waiting_in_its_memory_lands_without_its_next_poll() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let off = ContextOptions { same_host: false, ..ContextOptions::default() };
    let (a, b) = pair_with(QpType::Rc, 4096, [off.clone(), off]);
    quick_batch(&a, &b);
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.same_host_sent, cb.same_host_sent), (0, 0), "the sockets alone");
    assert!(
        cb.sockets_left_by_app > 0,
        "the waiting side's progress thread took no socket its application left: {cb:?}"
    );
}

/// The progress threads run in the shortest slices the kernel takes (`sched_setattr`,
/// Linux 6.12 and later), so that one woken while the applications' threads spin on every
/// core (both sides waiting in their memory) runs after 0.1 ms of theirs, not the default
/// 1.4 ms (`crate::slice`; the round trips: `cargo bench -p softrdma --bench loopback`).
#[test]
fn progress_threads_ask_for_short_scheduler_slices() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let version: Vec<u32> =
        release.split(|c: char| !c.is_ascii_digit()).take(2).filter_map(|p| p.parse().ok()).collect();
    if version.len() < 2 || (version[0], version[1]) < (6, 12) {
        eprintln!("SKIP: kernel {} takes no slice of a thread's own (Linux 6.12 and later do)", release.trim());
        return;
    }
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ctx = open([127, 0, 0, 1], test_port());
    let slices = || -> Vec<(String, Option<u64>)> {
        let mut found = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() != "softrdma-lo" {
                continue;
            }
            let sched = std::fs::read_to_string(task.path().join("sched")).unwrap_or_default();
            let slice = sched
                .lines()
                .find(|l| l.starts_with("se.slice"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse().ok());
            found.push((task.file_name().to_string_lossy().into_owned(), slice));
        }
        found
    };
    // The thread sets its own slice as it starts: give it a moment.
    let all_short =
        |found: &[(String, Option<u64>)]| !found.is_empty() && found.iter().all(|(_, s)| *s == Some(100_000));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut found = slices();
    while !all_short(&found) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        found = slices();
    }
    assert!(!found.is_empty(), "no progress thread (softrdma-lo) in /proc/self/task");
    assert!(found.iter().all(|(_, s)| *s == Some(100_000)), "se.slice (ns) of each progress thread: {found:?}");
}
