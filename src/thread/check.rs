//! Checks of a thread record against the chain it points to.

use super::{END_ROLE, MAX_ANCESTORS, ThreadRecord, ThreadStatus};
use crate::hash::Hash;
use crate::node::{Blob, Value};

/// What is wrong with `record` against the chain it points to (`None`:
/// nothing), as the field, a colon, then the problem: the checks
/// [`crate::bundle::import_with`](crate::crate::bundle::import_with) makes of every record
/// of a bundle, and `verify` of every stored one. `node` reads a node;
/// the walk from the head reads at most `max_nodes` of them (`verify`
/// reads the head alone; what needs the whole chain — every node's
/// seq, `last_end_seq` — is checked only when the walk reached the start).
pub(crate) fn check_against_chain<E>(
    record: &ThreadRecord,
    max_nodes: usize,
    node: &mut dyn FnMut(&Hash) -> Result<Option<Blob>, E>,
) -> Result<Option<String>, E> {
    // A driver's claim (`running`) stands for the status underneath.
    let status = record.underlying_status();
    if status == ThreadStatus::Running {
        return Ok(Some(
            "status: it is running with no status underneath the claim".into(),
        ));
    }
    let start = match node(&record.start)? {
        Some(Blob::Start(s)) => s,
        _ => return Ok(Some(format!("start: {} is not a start node", record.start))),
    };
    if start.workflow != record.workflow_hash {
        return Ok(Some(format!(
            "workflow_hash: it is {} but its start node runs {}",
            record.workflow_hash, start.workflow
        )));
    }
    if start.name != record.workflow {
        return Ok(Some(format!(
            "workflow: it is {:?} but its start node runs {:?}",
            record.workflow, start.name
        )));
    }
    // Walk the chain from the head to the start.
    let mut head_end: Option<u8> = None;
    let mut last_end: Option<u64> = None;
    let mut walked_all = true;
    if record.head == record.start {
        if record.seq != 0 {
            return Ok(Some(format!(
                "seq: it is {} but the head is the start node (seq 0)",
                record.seq
            )));
        }
    } else {
        let mut at = record.head;
        let mut want_seq = record.seq;
        let mut child_ancestors: Option<Vec<Hash>> = None;
        let mut read = 0;
        loop {
            if read == max_nodes {
                walked_all = false;
                break;
            }
            read += 1;
            let s = match node(&at)? {
                Some(Blob::State(s)) => s,
                Some(other) => {
                    return Ok(Some(format!(
                        "head: node {at} on its chain is a {} blob, not a state node",
                        other.kind()
                    )));
                }
                None => return Ok(Some(format!("head: node {at} on its chain is missing"))),
            };
            if s.seq != want_seq {
                return Ok(Some(if at == record.head {
                    format!("seq: it is {} but its head has seq {}", record.seq, s.seq)
                } else {
                    format!(
                        "seq: node {at} on its chain has seq {}, not {want_seq} (the chain is not one step per node)",
                        s.seq
                    )
                }));
            }
            if s.start != record.start {
                return Ok(Some(format!(
                    "start: node {at} on its chain belongs to start {}",
                    s.start
                )));
            }
            if let Some(older) = &child_ancestors {
                let expected: Vec<Hash> = s
                    .ancestors
                    .iter()
                    .take(MAX_ANCESTORS - 1)
                    .copied()
                    .collect();
                if older.get(1..).unwrap_or_default() != expected.as_slice() {
                    return Ok(Some(format!(
                        "head: the ancestors of the node after {at} are not the ones the chain gives"
                    )));
                }
            }
            if s.role == END_ROLE {
                let rc = match s.meta.get("return_code") {
                    Some(Value::UInt(n)) => u8::try_from(*n).ok(),
                    _ => None,
                };
                let Some(rc) = rc else {
                    return Ok(Some(format!(
                        "head: end node {at} has no valid return code"
                    )));
                };
                if at == record.head {
                    head_end = Some(rc);
                }
                last_end.get_or_insert(s.seq);
            }
            if s.seq == 1 {
                if !s.ancestors.is_empty() {
                    return Ok(Some(format!(
                        "head: node {at} has seq 1 but names ancestors"
                    )));
                }
                break;
            }
            let Some(parent) = s.ancestors.first().copied() else {
                return Ok(Some(format!(
                    "seq: node {at} has seq {} but names no parent",
                    s.seq
                )));
            };
            child_ancestors = Some(s.ancestors);
            at = parent;
            want_seq -= 1;
        }
    }
    match head_end {
        Some(rc) if status != ThreadStatus::for_return_code(rc) => {
            return Ok(Some(format!(
                "status: it is {status} but its head is an end node with return code {rc}"
            )));
        }
        None if status.is_done() => {
            return Ok(Some(format!(
                "status: it is {status} but its head is not an end node"
            )));
        }
        _ => {}
    }
    if record.completed_at.is_some() != status.is_done() {
        return Ok(Some(format!(
            "completed_at: it is {} for a {status} thread",
            if record.completed_at.is_some() {
                "set"
            } else {
                "unset"
            },
        )));
    }
    if walked_all && record.last_end_seq != last_end.unwrap_or(0) {
        return Ok(Some(format!(
            "last_end_seq: it is {} but the newest end node on the chain has seq {}",
            record.last_end_seq,
            last_end.unwrap_or(0)
        )));
    }
    if record.agent_steps.is_some_and(|n| n > record.seq) {
        return Ok(Some(format!(
            "agent_steps: it is {:?}, more than the chain's {} steps",
            record.agent_steps, record.seq
        )));
    }
    Ok(None)
}
