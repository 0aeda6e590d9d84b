//! Time as sans-IO code sees it: a number the caller passes in.
//!
//! Nothing in softrdma's protocol crates reads a clock. Every input carries `now`, an
//! [`Instant`], and the code answers with the next instant it wants to be called back. The
//! simulator (`softrdma-sim`, whose `Time` this is) drives it with virtual time, the
//! runtime with a monotonic clock. One type for both, so that no adapter converts.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in time: nanoseconds since an epoch the caller chooses (the start of a
/// simulation, or of a process's monotonic clock).
///
/// Arithmetic saturates: `Instant::MAX + d` is `Instant::MAX`, and `earlier - later` is
/// zero. A clock that reaches `Instant::MAX` (584 years) has a bug elsewhere.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self(0);
    /// Later than any instant a clock will reach.
    pub const MAX: Self = Self(u64::MAX);

    /// `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// `micros` microseconds after the epoch (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }

    /// `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// The earlier of two deadlines, where `None` is none at all (not the earliest, as
    /// `Option`'s own order would have it).
    pub fn earliest(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the epoch, as a [`Duration`] (what a capture file's timestamp holds).
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, or `None` before the epoch.
    pub fn checked_sub(self, d: Duration) -> Option<Self> {
        self.0.checked_sub(duration_nanos(d)).map(Self)
    }

    /// Instant from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Seconds with nine decimals, `0.000012345s`: fixed width sorts and diffs well in traces.
impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_micros(5);
        assert_eq!(t.as_nanos(), 5_000);
        assert_eq!(t + Duration::from_nanos(7), Instant::from_nanos(5_007));
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_micros(5));
        assert_eq!(t.checked_sub(Duration::from_micros(6)), None);
        assert_eq!(Instant::ZERO + Duration::MAX, Instant::MAX);
        let mut u = Instant::ZERO;
        u += Duration::from_millis(2);
        assert_eq!(u, Instant::from_millis(2));
        assert_eq!(u.since_epoch(), Duration::from_millis(2));
    }

    #[test]
    fn displays_seconds_with_nanoseconds() {
        assert_eq!(Instant::from_nanos(12_345).to_string(), "0.000012345s");
        assert_eq!(format!("{:?}", Instant::from_millis(1_500)), "1.500000000s");
    }
}
