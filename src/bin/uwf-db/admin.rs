//! `init`, `gc`, `verify`, `stats`, `copy`.

use std::path::Path;

use uwf_db::StoreError;
use uwf_db::copy::{CopyError, CopyOptions, CopyProgress};
use uwf_db::gc::{GcOptions, GcProgress};
use uwf_db::store::FORMAT_VERSION;
use uwf_db::verify::verify as verify_store;

use crate::output::{self, Output};
use crate::{Cli, CliError};

pub fn init(cli: &Cli, out: &mut Output) -> Result<(), CliError> {
    let path = cli.store_path()?;
    // A PostgreSQL store exists when its schema does: opening it without
    // creating tells.
    let existed = match path.to_str() {
        Some(url) if uwf_db::backend::is_postgres_url(url) => cli.open(false).is_ok(),
        _ => path.join("data.mdb").is_file(),
    };
    let store = cli.open(true)?;
    if out.json {
        out.json_value(&serde_json::json!({
            "path": store.location(),
            "format_version": FORMAT_VERSION,
            "created": !existed,
        }))?;
    } else if existed {
        out.line(format_args!(
            "store at {} already exists (format version {FORMAT_VERSION})",
            store.location()
        ))?;
    } else {
        out.line(format_args!(
            "initialized store at {} (format version {FORMAT_VERSION})",
            store.location()
        ))?;
    }
    Ok(())
}

pub fn gc(
    cli: &Cli,
    dry_run: bool,
    grace: std::time::Duration,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let bar = output::progress_bar(0, "scanning");
    let options = GcOptions {
        grace,
        dry_run,
        threads: None,
    };
    let report = store.collect_garbage(&options, &|p| match p {
        GcProgress::Scanning { done, total } => {
            bar.set_length(total);
            bar.set_position(done);
        }
        GcProgress::Marked { candidates, .. } if !dry_run => {
            bar.set_message("sweeping");
            bar.set_length(candidates);
            bar.set_position(0);
        }
        GcProgress::Swept { done, .. } => bar.set_position(done),
        _ => {}
    })?;
    bar.finish_and_clear();
    if out.json {
        return Ok(out.json_value(&report)?);
    }
    let verb = if dry_run { "would free" } else { "freed" };
    out.table(&[
        ("roots", report.roots.to_string()),
        ("blobs", report.blobs.to_string()),
        (
            "marked",
            format!(
                "{} (reachable from the roots or from the {} blobs within the {} grace period)",
                report.marked,
                report.young,
                output::human_duration(report.grace_ms)
            ),
        ),
        ("rescued", report.rescued.to_string()),
        (
            if dry_run { "would sweep" } else { "swept" },
            report.swept.to_string(),
        ),
        (verb, output::human_size(report.bytes_freed)),
        ("took", format!("{} ms", report.elapsed_ms)),
    ])?;
    Ok(())
}

pub fn verify(cli: &Cli, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let bar = output::progress_bar(0, "verifying");
    let report = verify_store(&store, |p| {
        bar.set_length(p.total);
        bar.set_position(p.checked);
    })?;
    bar.finish_and_clear();
    if out.json {
        out.json_value(&serde_json::json!({
            "ok": report.is_ok(),
            "blobs_checked": report.blobs_checked,
            "refs_checked": report.refs_checked,
            "index_entries_checked": report.index_entries_checked,
            "problems": report.problems.iter().map(|p| {
                let mut v = serde_json::to_value(p).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("message".into(), p.to_string().into());
                }
                v
            }).collect::<Vec<_>>(),
        }))?;
    } else {
        for p in &report.problems {
            out.line(p)?;
        }
        let verdict = match report.problems.len() {
            0 => "ok".to_owned(),
            1 => "1 problem".to_owned(),
            n => format!("{n} problems"),
        };
        out.line(format_args!(
            "verified {} blobs, {} refs and {} index entries: {verdict}",
            report.blobs_checked, report.refs_checked, report.index_entries_checked
        ))?;
    }
    if report.is_ok() {
        Ok(())
    } else {
        Err(CliError::Reported)
    }
}

pub fn stats(cli: &Cli, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let s = store.stats()?;
    if out.json {
        return Ok(out.json_value(&s)?);
    }
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            a as f64 * 100.0 / b as f64
        }
    };
    // A server backend has no file, map or reader table of its own.
    let server = uwf_db::backend::is_postgres_url(&s.path.to_string_lossy());
    let durability = match (s.durability, server) {
        (uwf_db::Durability::Sync, false) => "sync (every commit is flushed to disk)".to_owned(),
        (uwf_db::Durability::Sync, true) => {
            "sync (every commit's WAL is flushed by the server before it returns)".to_owned()
        }
        (uwf_db::Durability::None, _) => {
            "none (NOT durable: a machine crash may lose recent commits)".to_owned()
        }
    };
    let mut rows = vec![
        ("store", s.path.display().to_string()),
        ("format version", s.format_version.to_string()),
        ("blobs", s.blob_count.to_string()),
        (
            "threads",
            format!("{} active, {} ended", s.active_threads, s.ended_threads),
        ),
        ("workflows", s.workflows.to_string()),
        ("pins", s.pins.to_string()),
        (
            if server { "blob table" } else { "blob pages" },
            output::human_size(s.blob_bytes),
        ),
    ];
    if !server {
        rows.push(("file size", output::human_size(s.file_size)));
        rows.push((
            "map",
            format!(
                "{} used of {} ({:.3}%){}",
                output::human_size(s.map_used),
                output::human_size(s.map_size),
                pct(s.map_used, s.map_size),
                match s.max_map_size {
                    // LMDB never maps less than the data file.
                    Some(max) if max < s.map_size && s.file_size > max => format!(
                        ", in force: the configured maximum of {} is below the data file's size",
                        output::human_size(max)
                    ),
                    Some(_) => ", configured maximum".to_owned(),
                    None => String::new(),
                }
            ),
        ));
        rows.push((
            "readers",
            format!("{} slots used so far, of {}", s.readers, s.max_readers),
        ));
    }
    rows.push(("durability", durability));
    out.table(&rows)?;
    if let Some(copy) = &s.unfinished_copy {
        out.line(format_args!(
            "this store is an UNFINISHED COPY of {} (started {}): rerun `uwf-db copy` to finish it \
             before using it",
            copy.source,
            output::timestamp(copy.started_at)
        ))?;
    }
    if let Some(epoch) = s.gc_epoch {
        out.line(format_args!(
            "a garbage collection started at {} is running (or died; the next `uwf-db gc` clears it)",
            output::timestamp(epoch)
        ))?;
    }
    Ok(())
}

pub fn copy(
    cli: &Cli,
    source: &Path,
    destination: &Path,
    chunk_rows: u32,
    out: &mut Output,
) -> Result<(), CliError> {
    let name = |p: &Path| p.display().to_string();
    let src = cli.open_at(source, false).map_err(|e| match e {
        StoreError::NotInitialized { .. } => CopyError::SourceMissing {
            location: name(source),
        },
        e => CopyError::OpenSource {
            location: name(source),
            source: e,
        },
    })?;
    let dst = cli
        .open_at(destination, true)
        .map_err(|e| CopyError::OpenDestination {
            location: name(destination),
            source: e,
        })?;
    let options = CopyOptions {
        chunk_rows: chunk_rows as usize,
        ..CopyOptions::default()
    };
    let bar = output::progress_bar(0, "copying");
    let report = src.copy_to(&dst, &options, |p| match p {
        CopyProgress::Started { total, resumed } => {
            bar.set_length(total);
            if resumed {
                bar.println(format!(
                    "continuing the unfinished copy of {} into {}",
                    src.location(),
                    dst.location()
                ));
            }
        }
        CopyProgress::Copied { table, done, total } => {
            bar.set_message(format!("copying {table}"));
            bar.set_length(total);
            bar.set_position(done);
        }
        CopyProgress::Comparing { table } => {
            bar.set_message(format!("comparing {table}"));
        }
        CopyProgress::Verifying(v) => {
            bar.set_message("verifying");
            bar.set_length(v.total);
            bar.set_position(v.checked);
        }
        _ => {}
    });
    bar.finish_and_clear();
    let report = report?;
    if out.json {
        return Ok(out.json_value(&report)?);
    }
    out.line(format_args!(
        "copied {} to {}{}",
        report.source,
        report.destination,
        if report.resumed {
            " (continued an unfinished copy)"
        } else {
            ""
        }
    ))?;
    let mut rows: Vec<[String; 6]> = report
        .tables
        .iter()
        .map(|t| {
            [
                t.table.to_string(),
                t.rows.to_string(),
                output::human_size(t.bytes),
                t.written.to_string(),
                t.deleted.to_string(),
                t.digest.get(..16).unwrap_or(&t.digest).to_owned(),
            ]
        })
        .collect();
    rows.push([
        "all".into(),
        report.rows.to_string(),
        output::human_size(report.bytes),
        report.written.to_string(),
        report.deleted.to_string(),
        "identical".into(),
    ]);
    out.columns(
        &["table", "rows", "size", "written", "deleted", "digest"],
        &rows,
    )?;
    let v = &report.verify;
    out.line(format_args!(
        "verified {} blobs, {} refs and {} index entries in the destination: ok",
        v.blobs_checked, v.refs_checked, v.index_entries_checked
    ))?;
    let secs = report.elapsed_ms as f64 / 1000.0;
    out.line(format_args!(
        "took {:.1} s ({:.0} rows/s)",
        secs,
        if secs > 0.0 {
            report.rows as f64 / secs
        } else {
            report.rows as f64
        }
    ))?;
    Ok(())
}
