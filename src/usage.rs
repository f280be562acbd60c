//! What agent calls cost (SPEC §11; `docs/design.md` §5e): the wall time
//! the engine measures for every call, and the tokens, cost and model an
//! agent may report.
//!
//! - A `cmd:` (or scripted) agent reports through the reserved frontmatter
//!   key `$usage: {input_tokens, output_tokens, cost_usd, model}`, which
//!   is taken out before the role's schema sees the frontmatter; a Rust
//!   agent sets [`AgentReply::usage`](crate::engine::agent::AgentReply::usage).
//!   Every field is optional and a malformed one is ignored (an agent's
//!   report is never a reason to fail its step).
//! - Each role step keeps its calls (the answer and any re-asks) in its
//!   state node, under the meta key [`USAGE_META`] ([`StepUsage`]).
//! - Each thread record keeps running totals of the calls made for it
//!   (steps, re-asks, compaction summaries, failed attempts):
//!   [`UsageTotals`], in `ThreadRecord::usage`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::Value;

/// The state node meta key that holds a step's [`StepUsage`].
pub const USAGE_META: &str = "$usage";

/// Longest model name kept (longer ones are cut).
const MAX_MODEL: usize = 200;

/// What one agent call reported; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Completion tokens.
    pub output_tokens: Option<u64>,
    /// What the call cost, in US dollars.
    pub cost_usd: Option<f64>,
    /// The model that answered.
    pub model: Option<String>,
}

impl Usage {
    /// A `$usage` frontmatter value: an object whose known fields are
    /// taken when well-formed (tokens: non-negative integers; cost: a
    /// finite, non-negative number; model: a string) and whose other
    /// fields are ignored. Anything but an object is `None`.
    pub fn from_json(value: &serde_json::Value) -> Option<Usage> {
        let map = value.as_object()?;
        let cost = map
            .get("cost_usd")
            .and_then(serde_json::Value::as_f64)
            .filter(|c| c.is_finite() && *c >= 0.0);
        let model = map.get("model").and_then(|m| m.as_str()).map(|m| {
            let mut end = m.len().min(MAX_MODEL);
            while !m.is_char_boundary(end) {
                end -= 1;
            }
            m.get(..end).unwrap_or_default().to_owned()
        });
        Some(Usage {
            input_tokens: map.get("input_tokens").and_then(serde_json::Value::as_u64),
            output_tokens: map.get("output_tokens").and_then(serde_json::Value::as_u64),
            cost_usd: cost,
            model,
        })
    }
}

/// The calls of one role step (its answer and any re-asks): what
/// `thread log --json` shows as `usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StepUsage {
    /// Agent calls.
    pub calls: u64,
    /// Their wall time, in ms.
    pub wall_ms: u64,
    /// Input tokens the calls reported (`None`: none reported any).
    pub input_tokens: Option<u64>,
    /// Output tokens the calls reported.
    pub output_tokens: Option<u64>,
    /// Cost the calls reported.
    pub cost_usd: Option<f64>,
    /// The model the last call that named one reported.
    pub model: Option<String>,
}

/// `sum + more` where either may be unknown; integers saturate (an
/// agent's report may be any number).
fn add_tokens(sum: Option<u64>, more: Option<u64>) -> Option<u64> {
    match (sum, more) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// [`add_tokens`] for costs (finite and non-negative by [`Usage::from_json`]).
fn add_cost(sum: Option<f64>, more: Option<f64>) -> Option<f64> {
    match (sum, more) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

impl StepUsage {
    /// Counts one call of `wall_ms` that reported `usage`.
    pub fn add_call(&mut self, wall_ms: u64, usage: Option<&Usage>) {
        self.calls += 1;
        self.wall_ms = self.wall_ms.saturating_add(wall_ms);
        if let Some(u) = usage {
            self.input_tokens = add_tokens(self.input_tokens, u.input_tokens);
            self.output_tokens = add_tokens(self.output_tokens, u.output_tokens);
            self.cost_usd = add_cost(self.cost_usd, u.cost_usd);
            if u.model.is_some() {
                self.model.clone_from(&u.model);
            }
        }
    }

    /// Adds `other`'s calls (an attempt's, to its step's).
    pub fn add(&mut self, other: &StepUsage) {
        self.calls = self.calls.saturating_add(other.calls);
        self.wall_ms = self.wall_ms.saturating_add(other.wall_ms);
        self.input_tokens = add_tokens(self.input_tokens, other.input_tokens);
        self.output_tokens = add_tokens(self.output_tokens, other.output_tokens);
        self.cost_usd = add_cost(self.cost_usd, other.cost_usd);
        if other.model.is_some() {
            self.model.clone_from(&other.model);
        }
    }

    /// The meta value stored in the step's state node (absent fields left
    /// out).
    pub fn to_value(&self) -> Value {
        let mut m = BTreeMap::from([
            ("calls".to_owned(), Value::UInt(self.calls)),
            ("wall_ms".to_owned(), Value::UInt(self.wall_ms)),
        ]);
        if let Some(n) = self.input_tokens {
            m.insert("input_tokens".into(), Value::UInt(n));
        }
        if let Some(n) = self.output_tokens {
            m.insert("output_tokens".into(), Value::UInt(n));
        }
        if let Some(c) = self.cost_usd {
            m.insert("cost_usd".into(), Value::Float(c));
        }
        if let Some(model) = &self.model {
            m.insert("model".into(), Value::Str(model.clone()));
        }
        Value::Map(m)
    }

    /// The usage a state node's meta holds, if any.
    pub fn of_meta(meta: &BTreeMap<String, Value>) -> Option<StepUsage> {
        let Some(Value::Map(m)) = meta.get(USAGE_META) else {
            return None;
        };
        let uint = |k: &str| match m.get(k) {
            Some(Value::UInt(n)) => Some(*n),
            _ => None,
        };
        Some(StepUsage {
            calls: uint("calls").unwrap_or(0),
            wall_ms: uint("wall_ms").unwrap_or(0),
            input_tokens: uint("input_tokens"),
            output_tokens: uint("output_tokens"),
            cost_usd: match m.get("cost_usd") {
                Some(Value::Float(c)) => Some(*c),
                Some(Value::UInt(n)) => Some(*n as f64),
                _ => None,
            },
            model: match m.get("model") {
                Some(Value::Str(s)) => Some(s.clone()),
                _ => None,
            },
        })
    }
}

/// Totals over many calls: a thread's, a batch's, a store's. Tokens and
/// cost add up what the calls reported (a call that reported nothing adds
/// only to `calls` and `wall_ms`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageTotals {
    /// Agent calls.
    pub calls: u64,
    /// Their wall time, in ms.
    pub wall_ms: u64,
    /// Input tokens reported.
    pub input_tokens: u64,
    /// Output tokens reported.
    pub output_tokens: u64,
    /// Cost reported, in US dollars.
    pub cost_usd: f64,
}

impl UsageTotals {
    /// Adds another total.
    pub fn add(&mut self, other: &UsageTotals) {
        self.calls = self.calls.saturating_add(other.calls);
        self.wall_ms = self.wall_ms.saturating_add(other.wall_ms);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_usd += other.cost_usd;
    }

    /// Adds a step's calls.
    pub fn add_step(&mut self, step: &StepUsage) {
        self.add(&UsageTotals {
            calls: step.calls,
            wall_ms: step.wall_ms,
            input_tokens: step.input_tokens.unwrap_or(0),
            output_tokens: step.output_tokens.unwrap_or(0),
            cost_usd: step.cost_usd.unwrap_or(0.0),
        });
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.calls == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_taken_leniently() {
        let u = Usage::from_json(&serde_json::json!({
            "input_tokens": 10, "output_tokens": -3, "cost_usd": 0.5,
            "model": "m".repeat(300), "other": true
        }))
        .unwrap();
        assert_eq!(u.input_tokens, Some(10));
        assert_eq!(u.output_tokens, None, "negative: ignored");
        assert_eq!(u.cost_usd, Some(0.5));
        assert_eq!(u.model.unwrap().len(), MAX_MODEL);
        assert_eq!(Usage::from_json(&serde_json::json!("lots")), None);
        let u = Usage::from_json(&serde_json::json!({"cost_usd": -1.0})).unwrap();
        assert_eq!(u.cost_usd, None);
    }

    #[test]
    fn step_usage_sums_calls_and_round_trips_through_meta() {
        let mut s = StepUsage::default();
        s.add_call(5, None);
        s.add_call(
            7,
            Some(&Usage {
                input_tokens: Some(100),
                output_tokens: Some(20),
                cost_usd: Some(0.25),
                model: Some("m1".into()),
            }),
        );
        s.add_call(
            1,
            Some(&Usage {
                input_tokens: Some(1),
                ..Usage::default()
            }),
        );
        assert_eq!(s.calls, 3);
        assert_eq!(s.wall_ms, 13);
        assert_eq!(s.input_tokens, Some(101));
        assert_eq!(s.output_tokens, Some(20));
        assert_eq!(s.model.as_deref(), Some("m1"));
        let meta = BTreeMap::from([(USAGE_META.to_owned(), s.to_value())]);
        assert_eq!(StepUsage::of_meta(&meta), Some(s.clone()));
        let mut t = UsageTotals::default();
        t.add_step(&s);
        t.add_step(&s);
        assert_eq!((t.calls, t.wall_ms, t.input_tokens), (6, 26, 202));
        assert!((t.cost_usd - 0.5).abs() < 1e-12);
        // Reports at the edge of u64 saturate instead of overflowing.
        let huge = Usage {
            input_tokens: Some(u64::MAX),
            ..Usage::default()
        };
        let mut s = StepUsage::default();
        s.add_call(0, Some(&huge));
        s.add_call(0, Some(&huge));
        assert_eq!(s.input_tokens, Some(u64::MAX));
    }
}
