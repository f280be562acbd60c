//! Answers about a whole store: init, verify, stats, batches, retention,
//! salvage.

use schemars::JsonSchema;
use serde::Serialize;

use crate::engine::batch::BatchReport;
use crate::salvage::SalvageReport;
use crate::store::{Durability, Stats};
use crate::thread::RetentionPolicy;
use crate::usage::UsageTotals;
use crate::verify::{Problem, VerifyReport};

/// `init`: the store and whether this call made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct StoreInit {
    /// Whether the store was created now (false: it existed).
    pub created: bool,
    /// The store's format version.
    pub format_version: u32,
    /// Where it is (a directory, or a URL with the password hidden).
    pub path: String,
}

/// `verify`: what was checked and every problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct VerifyAnswer {
    /// Blobs hashed and decoded.
    pub blobs_checked: u64,
    /// Index entries checked against their records.
    pub index_entries_checked: u64,
    /// No problem found.
    pub ok: bool,
    /// The problems, each with its message.
    pub problems: Vec<VerifyProblem>,
    /// References followed.
    pub refs_checked: u64,
}

/// One problem of a [`VerifyAnswer`]: its kind (`problem`) and fields, and
/// its message in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct VerifyProblem {
    /// The problem.
    #[serde(flatten)]
    pub problem: Problem,
    /// What it means, in words.
    pub message: String,
}

impl From<&VerifyReport> for VerifyAnswer {
    fn from(report: &VerifyReport) -> Self {
        VerifyAnswer {
            blobs_checked: report.blobs_checked,
            index_entries_checked: report.index_entries_checked,
            ok: report.is_ok(),
            problems: report
                .problems
                .iter()
                .map(|p| VerifyProblem {
                    problem: p.clone(),
                    message: p.to_string(),
                })
                .collect(),
            refs_checked: report.refs_checked,
        }
    }
}

/// `stats`: counts and sizes, with the usage of every agent call stored.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct StatsAnswer {
    /// Counts and sizes.
    #[serde(flatten)]
    pub stats: Stats,
    /// Usage totals of every thread.
    pub usage: UsageTotals,
}

/// The last line of `batch --json`: what the batch did.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct BatchSummary {
    /// The durability its commits had.
    pub durability: Durability,
    /// Steps committed per second of wall time.
    pub steps_per_sec: f64,
    /// The counts.
    pub summary: BatchReport,
}

impl BatchSummary {
    /// The summary of `report`, committed with `durability`.
    pub fn of(report: BatchReport, durability: Durability) -> Self {
        let steps_per_sec = if report.elapsed_ms == 0 {
            0.0
        } else {
            report.steps as f64 * 1000.0 / report.elapsed_ms as f64
        };
        BatchSummary {
            durability,
            steps_per_sec,
            summary: report,
        }
    }
}

/// `prune --set | --unset | --show`: the stored retention policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct PolicyAnswer {
    /// The policy stored now (none: no policy).
    pub policy: Option<RetentionPolicy>,
}

/// `salvage`: what was kept, dropped and lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SalvageAnswer {
    /// Whether every row of the source was kept.
    pub complete: bool,
    /// The new store.
    pub destination: String,
    /// Table by table.
    pub report: SalvageReport,
    /// The damaged store.
    pub source: String,
    /// What the source's readers said (crashes, pages given up).
    pub source_notes: Vec<String>,
}
