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
        out.json_value(&uwf_db::api::StoreInit {
            created: !existed,
            format_version: FORMAT_VERSION,
            path: store.location().to_owned(),
        })?;
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
    let report = uwf_db::gc::collect_garbage(&store, &options, &|p| match p {
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
        (
            if dry_run { "would prune" } else { "pruned" },
            format!(
                "{} thread{} (the stored retention policy)",
                report.pruned,
                if report.pruned == 1 { "" } else { "s" }
            ),
        ),
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
        out.json_value(&uwf_db::api::VerifyAnswer::from(&report))?;
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
    } else if report
        .problems
        .iter()
        .any(|p| matches!(p, uwf_db::verify::Problem::Unreadable { .. }))
    {
        Err(CliError::ReportedDamage)
    } else {
        Err(CliError::Reported)
    }
}

pub fn stats(cli: &Cli, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let s = store.stats()?;
    let usage = store.threads().usage_totals()?;
    if out.json {
        return Ok(out.json_value(&uwf_db::api::StatsAnswer { stats: s, usage })?);
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
        ("usage", crate::render::usage_text(&usage)),
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
        rows.push((
            "value checksums",
            if s.value_checksums {
                "yes (every value is checked on read and by verify)".to_owned()
            } else {
                "no (a store of the legacy layout: `uwf-db copy` it into a new store to add them)"
                    .to_owned()
            },
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
        StoreError::Backend(uwf_db::backend::BackendError::NotInitialized { .. }) => {
            CopyError::SourceMissing {
                location: name(source),
            }
        }
        e => CopyError::OpenSource {
            location: name(source),
            source: e,
        },
    })?;
    // Never create a store among someone's files.
    if !destination
        .to_str()
        .is_some_and(uwf_db::backend::is_postgres_url)
    {
        uwf_db::copy::check_destination_dir(destination)?;
    }
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
    let report = uwf_db::copy::copy_to(&src, &dst, &options, |p| match p {
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

/// `--status` of `prune`: an ended status (clap: anything else exits 2).
pub fn parse_ended_status(s: &str) -> Result<uwf_db::thread::ThreadStatus, String> {
    let status: uwf_db::thread::ThreadStatus = s.trim().parse()?;
    if status.is_done() {
        Ok(status)
    } else {
        Err(format!(
            "prune never touches {status} threads: give completed, failed or cancelled"
        ))
    }
}

/// What `uwf-db prune` was asked to do.
pub enum PruneAction {
    Prune,
    DryRun,
    Set,
    Unset,
    Show,
}

/// `uwf-db prune`.
/// `uwf-db config [KEY [VALUE]]`: the store's settings (clap allows only
/// known keys and values).
pub fn config(
    cli: &Cli,
    key: Option<&str>,
    value: Option<&str>,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(value.is_some())?;
    if let Some(v) = value {
        store.engine().set_keep_prompts(v == "on")?;
    }
    let on = store.engine().keep_prompts()?;
    let rows = [("keep-prompts", if on { "on" } else { "off" })];
    if out.json {
        let map: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .filter(|(k, _)| key.is_none_or(|wanted| wanted == *k))
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        return Ok(out.json_value(&map)?);
    }
    for (k, v) in rows {
        if key.is_none_or(|wanted| wanted == k) {
            out.line(format_args!("{k} = {v}"))?;
        }
    }
    Ok(())
}

/// `uwf-db usage [ID]`: a thread's usage with its children's, or the
/// store's (the same totals as `thread show` and `stats`).
pub fn usage(
    cli: &Cli,
    id: Option<&uwf_db::thread::IdPrefix>,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let threads = store.threads();
    let (what, totals) = match id {
        None => (
            "every thread in the store".to_owned(),
            threads.usage_totals()?,
        ),
        Some(prefix) => {
            let id = threads.resolve(prefix)?;
            let tree = threads.tree(id)?;
            (
                format!("thread {id} with its child workflows"),
                uwf_db::thread::Threads::tree_usage(&tree),
            )
        }
    };
    if out.json {
        return Ok(out.json_value(&totals)?);
    }
    out.line(format_args!(
        "{what}: {}",
        crate::render::usage_text(&totals)
    ))?;
    Ok(())
}

pub fn prune(
    cli: &Cli,
    policy: &uwf_db::thread::RetentionPolicy,
    action: PruneAction,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let describe = |p: &uwf_db::thread::RetentionPolicy| {
        let mut parts = Vec::new();
        if let Some(ms) = p.older_than_ms {
            parts.push(format!(
                "ended more than {} ago",
                output::human_duration(ms)
            ));
        }
        if let Some(n) = p.keep_latest {
            parts.push(format!("not among the newest {n} of their workflow"));
        }
        if !p.statuses.is_empty() {
            let s: Vec<String> = p.statuses.iter().map(ToString::to_string).collect();
            parts.push(format!("status {}", s.join(" or ")));
        }
        if let Some(w) = &p.workflow {
            parts.push(format!("of workflow {w}"));
        }
        if !p.labels.is_empty() {
            parts.push(format!(
                "labelled {}",
                crate::render::labels_text(&p.labels)
            ));
        }
        parts.join(", ")
    };
    match action {
        PruneAction::Set => {
            store.threads().set_retention_policy(Some(policy))?;
            if out.json {
                return Ok(out.json_value(&uwf_db::api::PolicyAnswer {
                    policy: Some(policy.clone()),
                })?);
            }
            out.line(format_args!(
                "stored the retention policy: prune ended threads {}; every `uwf-db gc` applies it first",
                describe(policy)
            ))?;
            Ok(())
        }
        PruneAction::Unset => {
            store.threads().set_retention_policy(None)?;
            if out.json {
                return Ok(out.json_value(&uwf_db::api::PolicyAnswer { policy: None })?);
            }
            out.line("removed the stored retention policy")?;
            Ok(())
        }
        PruneAction::Show => {
            let stored = store.threads().retention_policy()?;
            if out.json {
                return Ok(out.json_value(&uwf_db::api::PolicyAnswer {
                    policy: stored.clone(),
                })?);
            }
            match stored {
                Some(p) => out.line(format_args!(
                    "retention policy: prune ended threads {}",
                    describe(&p)
                ))?,
                None => out.line("no retention policy is stored")?,
            }
            Ok(())
        }
        PruneAction::Prune | PruneAction::DryRun => {
            let dry_run = matches!(action, PruneAction::DryRun);
            let report = store.threads().prune(policy, dry_run)?;
            if out.json {
                return Ok(out.json_value(&report)?);
            }
            let verb = if dry_run { "would prune" } else { "pruned" };
            // A policy may touch thousands: the list only with -v.
            if out.verbose > 0 {
                for id in &report.pruned {
                    out.line(format_args!("{verb} {id}"))?;
                }
            }
            out.line(format_args!(
                "{verb} {} ended thread{} ({}); kept {}{}",
                report.pruned.len(),
                if report.pruned.len() == 1 { "" } else { "s" },
                describe(policy),
                report.kept,
                if dry_run || report.pruned.is_empty() {
                    String::new()
                } else {
                    "; `uwf-db gc` frees their blobs".to_owned()
                }
            ))?;
            Ok(())
        }
    }
}

/// `uwf-db export ID… [-o FILE]`.
pub fn export(
    cli: &Cli,
    ids: &[uwf_db::thread::IdPrefix],
    output: Option<&Path>,
    sign: Option<&Path>,
    out: &mut Output,
) -> Result<(), CliError> {
    use std::io::Write;
    let mut options = uwf_db::bundle::ExportOptions::default();
    if let Some(key) = sign {
        options.sign = Some(uwf_db::bundle::BundleKey::from_file(key)?);
    }
    let store = cli.open(false)?;
    let ids = ids
        .iter()
        .map(|p| store.threads().resolve(p))
        .collect::<Result<Vec<_>, _>>()?;
    let report = match output {
        Some(path) => {
            // Written beside the target and renamed: a failed export never
            // leaves half a bundle under the name asked for.
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "bundle".into());
            let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
            let written = (|| -> Result<uwf_db::bundle::ExportReport, CliError> {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)?;
                let mut w = std::io::BufWriter::new(&file);
                let report = uwf_db::bundle::export_with(&store, &ids, &mut w, &options)?;
                w.flush()?;
                drop(w);
                file.sync_all()?;
                std::fs::rename(&tmp, path)?;
                Ok(report)
            })();
            if written.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            written?
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            let report = uwf_db::bundle::export_with(&store, &ids, &mut w, &options)?;
            w.flush()?;
            // The bundle is stdout: the summary goes to stderr.
            output::note(format_args!(
                "exported {} thread{} and {} blobs ({} bytes)",
                report.threads.len(),
                if report.threads.len() == 1 { "" } else { "s" },
                report.blobs,
                report.bytes
            ));
            return Ok(());
        }
    };
    if out.json {
        return Ok(out.json_value(&report)?);
    }
    out.line(format_args!(
        "exported {} thread{} and {} blobs ({} bytes) to {}",
        report.threads.len(),
        if report.threads.len() == 1 { "" } else { "s" },
        report.blobs,
        report.bytes,
        output.map_or_else(String::new, |p| p.display().to_string())
    ))?;
    Ok(())
}

/// `uwf-db import FILE [--new-ids] [--verify KEYFILE] [--trust-agents]`.
pub fn import(
    cli: &Cli,
    file: &Path,
    new_ids: bool,
    verify: Option<&Path>,
    trust_agents: bool,
    out: &mut Output,
) -> Result<(), CliError> {
    use std::io::Read;
    use uwf_db::bundle::{BundleError, BundleKey, ImportOptions, MAX_BUNDLE};
    let mut options = ImportOptions::new_ids(new_ids);
    options.trust_agents = trust_agents;
    if let Some(key) = verify {
        options.verify = Some(BundleKey::from_file(key)?);
    }
    let mut bytes = Vec::new();
    let read = if file == Path::new("-") {
        std::io::stdin()
            .take(MAX_BUNDLE + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(MAX_BUNDLE + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| CliError::Failed(format!("cannot read {}: {e}", file.display())))?;
    if bytes.len() as u64 > MAX_BUNDLE {
        return Err(BundleError::TooLarge {
            size: bytes.len() as u64,
            max: MAX_BUNDLE,
        }
        .into());
    }
    // The framing and checksum first: a damaged bundle creates no store.
    uwf_db::bundle::decode_with(&bytes, options.verify.as_ref())?;
    let store = cli.open(true)?;
    let report = uwf_db::bundle::import_with(&store, &bytes, &options)?;
    if out.json {
        return Ok(out.json_value(&report)?);
    }
    for (from, to) in &report.threads {
        if from == to {
            out.line(format_args!("imported thread {to}"))?;
        } else {
            out.line(format_args!("imported thread {from} as {to}"))?;
        }
    }
    out.line(format_args!(
        "imported {} thread{} and {} blobs ({} new to this store){}",
        report.threads.len(),
        if report.threads.len() == 1 { "" } else { "s" },
        report.blobs,
        report.new_blobs,
        if report.signed {
            "; its signature matched the key"
        } else {
            ""
        }
    ))?;
    if report.agents_dropped > 0 {
        out.line(format_args!(
            "the agent{} named by {} imported thread{} {} not kept (a bundle's agent is a command \
             line from its maker): drive {} with --agent, or import with --trust-agents",
            if report.agents_dropped == 1 { "" } else { "s" },
            report.agents_dropped,
            if report.agents_dropped == 1 { "" } else { "s" },
            if report.agents_dropped == 1 {
                "was"
            } else {
                "were"
            },
            if report.agents_dropped == 1 {
                "it"
            } else {
                "them"
            },
        ))?;
    }
    Ok(())
}
