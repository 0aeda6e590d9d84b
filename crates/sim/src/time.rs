//! Virtual time.
//!
//! The fabric owns the only clock there is: a count of nanoseconds since the simulation
//! started, advanced by the fabric from one event to the next and never by the wall clock.
//! Nodes receive it as `now` on every call.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// Virtual time: nanoseconds since the start of the simulation.
///
/// Arithmetic saturates: `Time::MAX + d` is `Time::MAX`, and `earlier - later` is zero. A
/// simulation that reaches `Time::MAX` (584 years) has a bug elsewhere.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The start of the simulation.
    pub const ZERO: Self = Self(0);
    /// Later than any event the fabric will schedule.
    pub const MAX: Self = Self(u64::MAX);

    /// `nanos` nanoseconds after the start.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// `micros` microseconds after the start (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }

    /// `millis` milliseconds after the start (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the start.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the start, as a [`Duration`] (what a capture file's timestamp holds).
    pub const fn since_start(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, saturating at [`Time::MAX`].
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, or `None` before the start.
    pub fn checked_sub(self, d: Duration) -> Option<Self> {
        self.0.checked_sub(duration_nanos(d)).map(Self)
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Seconds with nine decimals, `0.000012345s`: fixed width sorts and diffs well in traces.
impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Time::from_micros(5);
        assert_eq!(t.as_nanos(), 5_000);
        assert_eq!(t + Duration::from_nanos(7), Time::from_nanos(5_007));
        assert_eq!(Time::MAX + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::ZERO - t, Duration::ZERO);
        assert_eq!(t - Time::ZERO, Duration::from_micros(5));
        assert_eq!(t.checked_sub(Duration::from_micros(6)), None);
        assert_eq!(Time::ZERO + Duration::MAX, Time::MAX);
        let mut u = Time::ZERO;
        u += Duration::from_millis(2);
        assert_eq!(u, Time::from_millis(2));
        assert_eq!(u.since_start(), Duration::from_millis(2));
    }

    #[test]
    fn displays_seconds_with_nanoseconds() {
        assert_eq!(Time::from_nanos(12_345).to_string(), "0.000012345s");
        assert_eq!(format!("{:?}", Time::from_millis(1_500)), "1.500000000s");
    }
}
