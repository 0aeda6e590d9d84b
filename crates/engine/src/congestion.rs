//! RoCEv2 congestion control: DCQCN's reaction point (a rate limiter per QP that CNPs slow
//! down) and notification point (when a receiver answers congestion with a CNP).
//!
//! DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015)
//! is what RoCE NICs run: a switch marks ECN CE on packets of a congested queue, the
//! receiving NIC (the *notification point*) answers with a CNP (BTH opcode 0x81, BECN set)
//! to the sending QP at most once per interval, and the sending NIC (the *reaction point*)
//! cuts that QP's rate by a factor that grows with how often CNPs come (`alpha`), then
//! recovers in stages on a timer and a byte counter. The parameters start from the ones
//! NVIDIA ConnectX adapters default to (`/sys/class/net/<if>/ecn/roce_rp/*` and
//! `roce_np/*`); where they differ (the CNP interval and the increase steps, from the
//! paper) the simulated incast in `engine/tests/incast.rs` chose: with mlx5's 4 µs CNP
//! interval every QP of an incast was cut to the minimum rate before the first queue
//! drained. The line rate a software NIC has to be told.
//!
//! Both halves are pure state machines over the caller's time, like the rest of the engine.

use core::time::Duration;

use crate::Instant;

/// The reaction point's parameters (mlx5's names in brackets).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcqcnConfig {
    /// The rate a QP starts at and never exceeds, bytes per second.
    pub line_rate: f64,
    /// The lowest rate a QP is cut to, bytes per second [`rpg_min_rate`, 1 Mb/s].
    pub min_rate: f64,
    /// Most a single CNP cuts the rate to, as a fraction of it [`rpg_min_dec_fac`, 50 %].
    pub min_decrease_factor: f64,
    /// Alpha's gain: each update keeps this fraction of alpha [`dce_tcp_g`, 1019/1024].
    pub alpha_g: f64,
    /// How often alpha is updated (55 µs, the paper's value; mlx5's `dce_tcp_rtt` is 1 µs).
    pub alpha_update_period: Duration,
    /// Alpha on the first CNP of a flow [`initial_alpha_value`, 1023/1024].
    pub initial_alpha: f64,
    /// Least time between two rate cuts (50 µs, the paper's CNP interval; mlx5's
    /// `rate_reduce_monitor_period` is 4 µs).
    pub rate_reduce_period: Duration,
    /// Time between rate increase events [`rpg_time_reset`, 300 µs].
    pub increase_period: Duration,
    /// Bytes sent between rate increase events [`rpg_byte_reset`, 32767].
    pub increase_bytes: u64,
    /// Increase events before additive increase, and again before hyper increase
    /// [`rpg_threshold`, 1].
    pub stage_threshold: u32,
    /// Additive increase step, bytes per second (40 Mb/s, the paper's; mlx5's `rpg_ai_rate`
    /// is 5 Mb/s).
    pub additive_step: f64,
    /// Hyper increase step, bytes per second (400 Mb/s; mlx5's `rpg_hai_rate` is 50 Mb/s).
    pub hyper_step: f64,
    /// Bytes a QP may send at once after idling, so that a paced QP still fills a GSO run.
    pub burst: u64,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        const MBIT: f64 = 1e6 / 8.0;
        Self {
            line_rate: 100_000.0 * MBIT, // 100 Gb/s: softrdma's loopback is slower
            min_rate: MBIT,
            min_decrease_factor: 0.5,
            alpha_g: 1019.0 / 1024.0,
            alpha_update_period: Duration::from_micros(55),
            initial_alpha: 1023.0 / 1024.0,
            rate_reduce_period: Duration::from_micros(50),
            increase_period: Duration::from_micros(300),
            increase_bytes: 32767,
            stage_threshold: 1,
            additive_step: 40.0 * MBIT,
            hyper_step: 400.0 * MBIT,
            burst: 64 * 1024,
        }
    }
}

/// One QP's reaction point: its current and target rate, alpha, the stage counters and
/// the pacer that spaces its packets at the current rate.
#[derive(Clone, Debug)]
pub struct ReactionPoint {
    config: DcqcnConfig,
    /// Current rate, bytes per second; `None` until the first CNP (no limit).
    current: Option<f64>,
    target: f64,
    alpha: f64,
    /// A CNP came since the last alpha update.
    cnp_in_period: bool,
    next_alpha_update: Option<Instant>,
    last_cut: Option<Instant>,
    next_increase: Option<Instant>,
    bytes_since_increase: u64,
    timer_stages: u32,
    byte_stages: u32,
    /// The pacer: when the next packet may leave.
    next_send: Instant,
}

impl ReactionPoint {
    /// A QP that has seen no congestion: no limit.
    pub fn new(config: DcqcnConfig) -> Self {
        Self {
            config,
            current: None,
            target: config.line_rate,
            alpha: config.initial_alpha,
            cnp_in_period: false,
            next_alpha_update: None,
            last_cut: None,
            next_increase: None,
            bytes_since_increase: 0,
            timer_stages: 0,
            byte_stages: 0,
            next_send: Instant::ZERO,
        }
    }

    /// The current rate limit in bytes per second, `None` when there is none.
    pub fn rate(&self) -> Option<f64> {
        self.current
    }

    /// Alpha, the estimate of how congested the path is (0 to 1).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// A CNP arrived for this QP: cut the rate (at most once per
    /// [`rate_reduce_period`](DcqcnConfig::rate_reduce_period)).
    pub fn on_cnp(&mut self, now: Instant) {
        self.cnp_in_period = true;
        let c = self.config;
        if self.next_alpha_update.is_none() {
            self.alpha = c.initial_alpha;
            self.next_alpha_update = Some(now + c.alpha_update_period);
        }
        if self.last_cut.is_some_and(|t| now < t + c.rate_reduce_period) {
            return;
        }
        self.last_cut = Some(now);
        let current = self.current.unwrap_or(c.line_rate);
        self.target = current;
        let factor = (1.0 - self.alpha / 2.0).max(c.min_decrease_factor);
        self.current = Some((current * factor).max(c.min_rate));
        self.timer_stages = 0;
        self.byte_stages = 0;
        self.bytes_since_increase = 0;
        self.next_increase = Some(now + c.increase_period);
    }

    /// Whether a packet may leave at `now`; if not, the instant it may.
    pub fn send_at(&self, now: Instant) -> Option<Instant> {
        (self.current.is_some() && self.next_send > now).then_some(self.next_send)
    }

    /// A packet of `bytes` left at `now`: moves the pacer on and counts toward a rate
    /// increase.
    pub fn on_sent(&mut self, now: Instant, bytes: usize) {
        let Some(rate) = self.current else { return };
        let c = self.config;
        // Credit for idle time is capped at `burst` bytes.
        let burst = Duration::from_secs_f64(c.burst as f64 / rate);
        let earliest = Instant::from_nanos(now.as_nanos().saturating_sub(burst.as_nanos() as u64));
        let start = self.next_send.max(earliest);
        self.next_send = start + Duration::from_secs_f64(bytes as f64 / rate);
        self.bytes_since_increase += bytes as u64;
        if self.bytes_since_increase >= c.increase_bytes {
            self.bytes_since_increase = 0;
            self.byte_stages += 1;
            self.increase();
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to run.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        Instant::earliest(self.next_alpha_update, self.next_increase)
    }

    /// Runs the alpha update and rate increase timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let c = self.config;
        while let Some(at) = self.next_alpha_update.filter(|&t| t <= now) {
            self.alpha = c.alpha_g * self.alpha + if self.cnp_in_period { 1.0 - c.alpha_g } else { 0.0 };
            self.cnp_in_period = false;
            // Once alpha has decayed to nothing and the rate is back at the line, stop.
            self.next_alpha_update = (self.current.is_some() || self.alpha > 1e-3).then(|| at + c.alpha_update_period);
        }
        while let Some(at) = self.next_increase.filter(|&t| t <= now) {
            self.timer_stages += 1;
            self.next_increase = Some(at + c.increase_period);
            self.increase();
        }
    }

    /// One rate increase event: fast recovery toward the target, then additive, then
    /// hyper increase of the target.
    fn increase(&mut self) {
        let Some(current) = self.current else { return };
        let c = self.config;
        let f = c.stage_threshold;
        if self.timer_stages > f && self.byte_stages > f {
            let i = (self.timer_stages.min(self.byte_stages) - f) as f64;
            self.target += i * c.hyper_step;
        } else if self.timer_stages > f || self.byte_stages > f {
            self.target += c.additive_step;
        }
        self.target = self.target.min(c.line_rate);
        let next = (current + self.target) / 2.0;
        if next >= c.line_rate * 0.999 {
            // Back at the line: no limit, no timers.
            self.current = None;
            self.next_increase = None;
        } else {
            self.current = Some(next);
        }
    }
}

/// The notification point of one QP: whether congestion seen now deserves a CNP.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotificationPoint {
    last: Option<Instant>,
}

/// Least time between two CNPs to one QP (the DCQCN paper's 50 µs; mlx5's
/// `min_time_between_cnps` is 4 µs).
pub const CNP_INTERVAL: Duration = Duration::from_micros(50);

impl NotificationPoint {
    /// A packet marked CE (or a drop the receiver attributes to this QP) at `now`: true
    /// when a CNP should go to the sender, at most one per [`CNP_INTERVAL`].
    pub fn on_congestion(&mut self, now: Instant) -> bool {
        if self.last.is_some_and(|t| now < t + CNP_INTERVAL) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// A QP that received within this long counts as a flow of the congested receiver when
/// its socket drops datagrams ([`Engine::handle_receive_drops`](crate::Engine::handle_receive_drops)).
pub const RECENT_RX: Duration = Duration::from_micros(200);

/// One QP's congestion control: both halves and what they need from the QP.
#[derive(Clone, Debug)]
pub(crate) struct QpCongestion {
    pub(crate) rp: ReactionPoint,
    pub(crate) np: NotificationPoint,
    /// Where a UD QP's CNP goes, and to which QP: the last sender heard from (a connected
    /// QP's go to its peer).
    pub(crate) last_peer: Option<(softrdma_wire::Envelope, softrdma_wire::Qpn)>,
    pub(crate) last_rx: Option<Instant>,
    /// The pacer held the QP back until this instant.
    pub(crate) paced_until: Option<Instant>,
}

impl QpCongestion {
    pub(crate) fn new(config: DcqcnConfig) -> Self {
        Self {
            rp: ReactionPoint::new(config),
            np: NotificationPoint::default(),
            last_peer: None,
            last_rx: None,
            paced_until: None,
        }
    }

    pub(crate) fn received_since(&self, now: Instant) -> bool {
        self.last_rx.is_some_and(|t| now < t + RECENT_RX)
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        Instant::earliest(self.rp.poll_timeout(), self.paced_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Instant {
        Instant::from_nanos(n * 1000)
    }

    #[test]
    fn no_cnp_no_limit() {
        let mut rp = ReactionPoint::new(DcqcnConfig::default());
        rp.on_sent(us(0), 4096);
        assert_eq!(rp.rate(), None);
        assert_eq!(rp.send_at(us(0)), None);
        assert_eq!(rp.poll_timeout(), None);
    }

    #[test]
    fn a_cnp_halves_the_rate_and_cuts_come_at_most_once_per_period() {
        let c = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(c);
        rp.on_cnp(us(0));
        let r1 = rp.rate().unwrap();
        assert!((r1 - c.line_rate * (1.0 - c.initial_alpha / 2.0)).abs() < 1.0, "{r1}");
        rp.on_cnp(us(49));
        assert_eq!(rp.rate(), Some(r1), "within the reduce period");
        rp.on_cnp(us(50));
        assert!(rp.rate().unwrap() < r1 * 0.6);
        for t in 0..200 {
            rp.on_cnp(us(100 + 50 * t));
        }
        assert_eq!(rp.rate(), Some(c.min_rate), "never below the minimum");
    }

    #[test]
    fn the_pacer_spaces_packets_at_the_rate_after_a_burst() {
        let c = DcqcnConfig { burst: 8192, ..DcqcnConfig::default() };
        let mut rp = ReactionPoint::new(c);
        for t in 0..40 {
            rp.on_cnp(us(50 * t));
        }
        let rate = rp.rate().unwrap();
        let mut now = us(2000);
        let mut sent = 0u64;
        let start = now;
        for _ in 0..200 {
            if let Some(at) = rp.send_at(now) {
                assert!(at > now);
                now = at;
            }
            rp.on_sent(now, 4096);
            sent += 4096;
        }
        let elapsed = (now - start).as_secs_f64();
        let measured = (sent - 4096 - 8192) as f64 / elapsed;
        let rate_now = rp.rate().unwrap_or(c.line_rate);
        assert!(measured <= rate_now.max(rate) * 1.01, "paced at {measured} B/s, limit {rate}..{rate_now}");
    }

    #[test]
    fn without_cnps_the_rate_recovers_to_no_limit_and_alpha_decays() {
        let c = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(c);
        for t in 0..10 {
            rp.on_cnp(us(50 * t));
        }
        let cut = rp.rate().unwrap();
        let alpha = rp.alpha();
        let mut now = us(500);
        let mut steps = 0;
        while let Some(t) = rp.poll_timeout() {
            now = t;
            rp.handle_timeout(now);
            steps += 1;
            assert!(steps < 1_000_000, "the timers stop");
        }
        assert_eq!(rp.rate(), None, "back to no limit (from {cut} B/s)");
        assert!(rp.alpha() < alpha / 10.0);
        // An idle QP's target grows only by the additive step per timer event, as in
        // DCQCN: seconds from 1/1000 of the line, harmless since it sends nothing.
        assert!(now < us(10_000_000), "recovered: {now:?}");
    }

    #[test]
    fn a_busy_qp_recovers_within_milliseconds() {
        let c = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(c);
        for t in 0..10 {
            rp.on_cnp(us(50 * t));
        }
        let mut now = us(500);
        for _ in 0..1_000_000 {
            if rp.rate().is_none() {
                break;
            }
            let next = Instant::earliest(rp.send_at(now), rp.poll_timeout()).unwrap_or(now);
            now = now.max(next);
            rp.handle_timeout(now);
            if rp.send_at(now).is_none() {
                rp.on_sent(now, 4096);
            }
        }
        assert_eq!(rp.rate(), None);
        assert!(now < us(50_000), "a QP that keeps sending is back at the line in {now:?}");
    }

    #[test]
    fn bytes_sent_speed_up_recovery() {
        let c = DcqcnConfig::default();
        let (mut idle, mut busy) = (ReactionPoint::new(c), ReactionPoint::new(c));
        for t in 0..10 {
            idle.on_cnp(us(50 * t));
            busy.on_cnp(us(50 * t));
        }
        for k in 0..64 {
            busy.on_sent(us(460 + k), 4096);
        }
        assert!(busy.rate().unwrap_or(c.line_rate) > idle.rate().unwrap());
    }

    #[test]
    fn the_notification_point_sends_one_cnp_per_interval() {
        let mut np = NotificationPoint::default();
        assert!(np.on_congestion(us(0)));
        assert!(!np.on_congestion(us(1)));
        assert!(!np.on_congestion(us(49)));
        assert!(np.on_congestion(us(50)));
    }
}
