//! Fault specifications in words: what `SOFTRDMA_FAULTS` holds, parsed into the same
//! [`Rule`]s the simulator's fabric runs.
//!
//! A specification is a list of rules separated by `;` (or new lines), each a kind of fault
//! and its parameters, then optionally where it applies, and an optional `seed`:
//!
//! ```text
//! loss 5%; reorder 10% 200us; seed 0x2a
//! duplicate 1%; corrupt 0.1%
//! delay 2ms jitter 500us
//! rate 100mbit queue 5ms
//! partition every 2s for 300ms
//! loss 50% op read,ack qp 0x2001 from 10.0.0.2
//! ```
//!
//! | rule | what it does |
//! |---|---|
//! | `loss P` | drops each datagram with probability `P` ([`Loss`]) |
//! | `duplicate P` (`dup`) | delivers it twice ([`Duplicate`]) |
//! | `reorder P [D]` | holds it back by up to `D` (default 1 ms), so later ones overtake it ([`Reorder`]) |
//! | `corrupt P` | flips bits of one byte ([`Corrupt`]) |
//! | `delay D [jitter J]` | holds every datagram back by `D` plus up to `J` ([`Delay`]) |
//! | `rate R [queue D]` | a bottleneck of `R` (`10mbit`, `1gbit`) whose queue holds `D` (default 10 ms); the rest is dropped ([`RateLimit`]) |
//! | `partition every T for D` | the link goes down for `D` at the end of every `T` ([`Flap`]) |
//!
//! Probabilities are written `5%` or `0.05`; durations `500ns`, `200us`, `3ms`, `2s`. Each
//! rule may end with where it applies, any of: `from ADDR[,ADDR..]` (source address),
//! `to ADDR[,..]`, `qp QPN[,..]` (destination QP, `0x2001` or `8193`) and `op
//! CLASS[,..]` (`send`, `write`, `read`, `atomic`, `ack`, `flush`, `cnp`, `cm`: see
//! [`OpClass`]).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use softrdma_wire::Qpn;

use crate::fault::{Chain, Corrupt, Delay, Duplicate, Flap, Loss, OpClass, RateLimit, Reorder, Rule, RuleExt, Scope};

/// Default longest hold-back of `reorder P` without a duration.
pub const DEFAULT_REORDER_DELAY: Duration = Duration::from_millis(1);
/// Default queue of `rate R` without `queue D`.
pub const DEFAULT_RATE_QUEUE: Duration = Duration::from_millis(10);

/// One kind of fault and its parameters.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum FaultKind {
    /// `loss P`.
    Loss(f64),
    /// `duplicate P`.
    Duplicate(f64),
    /// `reorder P D`.
    Reorder(f64, Duration),
    /// `corrupt P`.
    Corrupt(f64),
    /// `delay D jitter J`.
    Delay(Duration, Duration),
    /// `rate R queue D`, in bits per second.
    Rate(u64, Duration),
    /// `partition every T for D`.
    Partition(Duration, Duration),
}

/// One rule of a [`FaultSpec`]: a kind of fault where it applies.
#[derive(Clone, PartialEq, Debug)]
pub struct FaultRule {
    /// What it does.
    pub kind: FaultKind,
    /// Which datagrams it applies to.
    pub scope: Scope,
}

impl FaultRule {
    /// The rule the simulator runs for it.
    pub fn rule(&self) -> Box<dyn Rule + Send> {
        let scope = self.scope.clone();
        match self.kind {
            FaultKind::Loss(p) => Box::new(Loss::new(p).scoped(scope)),
            FaultKind::Duplicate(p) => Box::new(Duplicate::new(p).scoped(scope)),
            FaultKind::Reorder(p, d) => Box::new(Reorder::new(p, d).scoped(scope)),
            FaultKind::Corrupt(p) => Box::new(Corrupt::new(p).scoped(scope)),
            FaultKind::Delay(d, j) => Box::new(Delay::new(d, j).scoped(scope)),
            FaultKind::Rate(bits, queue) => Box::new(RateLimit::new(bits, queue).scoped(scope)),
            FaultKind::Partition(period, down) => Box::new(Flap::new(period, down).scoped(scope)),
        }
    }
}

/// A parsed fault specification (the [module](self) documentation has the syntax). Its
/// [`Display`](fmt::Display) writes it back in canonical form, which parses to the same.
///
/// ```
/// # use softrdma_sim::FaultSpec;
/// let spec: FaultSpec = "loss 5%; reorder 10% 200us op write; seed 42".parse().unwrap();
/// assert_eq!(spec.seed(), Some(42));
/// assert_eq!(spec.to_string(), "loss 5%; reorder 10% 200us op write; seed 0x2a");
/// assert!("loss 5".parse::<FaultSpec>().unwrap_err().contains("loss 5%"));
/// ```
#[derive(Clone, PartialEq, Debug, Default)]
pub struct FaultSpec {
    rules: Vec<FaultRule>,
    seed: Option<u64>,
}

impl FaultSpec {
    /// A specification of `rules`, with no seed.
    pub fn new(rules: Vec<FaultRule>) -> Self {
        Self { rules, seed: None }
    }

    /// The seed it names, if any.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// The same with `seed`.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Its rules, in order.
    pub fn rules(&self) -> &[FaultRule] {
        &self.rules
    }

    /// Whether it has no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The chain of its rules, drawing from `seed` (rule `n` from stream `n + 1`, as in the
    /// [`Fabric`](crate::Fabric)).
    pub fn chain(&self, seed: u64) -> Chain<dyn Rule + Send> {
        let mut chain = Chain::new(seed, 1);
        for r in &self.rules {
            chain.push(r.rule());
        }
        chain
    }
}

const EXAMPLE: &str = "loss 5%; reorder 10% 200us; seed 42";

impl FromStr for FaultSpec {
    type Err = String;

    /// Parses a specification; the error names the rule, the word and what was expected.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut spec = FaultSpec::default();
        for rule in text.split([';', '\n']).map(str::trim).filter(|r| !r.is_empty()) {
            let words: Vec<&str> = rule.split_whitespace().collect();
            let fail = |e: String| format!("fault rule {rule:?}: {e} (a specification looks like {EXAMPLE:?})");
            if words[0].eq_ignore_ascii_case("seed") {
                let [_, n] = words[..] else { return Err(fail("`seed` takes one number".into())) };
                spec.seed = Some(parse_u64(n).map_err(fail)?);
                continue;
            }
            spec.rules.push(parse_rule(&words).map_err(fail)?);
        }
        Ok(spec)
    }
}

fn parse_rule(words: &[&str]) -> Result<FaultRule, String> {
    let mut w = Words { words, at: 1 };
    let kind = match words[0].to_ascii_lowercase().as_str() {
        "loss" => FaultKind::Loss(w.probability("loss 5%")?),
        "duplicate" | "dup" => FaultKind::Duplicate(w.probability("duplicate 1%")?),
        "corrupt" => FaultKind::Corrupt(w.probability("corrupt 0.1%")?),
        "reorder" => {
            let p = w.probability("reorder 10% 200us")?;
            FaultKind::Reorder(p, w.optional_duration()?.unwrap_or(DEFAULT_REORDER_DELAY))
        }
        "delay" => {
            let d = w.duration("delay 2ms jitter 500us")?;
            let jitter = if w.keyword("jitter") { w.duration("delay 2ms jitter 500us")? } else { Duration::ZERO };
            FaultKind::Delay(d, jitter)
        }
        "rate" => {
            let bits = parse_rate(w.next("rate 100mbit queue 5ms")?)?;
            let queue = if w.keyword("queue") { w.duration("rate 100mbit queue 5ms")? } else { DEFAULT_RATE_QUEUE };
            FaultKind::Rate(bits, queue)
        }
        "partition" => {
            let example = "partition every 2s for 300ms";
            if !w.keyword("every") {
                return Err(format!("expected `every`, as in {example:?}"));
            }
            let period = w.duration(example)?;
            if !w.keyword("for") {
                return Err(format!("expected `for` after the period, as in {example:?}"));
            }
            let down = w.duration(example)?;
            if down.is_zero() || down > period || period.is_zero() {
                return Err(format!("the link must be down for more than 0 and at most the period, as in {example:?}"));
            }
            FaultKind::Partition(period, down)
        }
        other => {
            return Err(format!(
                "unknown fault {other:?}: one of loss, duplicate, reorder, corrupt, delay, rate, partition, seed"
            ));
        }
    };
    let mut scope = Scope::all();
    while let Some(word) = w.words.get(w.at) {
        w.at += 1;
        let list = w.next("qp 0x2001,0x2002")?;
        let items = list.split(',').filter(|x| !x.is_empty());
        scope = match word.to_ascii_lowercase().as_str() {
            "from" | "to" => {
                let addrs = items
                    .map(|a| a.parse::<IpAddr>().map_err(|_| format!("{a:?} is not an IP address")))
                    .collect::<Result<Vec<_>, _>>()?;
                if word.eq_ignore_ascii_case("from") { scope.src(addrs) } else { scope.dst(addrs) }
            }
            "qp" => {
                let qps = items
                    .map(|q| {
                        parse_u64(q)
                            .ok()
                            .and_then(|n| u32::try_from(n).ok())
                            .and_then(Qpn::new)
                            .ok_or_else(|| format!("{q:?} is not a QP number (24 bits: 0x2001, 8193)"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                scope.qp(qps)
            }
            "op" => scope.class(items.map(str::parse::<OpClass>).collect::<Result<Vec<_>, _>>()?),
            other => {
                return Err(format!(
                    "unexpected {other:?}: after the fault's parameters come `from`, `to`, `qp` or `op` and a list"
                ));
            }
        };
    }
    Ok(FaultRule { kind, scope })
}

/// The words of one rule, read from the second.
struct Words<'a> {
    words: &'a [&'a str],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self, example: &str) -> Result<&'a str, String> {
        let word = self.words.get(self.at).ok_or_else(|| format!("missing a value, as in {example:?}"))?;
        self.at += 1;
        Ok(word)
    }

    fn keyword(&mut self, keyword: &str) -> bool {
        let found = self.words.get(self.at).is_some_and(|w| w.eq_ignore_ascii_case(keyword));
        self.at += usize::from(found);
        found
    }

    fn probability(&mut self, example: &str) -> Result<f64, String> {
        let word = self.next(example)?;
        let bad = || format!("{word:?} is not a probability: write it as in {example:?} (or 0.05)");
        let p = match word.strip_suffix('%') {
            Some(percent) => percent.parse::<f64>().map_err(|_| bad())? / 100.0,
            None => word.parse::<f64>().map_err(|_| bad())?,
        };
        if word.strip_suffix('%').is_none() && p > 1.0 {
            return Err(bad());
        }
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{word:?} is not between 0 and 1 (0% and 100%)"));
        }
        Ok(p)
    }

    fn duration(&mut self, example: &str) -> Result<Duration, String> {
        parse_duration(self.next(example)?, example)
    }

    /// A duration if the next word is one.
    fn optional_duration(&mut self) -> Result<Option<Duration>, String> {
        match self.words.get(self.at) {
            Some(w) if w.starts_with(|c: char| c.is_ascii_digit()) => {
                self.at += 1;
                parse_duration(w, "reorder 10% 200us").map(Some)
            }
            _ => Ok(None),
        }
    }
}

fn parse_u64(word: &str) -> Result<u64, String> {
    let n = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => word.parse(),
    };
    n.map_err(|_| format!("{word:?} is not a number (42 or 0x2a)"))
}

fn split_number(word: &str) -> (&str, &str) {
    let end = word.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(word.len());
    word.split_at(end)
}

fn parse_duration(word: &str, example: &str) -> Result<Duration, String> {
    let (number, unit) = split_number(word);
    let nanos_per = match unit.to_ascii_lowercase().as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(format!("{word:?} is not a duration: a number and ns, us, ms or s, as in {example:?}")),
    };
    let n: f64 = number.parse().map_err(|_| format!("{word:?} is not a duration, as in {example:?}"))?;
    let nanos = n * nanos_per;
    if !(0.0..=1e15).contains(&nanos) {
        return Err(format!("{word:?} is out of range (at most 1000000s)"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

const RATE_UNITS: [(&str, u64); 4] = [("gbit", 1_000_000_000), ("mbit", 1_000_000), ("kbit", 1_000), ("bit", 1)];

fn parse_rate(word: &str) -> Result<u64, String> {
    let (number, unit) = split_number(word);
    let bad =
        || format!("{word:?} is not a rate: a number and bit, kbit, mbit or gbit (per second), as in \"100mbit\"");
    let per = RATE_UNITS.iter().find(|(u, _)| unit.eq_ignore_ascii_case(u)).ok_or_else(bad)?.1;
    let bits = number.parse::<f64>().map_err(|_| bad())? * per as f64;
    if !(1.0..=1e15).contains(&bits) {
        return Err(format!("{word:?} is out of range (1bit to 1000000gbit)"));
    }
    Ok(bits.round() as u64)
}

/// `p` as a percentage, without float noise (`5%`, `0.1%`).
struct Percent(f64);

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = (self.0 * 100.0 * 1e9).round() / 1e9;
        write!(f, "{percent}%")
    }
}

/// A duration in the largest unit that writes it exactly.
struct Span(Duration);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.as_nanos();
        for (unit, per) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
            if n >= per && n % per == 0 {
                return write!(f, "{}{unit}", n / per);
            }
        }
        write!(f, "{n}ns")
    }
}

/// A rate in the largest unit that writes it exactly.
struct Rate(u64);

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, per) = RATE_UNITS.iter().find(|(_, per)| self.0 % per == 0).copied().unwrap_or(("bit", 1));
        write!(f, "{}{unit}", self.0 / per)
    }
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            FaultKind::Loss(p) => write!(f, "loss {}", Percent(p))?,
            FaultKind::Duplicate(p) => write!(f, "duplicate {}", Percent(p))?,
            FaultKind::Reorder(p, d) => write!(f, "reorder {} {}", Percent(p), Span(d))?,
            FaultKind::Corrupt(p) => write!(f, "corrupt {}", Percent(p))?,
            FaultKind::Delay(d, j) if j.is_zero() => write!(f, "delay {}", Span(d))?,
            FaultKind::Delay(d, j) => write!(f, "delay {} jitter {}", Span(d), Span(j))?,
            FaultKind::Rate(bits, queue) => write!(f, "rate {} queue {}", Rate(bits), Span(queue))?,
            FaultKind::Partition(period, down) => write!(f, "partition every {} for {}", Span(period), Span(down))?,
        }
        if !self.scope.is_all() {
            write!(f, " {}", self.scope)?;
        }
        Ok(())
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for r in &self.rules {
            write!(f, "{sep}{r}")?;
            sep = "; ";
        }
        if let Some(seed) = self.seed {
            write!(f, "{sep}seed {seed:#x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> FaultSpec {
        s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn every_kind_parses_and_prints_back_in_canonical_form() {
        let text = "loss 5%; duplicate 1%; reorder 10% 200us; corrupt 0.1%; delay 2ms jitter 500us; \
                    rate 100mbit queue 5ms; partition every 2s for 300ms; seed 0x2a";
        let spec = parse(text);
        assert_eq!(spec.to_string(), text);
        assert_eq!(spec.seed(), Some(42));
        assert_eq!(spec.rules().len(), 7);
        assert_eq!(spec.rules()[2].kind, FaultKind::Reorder(0.10, Duration::from_micros(200)));
        assert_eq!(spec.rules()[5].kind, FaultKind::Rate(100_000_000, Duration::from_millis(5)));
        assert_eq!(parse(&spec.to_string()), spec);
    }

    #[test]
    fn defaults_aliases_and_fractions() {
        let spec = parse("dup 0.02\nreorder 3%\n rate 1.5gbit ;delay 1.5ms");
        assert_eq!(spec.rules()[0].kind, FaultKind::Duplicate(0.02));
        assert_eq!(spec.rules()[1].kind, FaultKind::Reorder(0.03, DEFAULT_REORDER_DELAY));
        assert_eq!(spec.rules()[2].kind, FaultKind::Rate(1_500_000_000, DEFAULT_RATE_QUEUE));
        assert_eq!(spec.rules()[3].kind, FaultKind::Delay(Duration::from_micros(1500), Duration::ZERO));
        assert_eq!(spec.to_string(), "duplicate 2%; reorder 3% 1ms; rate 1500mbit queue 10ms; delay 1500us");
        assert!(parse("").is_empty());
    }

    #[test]
    fn scopes_parse_and_print() {
        let spec = parse("loss 50% op read,ack qp 0x2001,8194 from 10.0.0.2 to ::1");
        let s = &spec.rules()[0].scope;
        assert!(!s.is_all());
        assert_eq!(spec.to_string(), "loss 50% from 10.0.0.2 to ::1 qp 0x2001,0x2002 op read,ack");
        assert_eq!(parse(&spec.to_string()), spec);
    }

    #[test]
    fn errors_name_the_rule_the_word_and_an_example() {
        let cases = [
            ("loss 5", "loss 5%"),
            ("loss 150%", "between 0 and 1"),
            ("loss", "missing a value"),
            ("los 5%", "unknown fault \"los\""),
            ("reorder 5% 3 ms", "\"3\" is not a duration"),
            ("rate 100mbps", "not a rate"),
            ("partition every 1s for 2s", "at most the period"),
            ("partition 1s", "expected `every`"),
            ("loss 1% op reads", "unknown operation class \"reads\""),
            ("loss 1% qp 0x1000000", "not a QP number"),
            ("loss 1% from 10.0.0", "not an IP address"),
            ("loss 1% via x", "unexpected \"via\""),
            ("seed x", "not a number"),
        ];
        for (text, expected) in cases {
            let e = text.parse::<FaultSpec>().unwrap_err();
            assert!(e.contains(expected) && e.contains(text), "{text:?} gave {e:?}, expected {expected:?}");
        }
    }

    #[test]
    fn a_chain_from_a_spec_is_a_function_of_its_seed() {
        use crate::fault::Datagram;
        use softrdma_wire::Envelope;
        let spec = parse("loss 30%; duplicate 20%; corrupt 10%");
        let d = Datagram::new(Envelope::rocev2([1, 1, 1, 1].into(), 0xc000, [2, 2, 2, 2].into()).unwrap(), vec![0; 64]);
        let run = |seed| {
            let mut chain = spec.chain(seed);
            (0..200).map(|_| chain.judge(&d)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let drops = run(7).iter().filter(|r| r.is_err()).count();
        assert!((30..90).contains(&drops), "30% of 200 lost, got {drops}");
    }
}
