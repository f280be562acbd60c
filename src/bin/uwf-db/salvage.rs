//! `uwf-db salvage SRC DST`: everything still readable in a damaged store,
//! copied into a new one (the library's `salvage` decides what is kept).
//!
//! Every read of an LMDB SRC runs in a child process (this program as
//! `uwf-db salvage-read`, not listed in the help) through the library's
//! [`ReaderProcesses`]: a page that makes LMDB crash costs that child only.
//! This process never maps SRC.

use std::path::Path;
use std::process::Command;

use uwf_db::Store;
use uwf_db::backend::Table;
use uwf_db::hash::hex;
use uwf_db::salvage::process::{ReaderProcesses, ServeError, serve_read};
use uwf_db::salvage::{SalvageReport, StoreSource, salvage};

use crate::output::{self, Output};
use crate::{Cli, CliError};

/// `uwf-db salvage SRC DST`.
pub fn run(cli: &Cli, source: &Path, destination: &Path, out: &mut Output) -> Result<(), CliError> {
    let postgres = source
        .to_str()
        .is_some_and(uwf_db::backend::is_postgres_url);
    if !postgres && !source.join("data.mdb").is_file() {
        return Err(CliError::Failed(format!(
            "no LMDB data file at {}: salvage reads an existing store",
            source.join("data.mdb").display()
        )));
    }
    if !postgres
        && let (Ok(a), Ok(b)) = (source.canonicalize(), destination.canonicalize())
        && a == b
    {
        return Err(CliError::Failed(format!(
            "SRC and DST are the same store ({}): salvage writes a new store",
            a.display()
        )));
    }
    if !destination
        .to_str()
        .is_some_and(uwf_db::backend::is_postgres_url)
    {
        // Never create a store among someone's files.
        uwf_db::copy::check_destination_dir(destination)?;
    }
    let dst = cli.open_at(destination, true)?;
    let bar = output::progress_bar(0, "salvaging");
    let progress = |table: &str| bar.set_message(format!("salvaging {table}"));
    let (report, notes) = if postgres {
        // A server's pages are the server's to protect: read in-process.
        let src = cli.open_at(source, false)?;
        (salvage(&mut StoreSource(&src), &dst, progress), Vec::new())
    } else {
        let mut readers = ReaderProcesses::new(source, destination, reader_command(cli)?)?;
        let report = salvage(&mut readers, &dst, progress);
        (report, readers.notes().to_vec())
    };
    bar.finish_and_clear();
    let report = report?;
    if out.json {
        out.json_value(&uwf_db::api::SalvageAnswer {
            complete: report.is_complete(),
            destination: dst.location().to_owned(),
            report: report.clone(),
            source: source.display().to_string(),
            source_notes: notes.clone(),
        })?;
        return if report.stopped.is_some() || !report.verify.is_ok() {
            Err(CliError::Reported)
        } else {
            Ok(())
        };
    }
    print_report(source, &dst, &report, &notes, out)
}

fn print_report(
    source: &Path,
    dst: &Store,
    report: &SalvageReport,
    notes: &[String],
    out: &mut Output,
) -> Result<(), CliError> {
    out.line(format_args!(
        "salvaged {} into {}: {}",
        source.display(),
        dst.location(),
        if report.is_complete() {
            "everything was read and kept"
        } else if report.stopped.is_some() {
            "the salvage stopped before the end (below)"
        } else {
            "some of it was lost (below)"
        }
    ))?;
    for note in notes {
        out.line(format_args!("  source: {note}"))?;
    }
    if let Some(why) = &report.stopped {
        out.line(format_args!("  stopped: {why}"))?;
    }
    for t in &report.tables {
        out.line(format_args!(
            "  {:<10} {} read, {} kept, {} dropped, {} unreadable stretch{}",
            t.table,
            t.read,
            t.kept,
            t.dropped,
            t.lost.len(),
            if t.lost.len() == 1 { "" } else { "es" }
        ))?;
    }
    out.line(format_args!(
        "  {} thread{} kept (history complete); activity, children and history_ids rebuilt",
        report.threads,
        if report.threads == 1 { "" } else { "s" }
    ))?;
    for t in &report.tables {
        for lost in &t.lost {
            out.line(format_args!(
                "lost: {} keys after {} and before {}: {}",
                t.table,
                lost.after.as_deref().unwrap_or("the start"),
                lost.before.as_deref().unwrap_or("the end"),
                lost.detail
            ))?;
        }
    }
    const LISTED: usize = 20;
    for d in report.dropped.iter().take(LISTED) {
        out.line(format_args!("dropped: {} {}: {}", d.table, d.key, d.reason))?;
    }
    let dropped: u64 = report.tables.iter().map(|t| t.dropped).sum();
    if dropped > LISTED as u64 {
        out.line(format_args!(
            "dropped: … {} more (--json lists up to {})",
            dropped - LISTED as u64,
            SalvageReport::DROPPED_LISTED
        ))?;
    }
    let v = &report.verify;
    out.line(format_args!(
        "the new store: {} blobs, {} refs and {} index entries verified: {}",
        v.blobs_checked,
        v.refs_checked,
        v.index_entries_checked,
        if v.is_ok() { "ok" } else { "PROBLEMS" }
    ))?;
    for p in &v.problems {
        out.line(format_args!("  {p}"))?;
    }
    if v.is_ok() && report.stopped.is_none() {
        Ok(())
    } else {
        Err(CliError::Reported)
    }
}

/// How this program runs one reader: itself, as
/// `uwf-db --store DIR salvage-read TABLE [--from HEX]`.
fn reader_command(cli: &Cli) -> Result<Box<uwf_db::salvage::process::ReaderCommand>, CliError> {
    let exe = std::env::current_exe().map_err(|e| {
        CliError::Failed(format!(
            "cannot find the running program to start readers: {e}"
        ))
    })?;
    let max_map_size = cli.max_map_size;
    Ok(Box::new(
        move |dir: &Path, table: Table, from: Option<&[u8]>| {
            let mut command = Command::new(&exe);
            command
                .arg("--store")
                .arg(dir)
                .arg("salvage-read")
                .arg(table.name())
                .env_remove("UWF_STORE");
            if let Some(size) = max_map_size {
                command.arg("--max-map-size").arg(size.to_string());
            }
            if let Some(from) = from {
                command.arg("--from").arg(hex(from));
            }
            command
        },
    ))
}

/// `uwf-db salvage-read TABLE [--from HEX]`: streams a table's rows
/// from the store to stdout (the reader side of [`ReaderProcesses`]).
pub fn read_worker(cli: &Cli, table: &str, from: Option<&str>) -> Result<(), CliError> {
    let table = Table::ALL
        .into_iter()
        .find(|t| t.name() == table)
        .ok_or_else(|| CliError::Failed(format!("no table named {table}")))?;
    let from = from
        .map(|h| {
            uwf_db::hash::unhex(h).ok_or_else(|| CliError::Failed(format!("--from {h}: not hex")))
        })
        .transpose()?;
    let location = cli.store_path()?;
    let store = match location.to_str() {
        Some(url) if uwf_db::backend::is_postgres_url(url) => cli.open(false)?,
        _ => {
            // Opening already reads pages: guard before it.
            crate::fault::guard_lmdb_reader(&location);
            uwf_db::salvage::open_damaged(&location).map_err(uwf_db::StoreError::from)?
        }
    };
    match serve_read(
        &store,
        table,
        from.as_deref(),
        &mut std::io::stdout().lock(),
    ) {
        Ok(()) => Ok(()),
        Err(ServeError::Output(e)) => Err(CliError::Output(e)),
        Err(e) => Err(CliError::Failed(e.to_string())),
    }
}
