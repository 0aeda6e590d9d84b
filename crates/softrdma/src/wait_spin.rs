//! Spin, then block: how long a thread waiting on a completion channel polls before it
//! sleeps.
//!
//! A thread that sleeps in `poll(2)` is woken through the kernel: a FIFO or socket turns
//! readable, the scheduler runs the thread again. Between two processes of this host that
//! took 10–20 µs, against under 2 µs for an answer a polling thread sees; in a ping-pong
//! where both sides sleep, each wait holds two such wake-ups. So a wait on a completion
//! channel ([`crate::CompChannel::get_cq_event`], `ibv_get_cq_event`) first polls, doing the
//! device's receive work in its own thread as a polling application does, for a *window*,
//! and sleeps only after it.
//!
//! The window adapts as KVM's halt polling does (`halt_poll_ns`, whose numbers these are):
//!
//! - a wait the window covered leaves it as it is;
//! - a wait longer than the window but within the cap doubles it (from 10 µs, up to the
//!   cap): polling that long would have seen the event without the wake-up;
//! - a wait longer than the cap halves it, down to nothing: an application whose waits
//!   are long (an idle server, a client thinking between requests) soon sleeps at once and
//!   burns no CPU, and one long pause among short waits costs the polling little.
//!
//! An application that answers messages as they come (a ping-pong, a request-response
//! server under load) so finds its completions while still polling. The cap is
//! [`ContextOptions::wait_spin`](crate::ContextOptions::wait_spin), 200 µs by default (KVM's
//! default `halt_poll_ns`); `SOFTRDMA_WAIT_SPIN_US` ([`WAIT_SPIN_ENV`]) sets it for any
//! program, and `0` never polls (every wait sleeps at once, as before 2026-11-29).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `SOFTRDMA_WAIT_SPIN_US=N`: a thread waiting on a completion channel polls for at most
/// N µs before it sleeps (`0`: it sleeps at once). Replaces
/// [`ContextOptions::wait_spin`](crate::ContextOptions::wait_spin) for any program, C
/// programs included.
pub const WAIT_SPIN_ENV: &str = "SOFTRDMA_WAIT_SPIN_US";

/// The window's first size once a wait shows polling would pay (KVM's
/// `halt_poll_ns_grow_start`); a window halved below it is closed.
const START: Duration = Duration::from_micros(10);

/// One completion channel's polling window, learned from how long its waits lasted.
/// Shared by the threads that wait on the channel; each reads and updates it without a
/// lock (a lost update only delays the window's next change).
#[derive(Debug)]
pub(crate) struct WaitSpin {
    cap_ns: u64,
    window_ns: AtomicU64,
    /// When the last wait ended, in ns on the device's clock (0: none yet).
    ended_ns: AtomicU64,
}

impl WaitSpin {
    /// A channel whose waits poll for at most `cap` (zero: never). The window starts
    /// closed: the first waits sleep, and show whether polling would pay.
    pub(crate) fn new(cap: Duration) -> WaitSpin {
        WaitSpin { cap_ns: nanos(cap), window_ns: AtomicU64::new(0), ended_ns: AtomicU64::new(0) }
    }

    /// How long the next wait polls before it sleeps.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }

    /// A wait on the channel that polled for `window` lasted `waited` (until its event came,
    /// or it timed out).
    pub(crate) fn record(&self, waited: Duration, window: Duration) {
        if self.cap_ns == 0 {
            return;
        }
        let (waited, window) = (nanos(waited), nanos(window));
        let next = if waited > self.cap_ns {
            Some(window / 2).filter(|&w| w >= nanos(START)).unwrap_or(0)
        } else if waited > window {
            window.saturating_mul(2).max(nanos(START)).min(self.cap_ns)
        } else {
            return;
        };
        self.window_ns.store(next, Ordering::Relaxed);
    }

    /// A wait on the channel ended at `at` (ns on the device's clock).
    pub(crate) fn ended(&self, at: u64) {
        self.ended_ns.store(at.max(1), Ordering::Relaxed);
    }

    /// Whether a wait on the channel ended less than `within` before `now`: the application
    /// waits for this channel's events in `get_cq_event`, in a loop.
    pub(crate) fn waited_within(&self, now: u64, within: Duration) -> bool {
        let at = self.ended_ns.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) < nanos(within)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The cap for the waits of the channels a context makes: [`WAIT_SPIN_ENV`] if it is set
/// to a number of microseconds, else `option`.
pub(crate) fn cap(option: Duration) -> Duration {
    cap_from(std::env::var(WAIT_SPIN_ENV).ok().as_deref(), option)
}

fn cap_from(env: Option<&str>, option: Duration) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok()).map_or(option, Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(200);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Waits of the given lengths in µs, each polling for the window it found.
    fn after(s: &WaitSpin, waits: &[u64]) {
        for &w in waits {
            s.record(us(w), s.window());
        }
    }

    #[test]
    fn short_waits_open_the_window_from_10_us_doubling_until_one_is_covered() {
        let s = WaitSpin::new(CAP);
        assert_eq!(s.window(), Duration::ZERO, "the first wait sleeps");
        // A ping-pong where both sides sleep: each wait holds two wake-ups, ~45 µs.
        after(&s, &[45]);
        assert_eq!(s.window(), us(10));
        after(&s, &[45, 45]);
        assert_eq!(s.window(), us(40));
        after(&s, &[45]);
        assert_eq!(s.window(), us(80));
        // Now the wait polls and sees the answer in a few µs: the window stays.
        after(&s, &[3, 4, 3]);
        assert_eq!(s.window(), us(80));
    }

    #[test]
    fn the_window_never_passes_the_cap() {
        let s = WaitSpin::new(CAP);
        after(&s, &[190; 10]);
        assert_eq!(s.window(), CAP);
    }

    #[test]
    fn waits_longer_than_the_cap_halve_the_window_and_close_it() {
        let s = WaitSpin::new(CAP);
        after(&s, &[190; 10]);
        after(&s, &[1_000_000]);
        assert_eq!(s.window(), us(100), "one long pause halves it");
        // An idle application: a handful of long waits and it sleeps at once.
        after(&s, &[1_000_000; 4]);
        assert_eq!(s.window(), Duration::ZERO, "100 -> 50 -> 25 -> 12.5 -> closed");
        // Short waits open it again.
        after(&s, &[30]);
        assert_eq!(s.window(), us(10));
    }

    #[test]
    fn a_timed_out_wait_counts_as_long() {
        let s = WaitSpin::new(CAP);
        after(&s, &[30, 30]);
        s.record(Duration::from_millis(10), s.window());
        assert_eq!(s.window(), us(10));
    }

    #[test]
    fn a_channel_waited_on_lately_is_known_as_such() {
        let s = WaitSpin::new(CAP);
        assert!(!s.waited_within(5_000, Duration::from_millis(1)), "never waited on");
        s.ended(1_000_000);
        assert!(s.waited_within(1_500_000, Duration::from_millis(1)));
        assert!(!s.waited_within(2_000_000, Duration::from_millis(1)));
    }

    #[test]
    fn a_cap_of_zero_never_polls() {
        let s = WaitSpin::new(Duration::ZERO);
        after(&s, &[1, 5, 30]);
        assert_eq!(s.window(), Duration::ZERO);
    }

    #[test]
    fn the_environment_sets_the_cap_in_microseconds() {
        assert_eq!(cap_from(Some("0"), CAP), Duration::ZERO);
        assert_eq!(cap_from(Some("50"), CAP), us(50));
        assert_eq!(cap_from(Some("lots"), CAP), CAP, "not a number: the option stands");
        assert_eq!(cap_from(None, CAP), CAP);
    }
}
