//! The sweep (`docs/design.md` §7, phase 5): candidates deleted in short
//! write transactions, every candidate before the candidates it reaches,
//! each re-read in its deleting transaction so that one a writer re-linked
//! is rescued with everything it reaches.

use std::collections::HashMap;

use super::graph::{Graph, Id, Marks};
use super::{GcError, GcProgress, GcReport, SWEEP_BATCH};
use crate::backend::Table;
use crate::hash::HASH_LEN;
use crate::store::record::touched_at;
use crate::store::{Store, StoreError};

/// Deletes the candidates, every candidate before those it refers to,
/// re-reading each in the deleting transaction and rescuing those a
/// writer touched since the scan (with every candidate they reach).
pub(super) fn sweep(
    store: &Store,
    graph: &Graph,
    candidates: &[Id],
    keep_after: u64,
    report: &mut GcReport,
    progress: &(dyn Fn(GcProgress) + Sync),
) -> Result<(), GcError> {
    let order = referrers_first(graph, candidates);
    let is_candidate = Marks::new(graph);
    for &c in candidates {
        is_candidate.set(c);
    }
    let rescued = Marks::new(graph);
    let total = order.len() as u64;
    let mut done = 0u64;
    for batch in order.chunks(SWEEP_BATCH) {
        let (swept, freed, saved) = store.write_exclusive(|w| {
            let t = w.tables_mut();
            let (mut swept, mut freed, mut saved) = (0u64, 0u64, 0u64);
            // Decide in sweep order (a rescue reaches only later
            // candidates), then delete in key order, which touches each
            // B-tree page once per batch.
            let mut doomed = Vec::with_capacity(batch.len());
            for &i in batch {
                if rescued.get(i) {
                    continue;
                }
                let Some(value) = t.get(Table::Blobs, graph.hash(i).as_bytes())? else {
                    continue;
                };
                if touched_at(&value).unwrap_or(u64::MAX) >= keep_after {
                    saved += rescue(graph, &is_candidate, &rescued, i);
                } else {
                    doomed.push((i, value.len()));
                }
            }
            doomed.sort_unstable();
            for (i, len) in doomed {
                t.delete(Table::Blobs, graph.hash(i).as_bytes())?;
                swept += 1;
                freed += (HASH_LEN + len) as u64;
            }
            Ok::<_, StoreError>((swept, freed, saved))
        })?;
        report.swept += swept;
        report.bytes_freed += freed;
        report.rescued += saved;
        done += batch.len() as u64;
        progress(GcProgress::Swept { done, total });
    }
    Ok(())
}

/// Marks `from` and every candidate it reaches as rescued; returns how many
/// were newly rescued.
fn rescue(graph: &Graph, is_candidate: &Marks, rescued: &Marks, from: Id) -> u64 {
    let mut n = 0;
    let mut stack = vec![from];
    while let Some(i) = stack.pop() {
        if !rescued.set(i) {
            continue;
        }
        n += 1;
        for j in graph.edges(i) {
            if is_candidate.get(j) && !rescued.get(j) {
                stack.push(j);
            }
        }
    }
    n
}

/// The candidates ordered so that each comes before every candidate it
/// refers to (Kahn's algorithm on the candidate subgraph, a DAG).
#[allow(clippy::indexing_slicing)] // `k` comes from `slot`: a position in `candidates`
fn referrers_first(graph: &Graph, candidates: &[Id]) -> Vec<Id> {
    let slot: HashMap<Id, usize> = candidates
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    let targets = |i: Id| graph.edges(i).filter_map(|j| slot.get(&j).map(|&k| (j, k)));
    let mut referrers = vec![0u32; candidates.len()];
    for &i in candidates {
        for (_, k) in targets(i) {
            referrers[k] += 1;
        }
    }
    let mut ready: Vec<Id> = candidates
        .iter()
        .copied()
        .filter(|i| referrers[slot[i]] == 0)
        .collect();
    let mut order = Vec::with_capacity(candidates.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for (j, k) in targets(i) {
            referrers[k] -= 1;
            if referrers[k] == 0 {
                ready.push(j);
            }
        }
    }
    order
}
