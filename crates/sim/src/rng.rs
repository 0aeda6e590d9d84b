//! The one source of randomness: ChaCha8 streams derived from the simulation's seed.
//!
//! Every random decision the fabric makes comes from a [`SimRng`] built from the seed. The
//! fabric gives the link (jitter) and each fault rule a stream of its own, so that adding a
//! rule does not change which packets an existing rule hits: a failing seed stays a failing
//! seed while you add a rule that only observes.

use core::convert::Infallible;
use core::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng, TryRng};

use crate::time::duration_nanos;

/// A seeded, reproducible random number generator (ChaCha8).
///
/// Implements [`rand_core::TryRng`] (and so [`rand_core::Rng`]), for code that wants rand's
/// distributions; the helpers here cover what fault rules need.
#[derive(Clone, Debug)]
pub struct SimRng {
    inner: ChaCha8Rng,
}

impl SimRng {
    /// Stream 0 of `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_stream(seed, 0)
    }

    /// Stream `stream` of `seed`: 2^64 independent streams per seed.
    pub fn with_stream(seed: u64, stream: u64) -> Self {
        let mut inner = ChaCha8Rng::seed_from_u64(seed);
        inner.set_stream(stream);
        Self { inner }
    }

    /// A uniformly random `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A uniformly random float in `[0, 1)`, from the top 53 bits of one `u64`.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `true` with probability `p` (clamped to `[0, 1]`). Always draws one `u64`, so that the
    /// stream advances the same way whatever `p` is.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit_f64() < p
    }

    /// A uniformly random integer in `0..n`; `0` when `n` is 0. Unbiased (Lemire's
    /// multiply-and-reject).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniformly random float in `[lo, hi)`.
    pub fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit_f64()
    }

    /// A uniformly random duration in `[0, max]`, at nanosecond resolution.
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        let max = duration_nanos(max);
        Duration::from_nanos(if max == u64::MAX { self.next_u64() } else { self.below(max + 1) })
    }

    /// A new generator seeded from this one, for a part of a test that should have its own
    /// stream (a workload generator, say).
    pub fn fork(&mut self) -> Self {
        Self::new(self.next_u64())
    }
}

impl TryRng for SimRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.inner.try_next_u32()
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.inner.try_next_u64()
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.inner.try_fill_bytes(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = SimRng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = SimRng::new(7);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        let mut other = SimRng::with_stream(7, 1);
        assert_ne!(a[0], other.next_u64());
        assert_ne!(a[0], SimRng::new(8).next_u64());
    }

    #[test]
    fn helpers_stay_in_range() {
        let mut r = SimRng::new(1);
        for n in [1u64, 2, 3, 7, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
        for _ in 0..1000 {
            let u = r.unit_f64();
            assert!((0.0..1.0).contains(&u));
            assert!(r.duration_up_to(Duration::from_nanos(10)) <= Duration::from_nanos(10));
        }
        assert_eq!(r.duration_up_to(Duration::ZERO), Duration::ZERO);
        assert!(!r.chance(0.0));
        assert!(r.chance(1.0));
    }

    #[test]
    fn chance_is_close_to_its_probability() {
        let mut r = SimRng::new(3);
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((24_000..26_000).contains(&hits), "{hits}");
    }
}
