//! Retry policies (SPEC §13; `docs/design.md` §5f): when an agent call that
//! failed is made again, how many times, and how long to wait first.
//!
//! A workflow may set `retry:` at its top (every role) and per role (that
//! role, replacing the workflow's); `--retries N --retry-backoff D` on
//! `run`, `thread step` and `batch` override both ([`RetryOverride`]).

use std::borrow::Cow;
use std::sync::LazyLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a failed agent call may be made again.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The agent took longer than its timeout and was killed.
    Timeout,
    /// The agent failed: a program that exited non-zero (an HTTP 429 from
    /// a hosted model, say), an agent CLI that reported an error or printed
    /// no result, an embedder's agent that returned an error.
    Exit,
    /// The reply was still invalid after the agent's re-asks: the call is
    /// made again from the original prompt.
    InvalidReply,
    /// The agent program could not be started.
    Spawn,
}

impl RetryOn {
    /// The word the YAML and the records use.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::Timeout => "timeout",
            RetryOn::Exit => "exit",
            RetryOn::InvalidReply => "invalid_reply",
            RetryOn::Spawn => "spawn",
        }
    }

    /// The word's cause; `None` for another word.
    pub fn parse(word: &str) -> Option<RetryOn> {
        [
            RetryOn::Timeout,
            RetryOn::Exit,
            RetryOn::InvalidReply,
            RetryOn::Spawn,
        ]
        .into_iter()
        .find(|c| c.as_str() == word)
    }
}

impl std::fmt::Display for RetryOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A retry policy, as stored in a workflow (durations in ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RetryPolicy {
    /// Calls in all, the first one included (1: no retry).
    pub attempts: u32,
    /// The wait before the first retry, in ms; each later wait doubles it.
    pub backoff_ms: u64,
    /// The longest wait, in ms.
    pub max_delay_ms: u64,
    /// The failures that are retried (sorted, no repeats).
    pub on: Vec<RetryOn>,
}

/// Default wait before the first retry: 1 s.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// Default longest wait: 60 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);
/// Most calls a policy may make for one step: 100.
pub const MAX_ATTEMPTS: u32 = 100;
/// Longest `backoff` or `max_delay`: 1 hour.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);
/// The failures retried when a policy names none: a timeout and a failed
/// agent (what a model under load does).
pub const DEFAULT_ON: [RetryOn; 2] = [RetryOn::Timeout, RetryOn::Exit];

/// The policy of a step no one set one for: no retry.
static NO_RETRY: LazyLock<RetryPolicy> = LazyLock::new(RetryPolicy::default);

impl Default for RetryPolicy {
    /// No retry.
    fn default() -> Self {
        RetryPolicy {
            attempts: 1,
            backoff_ms: millis(DEFAULT_BACKOFF),
            max_delay_ms: millis(DEFAULT_MAX_DELAY),
            on: DEFAULT_ON.to_vec(),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RetryPolicy {
    /// Whether a failure of kind `cause` on call `attempt` (1 for the
    /// first) is made again.
    pub fn retries(&self, cause: RetryOn, attempt: u32) -> bool {
        attempt < self.attempts && self.on.contains(&cause)
    }

    /// The wait before retry `retry` (1 for the first), before jitter:
    /// `backoff × 2^(retry−1)`, at most `max_delay`.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let factor = 1u64
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u64::MAX);
        Duration::from_millis(
            self.backoff_ms
                .saturating_mul(factor)
                .min(self.max_delay_ms),
        )
    }

    /// The wait before retry `retry` with "equal jitter": half the base
    /// wait, plus a share of the other half chosen by `random` (any
    /// `u64`), so that threads failing together do not retry together.
    ///
    /// ```
    /// use std::time::Duration;
    /// use uwf_db::workflow::RetryPolicy;
    ///
    /// let p = RetryPolicy { attempts: 5, backoff_ms: 1000, max_delay_ms: 3000, ..RetryPolicy::default() };
    /// assert_eq!(p.delay(1, 0), Duration::from_millis(500));
    /// assert!(p.delay(2, u64::MAX) <= Duration::from_millis(2000));
    /// assert_eq!(p.base_delay(3), Duration::from_millis(3000), "capped by max_delay");
    /// ```
    pub fn delay(&self, retry: u32, random: u64) -> Duration {
        let base = millis(self.base_delay(retry));
        let half = base / 2;
        let spread = base - half;
        let extra = if spread == 0 {
            0
        } else {
            random % (spread + 1)
        };
        Duration::from_millis(half + extra)
    }
}

/// What `--retries N` and `--retry-backoff D` change in the policy a
/// workflow sets (both absent: nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOverride {
    /// Retries after the first call (`--retries`): attempts = N + 1;
    /// 0 turns retrying off, whatever the workflow says.
    pub retries: Option<u32>,
    /// The first wait (`--retry-backoff`).
    pub backoff: Option<Duration>,
}

impl RetryOverride {
    /// The policy a step runs under: `set` (the role's `retry:`, else the
    /// workflow's), with what this override gives replacing its fields; no
    /// retry when neither says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use uwf_db::workflow::{RetryOverride, RetryPolicy};
    ///
    /// let from_cli = RetryOverride { retries: Some(3), backoff: Some(Duration::from_millis(10)) };
    /// let p = from_cli.apply(None);
    /// assert_eq!((p.attempts, p.backoff_ms), (4, 10));
    /// assert_eq!(RetryOverride::default().apply(None).attempts, 1, "no retry unless asked");
    /// ```
    ///
    /// Borrowed when the override changes nothing (a step's usual case: no
    /// allocation).
    pub fn apply<'a>(&self, set: Option<&'a RetryPolicy>) -> Cow<'a, RetryPolicy> {
        if *self == RetryOverride::default() {
            return match set {
                Some(p) => Cow::Borrowed(p),
                None => Cow::Borrowed(&NO_RETRY),
            };
        }
        let mut p = set.cloned().unwrap_or_default();
        if let Some(n) = self.retries {
            p.attempts = n.saturating_add(1).min(MAX_ATTEMPTS);
        }
        if let Some(b) = self.backoff {
            p.backoff_ms = millis(b.min(MAX_DELAY));
            p.max_delay_ms = p.max_delay_ms.max(p.backoff_ms);
        }
        Cow::Owned(p)
    }
}

/// `retry:` as written in a workflow.
#[derive(Debug, Deserialize)]
pub(super) struct RetrySrc {
    attempts: Option<serde_json::Value>,
    backoff: Option<serde_json::Value>,
    max_delay: Option<serde_json::Value>,
    on: Option<serde_json::Value>,
    #[serde(flatten)]
    extra: std::collections::BTreeMap<String, serde_json::Value>,
}

impl RetrySrc {
    /// The policy, or every problem with it (each as (key, message)).
    pub(super) fn check(&self) -> Result<RetryPolicy, Vec<(String, String)>> {
        let mut problems = Vec::new();
        for k in self.extra.keys() {
            problems.push((
                k.clone(),
                format!("unknown key '{k}' (allowed: attempts, backoff, max_delay, on)"),
            ));
        }
        let mut p = RetryPolicy::default();
        match &self.attempts {
            None => problems.push((
                "attempts".into(),
                "missing: how many calls in all, the first one included (e.g. 3)".into(),
            )),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if (1..=MAX_ATTEMPTS).contains(&n) => p.attempts = n,
                _ => problems.push((
                    "attempts".into(),
                    format!("must be a whole number from 1 to {MAX_ATTEMPTS}, got {v}"),
                )),
            },
        }
        let mut duration = |key: &str, v: &Option<serde_json::Value>, into: &mut u64| {
            let Some(v) = v else { return };
            let parsed = match v {
                serde_json::Value::String(s) => crate::input::parse_duration(s),
                serde_json::Value::Number(n) => n
                    .as_f64()
                    .ok_or_else(|| format!("{n} is not a duration"))
                    .and_then(|secs| {
                        Duration::try_from_secs_f64(secs).map_err(|e| format!("'{n}': {e}"))
                    }),
                other => Err(format!(
                    "{other} is not a duration (examples: 500ms, 2s, 1m)"
                )),
            };
            match parsed {
                Ok(d) if d <= MAX_DELAY => *into = millis(d),
                Ok(_) => problems.push((key.into(), "must be at most 1 hour".into())),
                Err(e) => problems.push((key.into(), e)),
            }
        };
        duration("backoff", &self.backoff, &mut p.backoff_ms);
        duration("max_delay", &self.max_delay, &mut p.max_delay_ms);
        if p.max_delay_ms < p.backoff_ms && self.max_delay.is_some() {
            problems.push((
                "max_delay".into(),
                "must not be shorter than backoff".into(),
            ));
        }
        p.max_delay_ms = p.max_delay_ms.max(p.backoff_ms);
        if let Some(on) = &self.on {
            match on.as_array() {
                Some(words) if !words.is_empty() => {
                    let mut causes = Vec::new();
                    for w in words {
                        match w.as_str().and_then(RetryOn::parse) {
                            Some(c) => causes.push(c),
                            None => problems.push((
                                "on".into(),
                                format!(
                                    "unknown cause {w} (allowed: timeout, exit, invalid_reply, spawn)"
                                ),
                            )),
                        }
                    }
                    causes.sort();
                    causes.dedup();
                    p.on = causes;
                }
                _ => problems.push((
                    "on".into(),
                    "must be a non-empty list of: timeout, exit, invalid_reply, spawn".into(),
                )),
            }
        }
        if problems.is_empty() {
            Ok(p)
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(yaml: &str) -> RetrySrc {
        crate::yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_policy_is_read_with_defaults_and_every_problem_named() {
        let p = src("attempts: 4\nbackoff: 500ms\non: [exit, timeout, exit]")
            .check()
            .unwrap();
        assert_eq!(p.attempts, 4);
        assert_eq!(p.backoff_ms, 500);
        assert_eq!(p.max_delay_ms, 60_000);
        assert_eq!(p.on, [RetryOn::Timeout, RetryOn::Exit]);
        let p = src("attempts: 2\nbackoff: 2").check().unwrap();
        assert_eq!((p.backoff_ms, p.on.as_slice()), (2000, &DEFAULT_ON[..]));
        let e = src("attempts: 0\nbackoff: soon\nmax_delay: 2h\non: [rain]\ntries: 3")
            .check()
            .unwrap_err();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["tries", "attempts", "backoff", "max_delay", "on"],
            "{e:?}"
        );
        let e = src("backoff: 1s").check().unwrap_err();
        assert_eq!(e[0].0, "attempts");
        let e = src("attempts: 3\nbackoff: 10s\nmax_delay: 1s")
            .check()
            .unwrap_err();
        assert_eq!(e[0].0, "max_delay");
    }

    #[test]
    fn waits_double_up_to_the_cap_with_jitter_in_the_upper_half() {
        let p = RetryPolicy {
            attempts: 10,
            backoff_ms: 100,
            max_delay_ms: 1000,
            on: DEFAULT_ON.to_vec(),
        };
        let base: Vec<u64> = (1..=6)
            .map(|r| p.base_delay(r).as_millis() as u64)
            .collect();
        assert_eq!(base, [100, 200, 400, 800, 1000, 1000]);
        for r in 1..=6 {
            for random in [0, 1, 7, 1234, u64::MAX] {
                let d = p.delay(r, random);
                assert!(
                    d >= p.base_delay(r) / 2 && d <= p.base_delay(r),
                    "{r} {random} {d:?}"
                );
            }
        }
        // A huge retry number saturates, never overflows.
        assert_eq!(p.base_delay(u32::MAX), Duration::from_millis(1000));
        assert!(p.retries(RetryOn::Exit, 9));
        assert!(!p.retries(RetryOn::Exit, 10), "ten calls in all");
        assert!(!p.retries(RetryOn::Spawn, 1), "not a cause it names");
    }

    #[test]
    fn the_command_line_overrides_the_workflow() {
        let set = RetryPolicy {
            attempts: 5,
            backoff_ms: 2000,
            max_delay_ms: 4000,
            on: vec![RetryOn::InvalidReply],
        };
        let off = RetryOverride {
            retries: Some(0),
            backoff: None,
        };
        assert_eq!(off.apply(Some(&set)).attempts, 1);
        let faster = RetryOverride {
            retries: None,
            backoff: Some(Duration::from_millis(10)),
        };
        let p = faster.apply(Some(&set));
        assert_eq!((p.attempts, p.backoff_ms, p.max_delay_ms), (5, 10, 4000));
        assert_eq!(p.on, [RetryOn::InvalidReply]);
        let slower = RetryOverride {
            retries: Some(1000),
            backoff: Some(Duration::from_secs(10)),
        };
        let p = slower.apply(Some(&set));
        assert_eq!((p.attempts, p.max_delay_ms), (MAX_ATTEMPTS, 10_000));
    }
}
