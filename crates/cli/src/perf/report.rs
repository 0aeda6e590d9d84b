//! What a perf test measured, as a perftest-like table or as JSON.

use std::fmt::{self, Write as _};
use std::time::Duration;

use serde::Serialize;

use super::baseline::Baseline;
use super::control::{SideInfo, SideStats};
use super::spec::{Mode, Op, Spec};

/// `d` in microseconds, exact to the nanosecond (`as_secs_f64() * 1e6` is not: 999 µs
/// would come out as 999.0000000000001).
pub(crate) fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// Latency statistics in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct LatStats {
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) avg: f64,
    pub(crate) p99: f64,
    pub(crate) p99_9: f64,
    pub(crate) max: f64,
    pub(crate) stddev: f64,
}

impl LatStats {
    /// The statistics of `samples`, each scaled by `scale` (½ for a round trip reported one
    /// way). `None` without samples.
    pub(crate) fn of(samples: &[Duration], scale: f64) -> Option<LatStats> {
        let mut us: Vec<f64> = samples.iter().map(|d| micros(*d) * scale).collect();
        if us.is_empty() {
            return None;
        }
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let pick = |q: f64| us[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
        let avg = us.iter().sum::<f64>() / n as f64;
        let var = us.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        Some(LatStats {
            min: us[0],
            median: pick(0.5),
            avg,
            p99: pick(0.99),
            p99_9: pick(0.999),
            max: us[n - 1],
            stddev: var.sqrt(),
        })
    }
}

/// One size's results.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SizeResult {
    pub(crate) bytes: u64,
    /// Operations measured (the client's; both sides' when bidirectional).
    pub(crate) iterations: u64,
    pub(crate) seconds: f64,
    /// Bandwidth: the best 1/20 of the run, and the whole run's average (MB = 10^6 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bw_peak_mb_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bw_avg_mb_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bw_peak_gbit_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bw_avg_gbit_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) msg_rate_mpps: Option<f64>,
    /// Latency in microseconds: one way for SEND and WRITE (half the ping-pong's round
    /// trip), the round trip for READ and atomics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) latency_us: Option<LatStats>,
    /// Messages the receiving side took (SEND; UD may lose some).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) received: Option<u64>,
    pub(crate) client: SideStats,
    pub(crate) server: SideStats,
    /// Every latency sample, for the histogram.
    #[serde(skip)]
    pub(crate) samples_us: Vec<f64>,
}

impl SizeResult {
    /// A bandwidth result from the two sides' stats and the client's (time, operations)
    /// samples.
    pub(crate) fn bw(
        spec: &Spec,
        size: u64,
        client: SideStats,
        server: SideStats,
        samples: &[(f64, u64)],
    ) -> SizeResult {
        let ops = client.ops + if spec.bidirectional { server.ops } else { 0 };
        let rate = |side: &SideStats| if side.seconds > 0.0 { side.ops as f64 / side.seconds } else { 0.0 };
        let mut msgs_per_sec = rate(&client);
        if spec.bidirectional {
            msgs_per_sec += rate(&server);
        }
        let avg = msgs_per_sec * size as f64;
        // The peak: the best stretch of at least 1/20 of the run (and 1 ms).
        let window = (client.seconds / 20.0).max(1e-3);
        let mut peak_ops_rate: f64 = 0.0;
        let mut j = 0;
        for i in 0..samples.len() {
            while j < i && samples[i].0 - samples[j + 1].0 >= window {
                j += 1;
            }
            let dt = samples[i].0 - samples[j].0;
            if dt >= window {
                peak_ops_rate = peak_ops_rate.max((samples[i].1 - samples[j].1) as f64 / dt);
            }
        }
        let mut peak = peak_ops_rate * size as f64;
        if spec.bidirectional {
            peak += rate(&server) * size as f64;
        }
        let peak = peak.max(avg);
        let received = (spec.op == Op::Send).then_some(server.received + client.received);
        SizeResult {
            bytes: size,
            iterations: ops,
            seconds: client.seconds.max(server.seconds),
            bw_peak_mb_per_sec: Some(peak / 1e6),
            bw_avg_mb_per_sec: Some(avg / 1e6),
            bw_peak_gbit_per_sec: Some(peak * 8.0 / 1e9),
            bw_avg_gbit_per_sec: Some(avg * 8.0 / 1e9),
            msg_rate_mpps: Some(msgs_per_sec / 1e6),
            latency_us: None,
            received,
            client,
            server,
            samples_us: Vec::new(),
        }
    }

    /// A latency result.
    pub(crate) fn lat(
        spec: &Spec,
        size: u64,
        client: SideStats,
        server: SideStats,
        samples: &[Duration],
    ) -> SizeResult {
        let scale = if matches!(spec.op, Op::Send | Op::Write) { 0.5 } else { 1.0 };
        SizeResult {
            bytes: size,
            iterations: samples.len() as u64,
            seconds: client.seconds,
            bw_peak_mb_per_sec: None,
            bw_avg_mb_per_sec: None,
            bw_peak_gbit_per_sec: None,
            bw_avg_gbit_per_sec: None,
            msg_rate_mpps: None,
            latency_us: LatStats::of(samples, scale),
            received: None,
            client,
            server,
            samples_us: samples.iter().map(|d| micros(*d) * scale).collect(),
        }
    }
}

/// The path a test's packets took between the two sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Path {
    /// Every packet either side sent went through the same-host path's shared memory.
    SameHost,
    /// None did: every packet went through the sockets (UDP through the kernel).
    Wire,
    /// Some did, some did not.
    Mixed,
}

impl Path {
    /// The path of the packets both sides sent in all of `results`.
    pub(crate) fn of(results: &[SizeResult]) -> Path {
        let sides = || results.iter().flat_map(|r| [&r.client, &r.server]);
        let sent: u64 = sides().map(|s| s.packets_sent).sum();
        let same_host: u64 = sides().map(|s| s.packets_same_host).sum();
        if same_host == 0 {
            Path::Wire
        } else if same_host >= sent {
            Path::SameHost
        } else {
            Path::Mixed
        }
    }

    /// The path of the packets of all of `reports`.
    pub(crate) fn of_all(reports: &[Report]) -> Path {
        let mut paths = reports.iter().map(|r| r.path);
        let first = paths.next().unwrap_or(Path::Wire);
        if paths.all(|p| p == first) { first } else { Path::Mixed }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::SameHost => "same-host",
            Path::Wire => "wire",
            Path::Mixed => "mixed",
        })
    }
}

/// The banner's path: [`Path`], and whether long messages' data was copied once, from the
/// other side's memory (carried by reference).
fn path_text(path: Path, results: &[SizeResult]) -> String {
    let by_reference: u64 = results.iter().map(|r| r.client.packets_by_reference + r.server.packets_by_reference).sum();
    if by_reference > 0 { format!("{path} (long messages copied once)") } else { path.to_string() }
}

/// A whole test's report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) test: String,
    pub(crate) spec: Spec,
    pub(crate) local: SideInfo,
    pub(crate) remote: SideInfo,
    /// What a latency figure is.
    pub(crate) latency_is: Option<&'static str>,
    /// The path the packets took: `same-host` (every packet both sides sent in all the
    /// results went through shared memory), `wire` (none did), or `mixed`.
    pub(crate) path: Path,
    pub(crate) results: Vec<SizeResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) baseline: Option<Baseline>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) vs_baseline: Vec<Ratio>,
}

/// One figure as a ratio of what the machine does without RDMA.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Ratio {
    pub(crate) figure: String,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) baseline: String,
    pub(crate) baseline_value: f64,
    pub(crate) ratio: f64,
    /// Whether the limit measures the same thing without RDMA semantics (polled against
    /// busy-polled, stack against stack); the others are for reference.
    pub(crate) like_for_like: bool,
    /// The project's target for this ratio (`<= 1.3`), where it has one, and whether this
    /// run met it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) met: Option<bool>,
    /// With `--rounds`: each round's figure, limit and ratio, in the order they ran; the
    /// fields above are then their medians, and `met` says whether the median ratio met
    /// the target.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rounds: Vec<RoundRatio>,
    #[serde(skip)]
    aim: Option<Target>,
}

/// One round's figure, limit and ratio (`--rounds`).
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct RoundRatio {
    pub(crate) value: f64,
    pub(crate) baseline_value: f64,
    pub(crate) ratio: f64,
}

/// A target for a ratio: at most or at least this much of the limit.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    AtMost(f64),
    AtLeast(f64),
}

impl Ratio {
    /// `value` (in `unit`) against `limit`, what `baseline` reached, with its `target`.
    pub(crate) fn new(
        figure: String,
        value: f64,
        unit: &'static str,
        baseline: &str,
        limit: f64,
        like_for_like: bool,
        target: Option<Target>,
    ) -> Ratio {
        let ratio = value / limit;
        Ratio {
            figure,
            value,
            unit,
            baseline: baseline.into(),
            baseline_value: limit,
            ratio,
            like_for_like,
            target: target.map(|t| match t {
                Target::AtMost(t) => format!("<= {t}"),
                Target::AtLeast(t) => format!(">= {t}"),
            }),
            met: target.map(|t| t.met(ratio)),
            rounds: Vec::new(),
            aim: target,
        }
    }

    /// This ratio over several rounds (`--rounds`): `rounds` holds each round's (this one
    /// among them), and the figure, limit and ratio become their medians.
    pub(crate) fn over_rounds(mut self, rounds: Vec<RoundRatio>) -> Ratio {
        if rounds.len() < 2 {
            // Only this round had the ratio (the others' packets took another path).
            return self;
        }
        let median = |f: fn(&RoundRatio) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 }
        };
        self.value = median(|r| r.value);
        self.baseline_value = median(|r| r.baseline_value);
        self.ratio = median(|r| r.ratio);
        self.met = self.aim.map(|t| t.met(self.ratio));
        self.rounds = rounds;
        self
    }

    /// This ratio as one round of several.
    pub(crate) fn round(&self) -> RoundRatio {
        RoundRatio { value: self.value, baseline_value: self.baseline_value, ratio: self.ratio }
    }
}

impl Target {
    /// Whether `ratio` meets the target.
    fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtMost(t) => ratio <= t,
            Target::AtLeast(t) => ratio >= t,
        }
    }
}

const RULE: &str =
    "---------------------------------------------------------------------------------------------------------";

/// What the latency figure of `op` is.
pub(crate) fn latency_is(op: Op) -> &'static str {
    match op {
        Op::Write => "one way: half the round trip of an RDMA WRITE with immediate ping-pong",
        Op::Send => "one way: half the round trip of a SEND ping-pong",
        Op::Read => "the round trip of an RDMA READ",
        Op::Atomic => "the round trip of an atomic FETCH_AND_ADD",
    }
}

impl Report {
    /// The perftest-like table.
    pub(crate) fn text(&self) -> String {
        let s = &self.spec;
        let mut o = String::new();
        let _ = writeln!(o, "{RULE}");
        let _ = writeln!(o, "                    softrdma perf {}: {} over RoCEv2", self.test, operation_name(s.op));
        let _ = writeln!(
            o,
            " Connection: {}{}   QPs: {}   TX depth: {}   Inline: {}   MTU: {}   {}{}   Path: {}",
            s.conn,
            if s.authenticate { " (authenticated)" } else { "" },
            s.qps,
            s.depth,
            s.inline,
            if s.mtu == 0 { "device".to_string() } else { s.mtu.to_string() },
            if s.bidirectional { "bidirectional" } else { "unidirectional" },
            if s.events { "   Completions: events" } else { "" },
            path_text(self.path, &self.results)
        );
        for (name, side) in [("local", &self.local), ("remote", &self.remote)] {
            let qp = side.qps.first().copied().unwrap_or(super::control::QpInfo { qpn: 0, psn: 0 });
            let _ = writeln!(
                o,
                " {name:<6}  {} GID {}  QPN {:#08x}  PSN {:#08x}  RKey {:#010x}  VAddr {:#018x}",
                side.device,
                gid_text(side.ip),
                qp.qpn,
                qp.psn,
                side.rkey,
                side.addr
            );
        }
        let _ = writeln!(o, "{RULE}");
        match s.mode {
            Mode::Bw => {
                let _ = writeln!(
                    o,
                    " {:<10} {:<13} {:>15} {:>18} {:>17} {:>17} {:>14}",
                    "#bytes",
                    "#iterations",
                    "BW peak[MB/s]",
                    "BW average[MB/s]",
                    "BW peak[Gb/s]",
                    "BW average[Gb/s]",
                    "MsgRate[Mpps]"
                );
                for r in &self.results {
                    let _ = writeln!(
                        o,
                        " {:<10} {:<13} {:>15.2} {:>18.2} {:>17.2} {:>17.2} {:>14.6}",
                        r.bytes,
                        r.iterations,
                        r.bw_peak_mb_per_sec.unwrap_or(0.0),
                        r.bw_avg_mb_per_sec.unwrap_or(0.0),
                        r.bw_peak_gbit_per_sec.unwrap_or(0.0),
                        r.bw_avg_gbit_per_sec.unwrap_or(0.0),
                        r.msg_rate_mpps.unwrap_or(0.0)
                    );
                }
            }
            Mode::Lat => {
                let _ = writeln!(
                    o,
                    " {:<10} {:<13} {:>12} {:>15} {:>12} {:>12} {:>14} {:>12}",
                    "#bytes",
                    "#iterations",
                    "t_min[us]",
                    "t_median[us]",
                    "t_avg[us]",
                    "t_p99[us]",
                    "t_p99.9[us]",
                    "t_max[us]"
                );
                for r in &self.results {
                    let Some(l) = r.latency_us else { continue };
                    let _ = writeln!(
                        o,
                        " {:<10} {:<13} {:>12.2} {:>15.2} {:>12.2} {:>12.2} {:>14.2} {:>12.2}",
                        r.bytes, r.iterations, l.min, l.median, l.avg, l.p99, l.p99_9, l.max
                    );
                }
            }
        }
        let _ = writeln!(o, "{RULE}");
        if let Some(what) = self.latency_is {
            let _ = writeln!(o, " latency: {what}");
        }
        let retx: u64 = self.results.iter().map(|r| r.client.retransmitted + r.server.retransmitted).sum();
        let sent: u64 = self.results.iter().map(|r| r.client.packets_sent + r.server.packets_sent).sum();
        let _ = write!(o, " packets sent {sent}, retransmitted {retx}");
        if self.results.iter().any(|r| r.received.is_some()) {
            let got: u64 = self.results.iter().filter_map(|r| r.received).sum();
            let _ = write!(o, ", messages received {got}");
        }
        let lost: u64 = self.results.iter().map(|r| r.client.lost).sum();
        if lost > 0 {
            let _ = write!(o, ", pings lost {lost} (not timed)");
        }
        if s.events {
            let polled: u64 =
                self.results.iter().map(|r| r.client.channel_waits_polled + r.server.channel_waits_polled).sum();
            let slept: u64 =
                self.results.iter().map(|r| r.client.channel_waits_slept + r.server.channel_waits_slept).sum();
            let events: u64 = self.results.iter().map(|r| r.client.channel_events + r.server.channel_events).sum();
            let _ = write!(
                o,
                "\n channel events {events}, waits {}: {polled} found their event while polling, {slept} slept",
                polled + slept
            );
        }
        o.push('\n');
        if !self.vs_baseline.is_empty() {
            let _ = writeln!(o, "{RULE}");
            let rounds = self.vs_baseline.iter().map(|r| r.rounds.len()).max().unwrap_or(0);
            if rounds > 1 {
                let _ = writeln!(
                    o,
                    " against this machine's limits, {rounds} rounds of the test and its limits in turn (softrdma perf \
                     baseline): medians, each round's ratio in brackets; the table above is the last round's:"
                );
            } else {
                let _ = writeln!(o, " against this machine's limits, measured in this run (softrdma perf baseline):");
            }
            for r in &self.vs_baseline {
                let target = match (&r.target, r.met) {
                    (Some(t), Some(met)) => format!("; target {t}: {}", if met { "met" } else { "NOT met" }),
                    _ => String::new(),
                };
                let kind = if r.like_for_like { "" } else { ", for reference" };
                let each = if r.rounds.len() > 1 {
                    let list: Vec<String> = r.rounds.iter().map(|x| format!("{:.2}", x.ratio)).collect();
                    format!(" [{}]", list.join(" "))
                } else {
                    String::new()
                };
                let _ = writeln!(
                    o,
                    "   {:<34} {:>9.2} {:<5} = {:>5.2} x {} ({:.2} {}{kind}{target}){each}",
                    r.figure, r.value, r.unit, r.ratio, r.baseline, r.baseline_value, r.unit
                );
            }
        }
        o
    }
}

/// `--qps-sweep`'s table: one row per QP count and size, bandwidth and message rate
/// (and, with a baseline, the bandwidth as a ratio of its like-for-like limit: UDP GSO+GRO
/// goodput, or `process_vm_writev` when every packet took the same-host path).
pub(crate) fn sweep_text(reports: &[Report], baseline: Option<&Baseline>) -> String {
    let mut o = String::new();
    let Some(first) = reports.first() else { return o };
    let s = &first.spec;
    let path = Path::of_all(reports);
    let _ = writeln!(o, "{RULE}");
    let _ =
        writeln!(o, "                    softrdma perf {}: {} over RoCEv2, QP sweep", first.test, operation_name(s.op));
    let _ = writeln!(
        o,
        " Connection: {}   TX depth: {} per QP   Inline: {}   MTU: {}   {}   device {}   Path: {}",
        s.conn,
        s.depth,
        s.inline,
        if s.mtu == 0 { "device".to_string() } else { s.mtu.to_string() },
        if s.bidirectional { "bidirectional" } else { "unidirectional" },
        first.local.device,
        path_text(path, &reports.iter().flat_map(|r| r.results.iter().cloned()).collect::<Vec<_>>())
    );
    let _ = writeln!(o, "{RULE}");
    // The bandwidth's like-for-like limit, as in `--vs-baseline`'s ratios: process_vm_writev
    // on the same-host path, UDP GSO+GRO goodput otherwise.
    let limit = baseline.map(|b| match b.process_vm_writev_gbytes_per_sec {
        Some(pvm) if path == Path::SameHost => ("process_vm_writev", "x pvm_writev", pvm * 1e3),
        _ => ("UDP GSO+GRO goodput", "x GSO+GRO", b.udp_gso_gro_gbytes_per_sec * 1e3),
    });
    let _ = writeln!(
        o,
        " {:>5} {:<10} {:>18} {:>17} {:>14} {:>14}{}",
        "QPs",
        "#bytes",
        "BW average[MB/s]",
        "BW average[Gb/s]",
        "MsgRate[Mpps]",
        "retransmitted",
        limit.map(|(_, column, _)| format!("   {column:>10}")).unwrap_or_default()
    );
    for r in reports {
        for x in &r.results {
            let bw = x.bw_avg_mb_per_sec.unwrap_or(0.0);
            let ratio = limit.map(|(_, _, l)| format!("   {:>12.2}", bw / l)).unwrap_or_default();
            let _ = writeln!(
                o,
                " {:>5} {:<10} {:>18.2} {:>17.2} {:>14.6} {:>14}{ratio}",
                r.spec.qps,
                x.bytes,
                bw,
                x.bw_avg_gbit_per_sec.unwrap_or(0.0),
                x.msg_rate_mpps.unwrap_or(0.0),
                x.client.retransmitted + x.server.retransmitted
            );
        }
    }
    let _ = writeln!(o, "{RULE}");
    if let Some((name, _, l)) = limit {
        let _ = writeln!(o, " {name} on this machine, measured in this run: {l:.2} MB/s");
    }
    o
}

/// A GID as `ibv_devinfo` shows it: `::ffff:a.b.c.d` for IPv4.
fn gid_text(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => format!("::ffff:{v4}"),
        std::net::IpAddr::V6(v6) => v6.to_string(),
    }
}

fn operation_name(op: Op) -> &'static str {
    match op {
        Op::Send => "SEND",
        Op::Write => "RDMA WRITE",
        Op::Read => "RDMA READ",
        Op::Atomic => "atomic FETCH_AND_ADD",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_sample_at_or_above_the_rank() {
        let samples: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let l = LatStats::of(&samples, 1.0).expect("samples");
        assert_eq!((l.min, l.median, l.p99, l.p99_9, l.max), (1.0, 500.0, 990.0, 999.0, 1000.0));
        assert!((l.avg - 500.5).abs() < 1e-9);
        let half = LatStats::of(&samples, 0.5).expect("samples");
        assert_eq!(half.max, 500.0);
        assert!(LatStats::of(&[], 1.0).is_none());
    }

    #[test]
    fn a_ratio_over_rounds_is_their_median_and_needs_two() {
        let ratio = |value: f64, limit: f64| {
            Ratio::new("8 B median latency".into(), value, "us", "x", limit, true, Some(Target::AtMost(3.0)))
        };
        let rounds: Vec<RoundRatio> = [(1.0, 0.5), (4.0, 0.5), (2.0, 1.0)].map(|(v, l)| ratio(v, l).round()).into();
        let r = ratio(2.0, 1.0).over_rounds(rounds);
        assert_eq!((r.value, r.baseline_value, r.ratio), (2.0, 0.5, 2.0), "each the median of its own");
        assert_eq!((r.rounds.len(), r.met), (3, Some(true)), "met by the median ratio (2 <= 3), not the last");
        // Two rounds: the mean of the middle two; a ratio only one round had stays that round's.
        let two = ratio(2.0, 1.0).over_rounds(vec![ratio(8.0, 1.0).round(), ratio(2.0, 1.0).round()]);
        assert_eq!((two.ratio, two.met), (5.0, Some(false)));
        let alone = ratio(2.0, 1.0).over_rounds(vec![ratio(2.0, 1.0).round()]);
        assert!(alone.rounds.is_empty(), "no rounds listed for one");
    }
}
