//! Seeds: where they come from, how a failure names the one that replays it, and running
//! many of them (TigerBeetle's VOPR discipline).
//!
//! - A test takes its seed from [`seed_from_env_or`], so that `SOFTRDMA_SEED=0x2a cargo
//!   test ...` replays any run.
//! - A test that panics while a [`Fabric`](crate::Fabric) is alive prints
//!   `reproduce with: SOFTRDMA_SEED=0x...` (the fabric does it when it is dropped during
//!   unwinding); [`SeedGuard`] does the same for code that outlives the fabric.
//! - [`swarm`] runs a test body over many seeds (`SOFTRDMA_SEEDS=N` of them), stops at the
//!   first failure and names its seed.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The environment variable holding the seed to replay, in hex (`0x2a`) or decimal.
pub const SEED_ENV: &str = "SOFTRDMA_SEED";

/// The environment variable holding how many seeds [`swarm`] runs.
pub const SEEDS_ENV: &str = "SOFTRDMA_SEEDS";

/// Reads a seed: `0x`-prefixed hex or decimal, `_` separators allowed.
pub fn parse_seed(text: &str) -> Option<u64> {
    let text: String = text.trim().chars().filter(|&c| c != '_').collect();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The seed in `SOFTRDMA_SEED` if it is set, `default` otherwise.
///
/// # Panics
/// If `SOFTRDMA_SEED` is set to something that is not a seed: silently running another seed
/// than the one asked for would waste a debugging session.
pub fn seed_from_env_or(default: u64) -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(text) => {
            parse_seed(&text).unwrap_or_else(|| panic!("{SEED_ENV}={text:?} is not a seed (0x-hex or decimal)"))
        }
        Err(_) => default,
    }
}

/// The line that tells how to replay `seed`: `reproduce with: SOFTRDMA_SEED=0x2a cargo test
/// -- <test> --exact`, naming the test when the current thread is a test harness thread.
pub fn reproduce_hint(seed: u64) -> String {
    let mut hint = format!("reproduce with: {SEED_ENV}={seed:#x} cargo test");
    if let Some(name) = std::thread::current().name().filter(|n| *n != "main") {
        hint.push_str(&format!(" -- {name} --exact"));
    }
    hint
}

/// Prints [`reproduce_hint`] to stderr if it is dropped while the thread panics.
///
/// ```
/// # use softrdma_sim::{SeedGuard, seed_from_env_or};
/// let seed = seed_from_env_or(0x2a);
/// let _guard = SeedGuard::new(seed);
/// // ... a check that may panic after the fabric is gone ...
/// ```
#[derive(Debug)]
#[must_use = "the guard prints the seed when it is dropped during a panic"]
pub struct SeedGuard {
    seed: u64,
}

impl SeedGuard {
    /// A guard for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        print_hint_if_panicking(self.seed);
    }
}

#[allow(clippy::print_stderr, reason = "a failing test's seed goes where the panic message goes")]
pub(crate) fn print_hint_if_panicking(seed: u64) {
    if std::thread::panicking() {
        eprintln!("{}", reproduce_hint(seed));
    }
}

/// The `index`-th seed of a swarm: SplitMix64 of `index`, so that neighbouring runs get
/// unrelated seeds while the list stays the same from one CI run to the next.
pub fn swarm_seed(index: u64) -> u64 {
    let mut z = index.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The first seed of a swarm that failed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SwarmFailure {
    /// Its position in the swarm (0-based).
    pub index: u64,
    /// The seed.
    pub seed: u64,
    /// What the test body returned, or the message it panicked with.
    pub message: String,
}

impl fmt::Display for SwarmFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {:#x} (run {}) failed: {}\n{}", self.seed, self.index, self.message, reproduce_hint(self.seed))
    }
}

impl std::error::Error for SwarmFailure {}

/// Runs `body` on each of `seeds` in order and stops at the first that returns an error or
/// panics. Returns how many seeds ran.
pub fn try_swarm(
    seeds: impl IntoIterator<Item = u64>,
    mut body: impl FnMut(u64) -> Result<(), String>,
) -> Result<u64, SwarmFailure> {
    let mut ran = 0;
    for (index, seed) in (0u64..).zip(seeds) {
        ran += 1;
        let message = match catch_unwind(AssertUnwindSafe(|| body(seed))) {
            Ok(Ok(())) => continue,
            Ok(Err(message)) => message,
            Err(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .map_or_else(|| "panicked".to_owned(), |m| format!("panicked: {m}")),
        };
        return Err(SwarmFailure { index, seed, message });
    }
    Ok(ran)
}

/// Runs `body` over many seeds: the one in `SOFTRDMA_SEED` if it is set (to replay a
/// failure), else `SOFTRDMA_SEEDS` seeds if that is set, else `default_count`; the seeds are
/// [`swarm_seed`]`(0..n)`. Returns how many ran.
///
/// # Panics
/// At the first seed that fails, with its seed and the line that replays it.
pub fn swarm(default_count: u64, body: impl FnMut(u64) -> Result<(), String>) -> u64 {
    let seeds: Vec<u64> = match std::env::var(SEED_ENV) {
        Ok(_) => vec![seed_from_env_or(0)],
        Err(_) => {
            let count = match std::env::var(SEEDS_ENV) {
                Ok(text) => parse_seed(&text).unwrap_or_else(|| panic!("{SEEDS_ENV}={text:?} is not a number")),
                Err(_) => default_count,
            };
            (0..count).map(swarm_seed).collect()
        }
    };
    match try_swarm(seeds, body) {
        Ok(ran) => ran,
        Err(failure) => panic!("{failure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_in_hex_and_decimal() {
        assert_eq!(parse_seed("0x2a"), Some(42));
        assert_eq!(parse_seed(" 0XFF_FF "), Some(0xffff));
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed("0xffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_seed("nope"), None);
        assert_eq!(parse_seed("0x"), None);
    }

    #[test]
    fn the_hint_names_the_seed_and_the_test() {
        let hint = reproduce_hint(0xbeef);
        assert!(hint.starts_with("reproduce with: SOFTRDMA_SEED=0xbeef cargo test"), "{hint}");
        // The test harness names each test's thread after the test (unless run on `main`).
        if let Some(name) = std::thread::current().name().filter(|n| *n != "main") {
            assert!(hint.ends_with(&format!("-- {name} --exact")), "{hint}");
        }
    }

    #[test]
    fn swarm_seeds_are_distinct_and_stable() {
        let seeds: std::collections::BTreeSet<u64> = (0..1000).map(swarm_seed).collect();
        assert_eq!(seeds.len(), 1000);
        assert_eq!(swarm_seed(0), 0xe220_a839_7b1d_cdaf, "SplitMix64's first output for state 0");
    }

    #[test]
    fn try_swarm_stops_at_the_first_failure_and_names_its_seed() {
        let mut seen = Vec::new();
        let failure = try_swarm([1, 2, 3, 4], |seed| {
            seen.push(seed);
            if seed == 3 { Err("checker: completion missing".into()) } else { Ok(()) }
        })
        .unwrap_err();
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!((failure.index, failure.seed), (2, 3));
        let text = failure.to_string();
        assert!(text.contains("seed 0x3 (run 2) failed: checker: completion missing"), "{text}");
        assert!(text.contains("reproduce with: SOFTRDMA_SEED=0x3"), "{text}");
        assert_eq!(try_swarm(0..10, |_| Ok(())), Ok(10));
    }

    #[test]
    fn try_swarm_turns_a_panic_into_a_failure() {
        let failure = try_swarm([7, 8], |seed| {
            assert_ne!(seed, 8, "boom");
            Ok(())
        })
        .unwrap_err();
        assert_eq!(failure.seed, 8);
        assert!(failure.message.starts_with("panicked: "), "{}", failure.message);
        assert!(failure.message.contains("boom"), "{}", failure.message);
    }
}
