//! A C program that polls its CQ and then waits in its own memory for the peer's WRITE,
//! calling no verb: the WRITE lands without the program's next poll. In a file of its own,
//! so that no other test of its binary runs beside it: what it checks is how soon the
//! waiting side's progress thread wakes, which a second core busy with another test's
//! threads delays.

mod common;

use common::*;
use softrdma::*;

/// The next completion of `s`'s CQ, busy-polled.
fn busy_next(s: &Side) -> Wc {
    let deadline = std::time::Instant::now() + WAIT;
    let mut wc = [EMPTY_WC];
    while s.cq.poll(&mut wc) == 0 {
        assert!(std::time::Instant::now() < deadline, "no completion in {WAIT:?}");
    }
    wc[0]
}

/// A C program may poll its CQ, then wait in its own memory for the peer's WRITE, calling
/// no verb (`ib_write_lat` polls its send CQ for its own WRITE's ACK, then spins on its
/// buffer). For `APP_POLL_WINDOW` after a poll the device's progress thread leaves the
/// inbox to the application, so the WRITE waited there until the thread's next look, 1 to
/// 2 ms; now its sender, polling for the WRITE's completion, rings the waiting side's bell
/// once the packet has stayed untaken (`same_host_nudges_sent`), and the progress thread
/// takes it (`same_host_nudges_taken`).
#[test]
#[allow(unsafe_code)] // The waiting side plays a C program: it reads its buffer by address.
fn a_write_to_an_application_waiting_in_its_memory_lands_without_its_next_poll() {
    const ROUNDS: u64 = 40;
    let (a, b) = rc_pair(4096);
    let target = b.mr.remote(0..8).unwrap();
    let word = b.mr.addr() as *const u64;
    let (go, went) = std::sync::mpsc::channel::<u64>();
    let waited = std::thread::scope(|s| {
        s.spawn(|| {
            // The requester: a WRITE of the round's number, then polls until it completes.
            for round in went {
                a.mr.write(0, &round.to_ne_bytes()).unwrap();
                let sge = [a.mr.sge(0..8).unwrap()];
                a.qp.post_send(&[wr(round, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)])
                    .unwrap();
                let wc = busy_next(&a);
                assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
            }
        });
        let mut waited = Vec::new();
        for round in 1..=ROUNDS {
            // The waiting side polls (nothing comes), then waits in its memory.
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
    });
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    // Nudged, a WRITE lands some 120-150 us after it was sent, in every round here;
    // without, mostly after the window, 1-4 ms (2 to 8 rounds of 40 came sooner, where the
    // progress thread's look fell so). A host with no CPU to spare delays the progress
    // thread's wake-up as much as the window's end (a third thread busy on the two cores:
    // 4 to 9 rounds of 40 within half the window); this binary runs no other test.
    let quick = waited.iter().filter(|&&w| w < APP_POLL_WINDOW / 2).count();
    assert!(
        quick >= waited.len() / 2,
        "only {quick} of {ROUNDS} WRITEs to memory waited on landed within half of APP_POLL_WINDOW \
         ({APP_POLL_WINDOW:?}): {waited:?}\n{ca:?}\n{cb:?}"
    );
    assert!(ca.same_host_nudges_sent > 0, "the requester rang no bell: {ca:?}");
    assert!(cb.same_host_nudges_taken > 0, "the waiting side's progress thread took nothing on a ring: {cb:?}");
}
