//! `thread watch` and `thread list --watch`: print what the library's
//! watches hand over (`Engine::watch_steps`, `Engine::watch_threads`;
//! `docs/design.md` §7d).

use std::ops::ControlFlow;

use uwf_db::Store;
use uwf_db::engine::Cancel;
use uwf_db::engine::watch::WatchEnd;
use uwf_db::thread::ThreadQuery;

use crate::output::{self, Output};
use crate::render::{entry_line, labels_text};
use crate::{Cli, CliError};

/// The library's callbacks return engine errors; a failed write to stdout
/// is kept here and reported as itself (a closed pipe exits 0).
fn printed(
    result: Result<(), CliError>,
    kept: &mut Option<CliError>,
) -> Result<ControlFlow<()>, uwf_db::engine::EngineError> {
    match result {
        Ok(()) => Ok(ControlFlow::Continue(())),
        Err(e) => {
            *kept = Some(e);
            Ok(ControlFlow::Break(()))
        }
    }
}

/// `thread watch ID [--after SEQ]`.
pub fn thread(
    cli: &Cli,
    id: &uwf_db::thread::IdPrefix,
    after: u64,
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let id = store.threads().resolve(id)?;
    let mut last = after;
    let mut failed = None;
    let end = store.engine().watch_steps(id, after, cancel, &mut |e| {
        let line = if out.json {
            uwf_db::api::LogEntry::read(&store, e)
                .map_err(CliError::from)
                .and_then(|v| Ok(out.json_value(&v)?))
        } else {
            entry_line(&store, e).and_then(|l| Ok(out.line(l)?))
        };
        last = e.node.seq;
        printed(line.and_then(|()| Ok(out.flush()?)), &mut failed)
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let WatchEnd::Settled(record) = end
        && !out.json
    {
        out.line(format_args!(
            "thread {id} is {} (last step #{last}; resume the watch with --after {last})",
            record.underlying_status()
        ))?;
    }
    Ok(())
}

/// `thread list --watch [filters]`.
pub fn list(
    store: &Store,
    query: &ThreadQuery,
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    let mut failed = None;
    store.engine().watch_threads(query, cancel, &mut |r| {
        let at = r.last_activity();
        let line = if out.json {
            out.json_value(&uwf_db::api::ThreadActivity::from(r))
        } else {
            out.line(format_args!(
                "{}  {}  {:<10} {}  seq {}{}{}",
                output::timestamp(at),
                r.id,
                r.status.to_string(),
                r.workflow,
                r.seq,
                if r.labels.is_empty() {
                    String::new()
                } else {
                    format!("  {}", labels_text(&r.labels))
                },
                if r.last_error.is_some() {
                    "  (last attempt failed)"
                } else {
                    ""
                }
            ))
        };
        printed(
            line.and_then(|()| out.flush()).map_err(CliError::from),
            &mut failed,
        )
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
