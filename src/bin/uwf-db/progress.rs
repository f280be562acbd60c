//! `batch`'s progress line: threads done of the total, failed and running
//! now, agent calls per second, the cost reported so far, and an ETA from
//! the recent rate (the last [`WINDOW`]), not the average since the start —
//! a batch's first threads all finish together after a long first stretch,
//! which made a whole-run average promise 82 minutes for a 98-second run.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use uwf_db::engine::batch::BatchProgress;

/// How far back the rates look.
const WINDOW: Duration = Duration::from_secs(30);
/// The shortest stretch a rate is taken over (shorter: "…").
const MIN_SPAN: Duration = Duration::from_secs(3);

/// One look at the figures.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    done: u64,
    calls: u64,
}

/// The `{live}` key of the bar's template.
#[derive(Clone)]
struct Live {
    progress: Arc<BatchProgress>,
    failed: Arc<AtomicU64>,
    samples: VecDeque<Sample>,
}

impl indicatif::style::ProgressTracker for Live {
    fn clone_box(&self) -> Box<dyn indicatif::style::ProgressTracker> {
        Box::new(self.clone())
    }

    fn tick(&mut self, state: &ProgressState, now: Instant) {
        let calls = self.progress.calls();
        self.sample(now, state.pos(), calls);
    }

    fn reset(&mut self, _: &ProgressState, _: Instant) {
        self.samples.clear();
    }

    fn write(&self, state: &ProgressState, w: &mut dyn std::fmt::Write) {
        let rates = self.rates();
        let _ = w.write_str(&live_text(&Figures {
            done: state.pos(),
            total: state.len().unwrap_or(0),
            failed: self.failed.load(Ordering::Relaxed),
            running: self.progress.running(),
            rates,
            cost_usd: self.progress.cost_usd(),
        }));
    }
}

impl Live {
    /// Records the figures at `now`, forgetting those older than the
    /// window (one older sample is kept, so the rate spans the window).
    fn sample(&mut self, now: Instant, done: u64, calls: u64) {
        self.samples.push_back(Sample {
            at: now,
            done,
            calls,
        });
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| now.duration_since(s.at) >= WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// The rates between the oldest and the newest sample, once they are
    /// [`MIN_SPAN`] apart.
    fn rates(&self) -> Option<Rates> {
        let (a, b) = (self.samples.front()?, self.samples.back()?);
        let span = b.at.duration_since(a.at);
        if span < MIN_SPAN {
            return None;
        }
        let secs = span.as_secs_f64();
        Some(Rates {
            threads: b.done.saturating_sub(a.done) as f64 / secs,
            calls: b.calls.saturating_sub(a.calls) as f64 / secs,
        })
    }
}

/// Per-second rates over the recent window.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Rates {
    threads: f64,
    calls: f64,
}

/// What the line shows.
#[derive(Debug)]
struct Figures {
    done: u64,
    total: u64,
    failed: u64,
    running: u64,
    rates: Option<Rates>,
    cost_usd: Option<f64>,
}

/// `3 failed · 64 running · 212 calls/s · $1.42 · ETA 2m 10s`.
fn live_text(f: &Figures) -> String {
    let mut s = format!("{} failed · {} running", f.failed, f.running);
    match f.rates {
        Some(r) => {
            let _ = write!(s, " · {:.0} calls/s", r.calls);
        }
        None => s.push_str(" · … calls/s"),
    }
    if let Some(cost) = f.cost_usd {
        let _ = write!(s, " · ${cost:.2}");
    }
    let left = f.total.saturating_sub(f.done);
    match f.rates {
        _ if left == 0 => {}
        Some(r) if r.threads > 0.0 => {
            let ms = (left as f64 / r.threads * 1000.0).min(u64::MAX as f64) as u64;
            // Rounded to the second: the line is redrawn every second.
            let _ = write!(
                s,
                " · ETA {}",
                crate::output::human_duration(ms.div_ceil(1000) * 1000)
            );
        }
        _ => s.push_str(" · ETA …"),
    }
    s
}

/// The batch's bar: hidden when stderr is not a terminal or with `-q`.
/// `failed` counts the threads that failed or stopped with an error
/// (the caller's `on_item` adds to it).
pub fn batch_bar(
    total: u64,
    what: &str,
    progress: Arc<BatchProgress>,
    failed: Arc<AtomicU64>,
) -> ProgressBar {
    if !crate::output::shows_progress() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:20}] {pos}/{len} · {live}") {
        let live = Live {
            progress,
            failed,
            samples: VecDeque::new(),
        };
        bar.set_style(style.progress_chars("=> ").with_key("live", live));
    }
    bar.set_message(what.to_owned());
    // Redrawn while no thread finishes (running, calls and ETA move).
    bar.enable_steady_tick(Duration::from_secs(1));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(rates: Option<Rates>, cost: Option<f64>) -> Figures {
        Figures {
            done: 100,
            total: 400,
            failed: 3,
            running: 64,
            rates,
            cost_usd: cost,
        }
    }

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template("{msg} [{bar:20}] {pos}/{len} · {live}").is_ok());
    }

    #[test]
    fn the_line_says_failed_running_rate_cost_and_eta() {
        let r = Rates {
            threads: 10.0,
            calls: 41.6,
        };
        assert_eq!(
            live_text(&figures(Some(r), Some(1.4249))),
            "3 failed · 64 running · 42 calls/s · $1.42 · ETA 30s"
        );
        // No cost reported: none shown.
        assert_eq!(
            live_text(&figures(Some(r), None)),
            "3 failed · 64 running · 42 calls/s · ETA 30s"
        );
    }

    #[test]
    fn no_eta_before_a_rate_or_while_nothing_finishes() {
        assert_eq!(
            live_text(&figures(None, None)),
            "3 failed · 64 running · … calls/s · ETA …"
        );
        let stalled = Rates {
            threads: 0.0,
            calls: 5.0,
        };
        assert!(live_text(&figures(Some(stalled), None)).ends_with("ETA …"));
        // Done: no ETA at all.
        let done = Figures {
            done: 400,
            ..figures(Some(stalled), None)
        };
        assert!(!live_text(&done).contains("ETA"), "{}", live_text(&done));
    }

    #[test]
    fn the_eta_follows_the_recent_rate() {
        let slow = Rates {
            threads: 0.5,
            calls: 2.0,
        };
        // 300 left at 0.5/s: 10 minutes.
        assert!(live_text(&figures(Some(slow), None)).ends_with("ETA 10m"));
        let mut live = Live {
            progress: Arc::new(BatchProgress::default()),
            failed: Arc::new(AtomicU64::new(0)),
            samples: VecDeque::new(),
        };
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        live.sample(at(0), 0, 0);
        live.sample(at(1), 0, 64);
        assert_eq!(live.rates(), None, "under {MIN_SPAN:?}: no rate yet");
        // 100 done in the first minute, then 10 a second: the rate is the
        // window's, not the run's average (400 in 90 s).
        for (secs, done) in [(60, 100), (70, 200), (80, 300), (90, 400)] {
            live.sample(at(secs), done, done * 4);
        }
        let r = live.rates().unwrap();
        assert_eq!(
            live.samples.front().unwrap().done,
            100,
            "older samples dropped"
        );
        assert!((r.threads - 10.0).abs() < 1e-9, "{r:?}");
        assert!((r.calls - 40.0).abs() < 1e-9, "{r:?}");
    }
}
