//! The progress thread's scheduler slice.
//!
//! A NIC places a WRITE in memory while every core spins in the application; softrdma's
//! progress thread needs a core for it. Where the application's threads spin on every core
//! (a program that waits for its peer's WRITE by reading its own memory, on both sides of
//! a two-core machine), the woken progress thread waited for the spinners' slices: Linux's
//! EEVDF scheduler lets a waking thread preempt a running one only if its own slice is
//! shorter, and every thread had the default (1.4 ms on this 2-core VM). A round trip of
//! such a ping-pong took 6.8–8.0 ms at the median; with this thread's slice at the
//! shortest the kernel takes, 0.1 ms, 1.1 ms, and 29–56 µs with the driver's other change
//! for such a host too (no spin after work while the cores are wanted,
//! `NO_SPIN_AFTER_CONTENTION`): `cargo bench -p softrdma --bench loopback --
//! --memory-wait-only`, and `docs/architecture.md`, "Who makes progress".
//!
//! A thread may set its own slice without privilege (`sched_setattr`, `sched_runtime`,
//! Linux 6.12 and later; earlier kernels take the call and ignore the value). The thread's
//! policy and nice value are read first and kept: only the slice changes.

use std::io;
use std::time::Duration;

/// The slice the progress thread asks for: the shortest the kernel takes.
pub(crate) const PROGRESS_SLICE: Duration = Duration::from_micros(100);

/// `struct sched_attr` (`<linux/sched/types.h>`), its first version's 56 bytes and the
/// utilization clamps after them.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// `SCHED_OTHER` and `SCHED_BATCH`: the fair policies, whose slice `sched_runtime` sets.
const FAIR_POLICIES: [u32; 2] = [0, 3];

/// Asks the kernel to run the calling thread in slices of `slice`, keeping its policy and
/// nice value. A thread of a real-time or idle policy is left as it is.
pub(crate) fn set_own_slice(slice: Duration) -> io::Result<()> {
    let size = size_of::<SchedAttr>() as u32;
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a writable `struct sched_attr` of `size` bytes, which the kernel
    // fills up to that size; pid 0 is the calling thread.
    #[allow(unsafe_code)]
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) };
    if got != 0 {
        return Err(io::Error::last_os_error());
    }
    if !FAIR_POLICIES.contains(&attr.policy) {
        return Ok(());
    }
    attr.size = size;
    attr.flags = 0;
    attr.runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: `attr` is a valid `struct sched_attr` of `size` bytes, read by the kernel;
    // pid 0 is the calling thread.
    #[allow(unsafe_code)]
    let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
