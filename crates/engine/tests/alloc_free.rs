//! Steady state allocates nothing: after a warm-up, thousands of WRITE and SEND packets
//! through an engine pair (posting, building, ICRC, parsing, checks, ACKs, completions)
//! make no heap allocation. A counting global allocator watches.

#![allow(unsafe_code)] // A global allocator cannot be written without it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use softrdma_engine::*;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Size of the latest allocation, to name the culprit when the test fails.
static LAST_SIZE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Only the test's own thread counts: the test harness's threads allocate whenever
    /// they like (a loaded CI machine made this test flaky before).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    // `try_with`: thread-local storage may be gone while a thread exits.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LAST_SIZE.store(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller upholds GlobalAlloc::alloc's contract, which System shares.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from System, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as for alloc and dealloc: the pointer and layout are System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Moves packets both ways until both engines are quiet; no logging, no filter.
fn pump(pair: &mut Pair, buf: &mut [u8]) {
    loop {
        let mut moved = false;
        while let Some(t) = pair.a.engine.poll_transmit(pair.now, &mut pair.a.mem, buf) {
            pair.b.engine.handle_datagram(pair.now, &t.envelope, &buf[..t.len], &mut pair.b.mem);
            moved = true;
        }
        while let Some(t) = pair.b.engine.poll_transmit(pair.now, &mut pair.b.mem, buf) {
            pair.a.engine.handle_datagram(pair.now, &t.envelope, &buf[..t.len], &mut pair.a.mem);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn round(pair: &mut Pair, buf: &mut [u8], sges: &[Sge; 2], rsge: &[Sge; 1]) {
    let rkey = pair.b.mr.rkey;
    let remote = pair.b.addr_of(0x8_0000);
    for i in 0..16u64 {
        pair.b.engine.post_recv(pair.b.qp, &[RecvWr { wr_id: i, sg_list: rsge }]).unwrap();
        let wrs = [
            SendWr {
                wr_id: i,
                op: SendOp::RdmaWrite { remote_addr: remote, rkey },
                sg_list: &sges[..1],
                flags: SendFlags(0),
                ud: None,
                xrc_srqn: None,
            },
            SendWr {
                wr_id: i,
                op: SendOp::Send,
                sg_list: &sges[1..],
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: None,
            },
        ];
        pair.a.engine.post_send(pair.a.qp, &wrs, &pair.a.mem).unwrap();
        pump(pair, buf);
        while pair.a.engine.poll_cq(pair.a.cq).is_some() {}
        while pair.b.engine.poll_cq(pair.b.cq).is_some() {}
    }
}

#[test]
fn steady_state_makes_no_heap_allocation() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu4096);
    let mut buf = vec![0u8; 4200];
    let sges = [pair.a.sge(0, 4096 * 3), pair.a.sge(0x10000, 64)];
    let rsge = [pair.b.sge(0x20000, 64)];
    // Warm-up: queues reach their working size and the 64-slot receive ring goes round once
    // (16 receives a round), so every slot holds a pooled gather list.
    for _ in 0..5 {
        round(&mut pair, &mut buf, &sges, &rsge);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    for _ in 0..50 {
        round(&mut pair, &mut buf, &sges, &rsge);
    }
    COUNTING.with(|c| c.set(false));
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let last = LAST_SIZE.load(Ordering::Relaxed);
    assert_eq!(during, 0, "{during} allocations (the last of {last} bytes) for 800 WRITEs of 3 packets and 800 SENDs");
    assert!(pair.a.engine.counters().sent_packets >= 50 * 16 * 4);
}
