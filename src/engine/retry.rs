//! Retrying a step's agent calls (SPEC §13; `docs/design.md` §5f): which
//! failures a policy covers, the jittered wait, and the record of every
//! failed attempt kept on the step that finally answered.
//!
//! The policy itself ([`RetryPolicy`](crate::workflow::RetryPolicy)) is the
//! workflow's; the attempts loop is in `step.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::StepFailure;
use super::agent::AgentError;
use super::cancel::Cancel;
use crate::node::Value;
use crate::thread::ThreadId;
use crate::usage::StepUsage;
use crate::workflow::RetryOn;

/// The state node meta key that holds a step's failed attempts (a list,
/// oldest first; absent when the first attempt answered).
pub const ATTEMPTS_META: &str = "$attempts";

/// Longest error text kept per failed attempt: 1 KiB.
const MAX_ATTEMPT_ERROR: usize = 1 << 10;

/// A failed attempt of a step, as kept on the step that answered.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAttempt {
    /// When the attempt started (ms since the epoch).
    pub at_ms: u64,
    /// Why it failed.
    pub cause: RetryOn,
    /// What failed (the step failure's text, cut to 1 KiB).
    pub error: String,
    /// Its calls (the call and its re-asks).
    pub usage: StepUsage,
    /// The wait before the next attempt, in ms.
    pub delay_ms: u64,
}

impl FailedAttempt {
    /// The meta value: `{at, cause, error, usage, delay_ms}`.
    pub fn to_value(&self) -> Value {
        Value::Map(BTreeMap::from([
            ("at".to_owned(), Value::UInt(self.at_ms)),
            (
                "cause".to_owned(),
                Value::Str(self.cause.as_str().to_owned()),
            ),
            ("error".to_owned(), Value::Str(self.error.clone())),
            ("usage".to_owned(), self.usage.to_value()),
            ("delay_ms".to_owned(), Value::UInt(self.delay_ms)),
        ]))
    }
}

/// Which retry cause an agent's error is; `None` for a failure no retry
/// can mend (an agent spec or scenario that is wrong).
pub(crate) fn cause_of(e: &AgentError) -> Option<RetryOn> {
    match e {
        AgentError::Timeout(_) => Some(RetryOn::Timeout),
        AgentError::Spawn { .. } => Some(RetryOn::Spawn),
        AgentError::Exit { .. }
        | AgentError::Reported { .. }
        | AgentError::NoResult(_)
        | AgentError::OutputHeld { .. }
        | AgentError::NotUtf8
        | AgentError::ReplyTooLarge { .. }
        | AgentError::Other(_) => Some(RetryOn::Exit),
        AgentError::BadSpec(_)
        | AgentError::ScenarioUnreadable { .. }
        | AgentError::ScenarioYaml { .. }
        | AgentError::Scenario { .. }
        | AgentError::RoleMismatch { .. }
        | AgentError::PastEnd { .. }
        | AgentError::NoProgram => None,
    }
}

/// A number for the jitter of `thread`'s retry `attempt`: its id, the
/// attempt and the clock, hashed (threads that fail together wait apart).
pub(crate) fn jitter(thread: ThreadId, attempt: u32) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = blake3::Hasher::new();
    h.update(thread.to_string().as_bytes());
    h.update(&attempt.to_le_bytes());
    h.update(&nanos.to_le_bytes());
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// `error`, cut to [`MAX_ATTEMPT_ERROR`] at a character boundary.
pub(crate) fn short_error(error: &str) -> String {
    if error.len() <= MAX_ATTEMPT_ERROR {
        return error.to_owned();
    }
    let mut end = MAX_ATTEMPT_ERROR;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", error.get(..end).unwrap_or_default())
}

/// Waits `delay` before a retry: `false` when the token asked to stop
/// (cancelled, or stop after the step in flight) meanwhile.
pub(crate) fn wait(cancel: &Cancel, delay: Duration) -> bool {
    let until = std::time::Instant::now() + delay;
    loop {
        if cancel.is_stopping() {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// The failure a step records: `last`, saying how many attempts were made
/// when there were earlier ones (`failed`).
pub(crate) fn after_attempts(last: StepFailure, failed: &[FailedAttempt]) -> StepFailure {
    if failed.is_empty() {
        return last;
    }
    StepFailure::Retried {
        attempts: u32::try_from(failed.len() + 1).unwrap_or(u32::MAX),
        causes: failed.iter().map(|a| a.cause).collect(),
        last: Box::new(last),
    }
}

/// The failed attempts a state node's meta holds (empty when none).
pub fn attempts_of(meta: &BTreeMap<String, Value>) -> Vec<AttemptEntry> {
    let Some(Value::Array(list)) = meta.get(ATTEMPTS_META) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| {
            let Value::Map(m) = v else { return None };
            let uint = |k: &str| match m.get(k) {
                Some(Value::UInt(n)) => *n,
                _ => 0,
            };
            let text = |k: &str| match m.get(k) {
                Some(Value::Str(s)) => s.clone(),
                _ => String::new(),
            };
            let usage = m.get("usage").map(|u| {
                StepUsage::of_meta(&BTreeMap::from([(
                    crate::usage::USAGE_META.to_owned(),
                    u.clone(),
                )]))
                .unwrap_or_default()
            });
            Some(AttemptEntry {
                at: uint("at"),
                cause: text("cause"),
                error: text("error"),
                usage: usage.unwrap_or_default(),
                delay_ms: uint("delay_ms"),
            })
        })
        .collect()
}

/// A failed attempt of a step, as `thread log` gives it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct AttemptEntry {
    /// When it started (ms since the epoch).
    pub at: u64,
    /// Why it failed: `timeout`, `exit`, `invalid_reply` or `spawn`.
    pub cause: String,
    /// What failed (cut to 1 KiB).
    pub error: String,
    /// Its calls.
    pub usage: StepUsage,
    /// The wait before the next attempt, in ms.
    pub delay_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_attempts_round_trip_through_the_meta() {
        let mut usage = StepUsage::default();
        usage.add_call(12, None);
        let a = FailedAttempt {
            at_ms: 1000,
            cause: RetryOn::Exit,
            error: "HTTP 429".into(),
            usage: usage.clone(),
            delay_ms: 250,
        };
        let meta = BTreeMap::from([(ATTEMPTS_META.to_owned(), Value::Array(vec![a.to_value()]))]);
        assert_eq!(
            attempts_of(&meta),
            [AttemptEntry {
                at: 1000,
                cause: "exit".into(),
                error: "HTTP 429".into(),
                usage,
                delay_ms: 250,
            }]
        );
        assert!(attempts_of(&BTreeMap::new()).is_empty());
        assert_eq!(short_error(&"é".repeat(1000)).chars().count(), 513);
    }

    #[test]
    fn only_what_a_retry_can_mend_is_retried() {
        assert_eq!(
            cause_of(&AgentError::Timeout(Duration::from_secs(1))),
            Some(RetryOn::Timeout)
        );
        let exit = AgentError::Exit {
            status: "exit status: 1".into(),
            stderr: "HTTP 429".into(),
        };
        assert_eq!(cause_of(&exit), Some(RetryOn::Exit));
        assert_eq!(
            cause_of(&AgentError::Other("offline".into())),
            Some(RetryOn::Exit)
        );
        assert_eq!(cause_of(&AgentError::NoProgram), None);
        assert_eq!(cause_of(&AgentError::BadSpec("x".into())), None);
    }
}
