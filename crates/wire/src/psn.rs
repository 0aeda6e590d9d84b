//! 24-bit packet sequence numbers and their wrap-around arithmetic.
//!
//! PSNs live on a circle of 2^24 values. Two PSNs are compared by the sign of their 24-bit
//! difference, so "before" and "after" are only meaningful within half the circle (2^23),
//! which is why [`Psn`] does not implement `Ord`: the relation is not transitive around the
//! whole circle. This is the rule of IBA 9.7.2 and of rxe's `psn_compare`.

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// The largest PSN; the next one is 0.
    pub const MAX: Self = Self(Self::MODULUS - 1);
    /// Largest distance at which ordering is still defined (half the circle).
    pub const HALF: u32 = 1 << 23;

    /// Returns `None` when `value` does not fit in 24 bits.
    pub const fn new(value: u32) -> Option<Self> {
        if value < Self::MODULUS { Some(Self(value)) } else { None }
    }

    /// Keeps the low 24 bits of `value`.
    pub const fn from_u24_truncating(value: u32) -> Self {
        Self(value & Self::MAX.0)
    }

    /// The PSN as a number below 2^24.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` on the circle.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & Self::MAX.0)
    }

    /// `self - n` on the circle.
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & Self::MAX.0)
    }

    /// The PSN after this one.
    #[must_use]
    pub const fn next(self) -> Self {
        self.wrapping_add(1)
    }

    /// Signed distance from `self` to `other`: positive when `other` is after `self`.
    ///
    /// The result is in `-2^23 ..= 2^23 - 1`. Two PSNs exactly half the circle apart are
    /// each at distance `-2^23` from the other, so each counts as *after* the other: the
    /// same ambiguity as rxe's `(s32)((a - b) << 8)`, where each is "before" the other. A
    /// window never spans half the circle ([`PsnWindow::new`]), so the case never decides
    /// anything.
    pub const fn distance_to(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign-extends it.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// How `self` compares to `other` on the circle (`Less` = `self` comes first), from the
    /// sign of [`distance_to`](Self::distance_to); agrees with `is_before` and `is_after`.
    pub const fn compare(self, other: Psn) -> Ordering {
        let d = self.distance_to(other);
        if d > 0 {
            Ordering::Less
        } else if d < 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// `self` comes strictly before `other`.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }

    /// `self` comes strictly after `other` (including, ambiguously, exactly half the
    /// circle away; see [`distance_to`](Self::distance_to)).
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance_to(other) < 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A run of `len` consecutive PSNs starting at `start`, possibly wrapping past 2^24 − 1.
///
/// Used for the requester's window of unacknowledged PSNs and for the range of PSNs a READ
/// response occupies.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PsnWindow {
    start: Psn,
    len: u32,
}

impl PsnWindow {
    /// A window of `len` PSNs from `start`. Returns `None` if `len` exceeds half the circle,
    /// past which membership would be ambiguous.
    pub const fn new(start: Psn, len: u32) -> Option<Self> {
        if len <= Psn::HALF { Some(Self { start, len }) } else { None }
    }

    /// First PSN of the window.
    pub const fn start(self) -> Psn {
        self.start
    }

    /// Number of PSNs in the window.
    pub const fn len(self) -> u32 {
        self.len
    }

    /// Whether the window holds no PSN.
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The first PSN past the window.
    pub const fn end(self) -> Psn {
        self.start.wrapping_add(self.len)
    }

    /// Whether `psn` lies in `start .. start + len` on the circle.
    pub const fn contains(self, psn: Psn) -> bool {
        (psn.0.wrapping_sub(self.start.0) & Psn::MAX.0) < self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: u32) -> Psn {
        Psn::new(v).unwrap()
    }

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::MAX.next(), p(0));
        assert_eq!(p(0).wrapping_sub(1), Psn::MAX);
        assert_eq!(p(0xff_fffe).wrapping_add(5), p(3));
        assert_eq!(Psn::new(1 << 24), None);
    }

    #[test]
    fn compares_across_the_wrap() {
        assert!(Psn::MAX.is_before(p(0)));
        assert!(p(2).is_after(Psn::MAX));
        assert_eq!(Psn::MAX.distance_to(p(2)), 3);
        assert_eq!(p(2).distance_to(Psn::MAX), -3);
        assert_eq!(p(7).compare(p(7)), Ordering::Equal);
        assert_eq!(p(10).compare(p(11)), Ordering::Less);
        // Exactly half the circle away: each is after the other, and compare agrees.
        assert_eq!(p(0).distance_to(p(Psn::HALF)), -(Psn::HALF as i32));
        assert!(p(0).is_after(p(Psn::HALF)) && p(Psn::HALF).is_after(p(0)));
        assert_eq!(p(0).compare(p(Psn::HALF)), Ordering::Greater);
    }

    #[test]
    fn window_membership_wraps() {
        let w = PsnWindow::new(p(0xff_fffe), 4).unwrap();
        assert!(w.contains(p(0xff_fffe)));
        assert!(w.contains(Psn::MAX));
        assert!(w.contains(p(0)));
        assert!(w.contains(p(1)));
        assert!(!w.contains(p(2)));
        assert!(!w.contains(p(0xff_fffd)));
        assert_eq!(w.end(), p(2));
        assert!(PsnWindow::new(p(0), 0).unwrap().is_empty());
        assert!(PsnWindow::new(p(0), Psn::HALF + 1).is_none());
    }
}
