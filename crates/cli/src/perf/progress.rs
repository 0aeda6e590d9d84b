//! The progress bar of a perf run: shown on standard error once a run has taken a second,
//! and never when standard error is not a terminal.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::spec::{Mode, Spec};

/// Progress over every size of a test.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    enabled: bool,
    started: Instant,
    /// Units per size: operations, or milliseconds with `--duration`.
    per_run: u64,
    by_time: bool,
    runs: u64,
    run: u64,
    size: u64,
}

impl Progress {
    /// A progress bar for `spec`, shown only if `enabled` and standard error is a terminal.
    pub(crate) fn new(spec: &Spec, enabled: bool) -> Progress {
        let by_time = spec.duration_ms.is_some();
        let per_run =
            spec.duration_ms.unwrap_or(spec.iters * if spec.mode == Mode::Bw { u64::from(spec.qps) } else { 1 }).max(1);
        Progress {
            bar: None,
            enabled: enabled && std::io::stderr().is_terminal(),
            started: Instant::now(),
            per_run,
            by_time,
            runs: spec.sizes.len() as u64,
            run: 0,
            size: 0,
        }
    }

    /// Run `index` (of the sizes) starts, with `size`-byte messages.
    pub(crate) fn start_run(&mut self, index: usize, size: u64) {
        self.run = index as u64;
        self.size = size;
        self.set_run(0, Duration::ZERO);
    }

    /// The current run has done `ops` operations in `elapsed`.
    pub(crate) fn set_run(&mut self, ops: u64, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let done = if self.by_time { elapsed.as_millis() as u64 } else { ops };
        let pos = self.run * self.per_run + done.min(self.per_run);
        if self.bar.is_none() && self.started.elapsed() >= Duration::from_secs(1) {
            let bar = ProgressBar::with_draw_target(Some(self.runs * self.per_run), ProgressDrawTarget::stderr())
                .with_elapsed(self.started.elapsed());
            let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
            bar.set_message(format!("{} B", self.size));
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
