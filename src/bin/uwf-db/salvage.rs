//! `uwf-db salvage SRC DST`: everything still readable in a damaged store,
//! copied into a new one (the library's `salvage` decides what is kept).
//!
//! Every read of SRC runs in a child process (`uwf-db salvage-read`, not
//! listed in the help) that streams rows to this one over a pipe, so a page
//! that makes LMDB crash costs that child only: the library then asks for
//! a read at a later key, in a new child. This process never maps SRC.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use uwf_db::Store;
use uwf_db::backend::Table;
use uwf_db::hash::hex;
use uwf_db::salvage::{SalvageReport, SalvageSource, StoreSource, salvage};

use crate::output::{self, Output};
use crate::{Cli, CliError};

/// A reader that sends nothing for this long is killed (a damaged page
/// can send LMDB round a cycle of pages).
const STALL: Duration = Duration::from_secs(30);
/// Largest row a reader may send: a longer one is a damaged length.
const MAX_ROW: u32 = 1 << 30;

const ROW: u8 = b'R';
const END: u8 = b'E';
const FAILED: u8 = b'X';

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
    let report = if postgres {
        // A server's pages are the server's to protect: read in-process.
        let src = cli.open_at(source, false)?;
        salvage(&mut StoreSource(&src), &dst, progress)
    } else {
        let mut workers = Workers {
            exe: std::env::current_exe()?,
            source: source.to_path_buf(),
            max_map_size: cli.max_map_size,
        };
        salvage(&mut workers, &dst, progress)
    };
    bar.finish_and_clear();
    let report = report.map_err(|e| CliError::Failed(error_text(&e)))?;
    if out.json {
        return Ok(out.json_value(&serde_json::json!({
            "source": source.display().to_string(),
            "destination": dst.location(),
            "complete": report.is_complete(),
            "report": report,
        }))?);
    }
    print_report(source, &dst, &report, out)
}

fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn print_report(
    source: &Path,
    dst: &Store,
    report: &SalvageReport,
    out: &mut Output,
) -> Result<(), CliError> {
    out.line(format_args!(
        "salvaged {} into {}: {}",
        source.display(),
        dst.location(),
        if report.is_complete() {
            "everything was read and kept"
        } else {
            "some of it was lost (below)"
        }
    ))?;
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
    if v.is_ok() {
        Ok(())
    } else {
        Err(CliError::Reported)
    }
}

/// Reads SRC through child processes.
struct Workers {
    exe: PathBuf,
    source: PathBuf,
    max_map_size: Option<u64>,
}

/// What a reader sent.
enum Frame {
    Row(Vec<u8>, Vec<u8>),
    End,
    Failed(String),
}

impl SalvageSource for Workers {
    fn read(
        &mut self,
        table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, String> {
        let mut command = Command::new(&self.exe);
        command
            .arg("--store")
            .arg(&self.source)
            .arg("salvage-read")
            .arg(table.name())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("UWF_STORE");
        if let Some(size) = self.max_map_size {
            command.arg("--max-map-size").arg(size.to_string());
        }
        if let Some(from) = from {
            command.arg("--from").arg(hex(from));
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start a reader ({}): {e}", self.exe.display()))?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(e) = stderr {
                let _ = e.take(64 << 10).read_to_string(&mut text);
            }
            text
        });
        let (tx, rx) = mpsc::sync_channel(256);
        let reader = std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            let mut input = BufReader::new(stdout);
            loop {
                let frame = read_frame(&mut input);
                let last = !matches!(frame, Ok(Frame::Row(..)));
                if tx.send(frame).is_err() || last {
                    return;
                }
            }
        });
        let outcome = loop {
            match rx.recv_timeout(STALL) {
                Ok(Ok(Frame::Row(k, v))) => {
                    if !sink(&k, &v) {
                        break Ok(false);
                    }
                }
                Ok(Ok(Frame::End)) => break Ok(true),
                Ok(Ok(Frame::Failed(detail))) => break Err(detail),
                // The pipe closed without an end: the reader died.
                Ok(Err(())) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(String::new());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    break Err(format!(
                        "the reader sent nothing for {} s and was killed",
                        STALL.as_secs()
                    ));
                }
            }
        };
        let status = finish(&mut child);
        drop(rx);
        let _ = reader.join();
        let stderr = errors.join().unwrap_or_default();
        match outcome {
            Err(detail) if detail.is_empty() => Err(died(status, &stderr)),
            other => other,
        }
    }
}

/// Ends a reader (killed if still running) and says how it ended.
fn finish(child: &mut Child) -> String {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
    }
    match child.wait() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                _ => "ended".into(),
            }
        }
        Err(e) => format!("cannot wait for it: {e}"),
    }
}

/// Why a reader died, from its exit status and what it wrote.
fn died(status: String, stderr: &str) -> String {
    let said = stderr
        .lines()
        .find(|l| l.contains("fatal:") || l.starts_with("error:"))
        .map(|l| {
            let l = l
                .trim_start_matches("uwf-db: ")
                .trim_start_matches("error: ");
            l.split(" while reading the store")
                .next()
                .unwrap_or(l)
                .to_owned()
        });
    match said {
        Some(said) => format!("the reader died ({status}): {said}"),
        None => format!("the reader died ({status})"),
    }
}

fn read_frame(input: &mut impl Read) -> Result<Frame, ()> {
    let mut tag = [0u8; 1];
    input.read_exact(&mut tag).map_err(|_| ())?;
    match tag[0] {
        ROW => {
            let key = read_bytes(input)?;
            let value = read_bytes(input)?;
            Ok(Frame::Row(key, value))
        }
        END => Ok(Frame::End),
        FAILED => Ok(Frame::Failed(
            String::from_utf8_lossy(&read_bytes(input)?).into_owned(),
        )),
        _ => Err(()),
    }
}

fn read_bytes(input: &mut impl Read) -> Result<Vec<u8>, ()> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len).map_err(|_| ())?;
    let len = u32::from_le_bytes(len);
    if len > MAX_ROW {
        return Err(());
    }
    let mut bytes = Vec::new();
    input
        .take(u64::from(len))
        .read_to_end(&mut bytes)
        .map_err(|_| ())?;
    if bytes.len() as u64 != u64::from(len) {
        return Err(());
    }
    Ok(bytes)
}

fn write_bytes(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|l| *l <= MAX_ROW)
        .ok_or_else(|| std::io::Error::other(format!("a row of {} bytes", bytes.len())))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(bytes)
}

/// `uwf-db salvage-read TABLE [--from HEX]`: streams a table's rows
/// from the store to stdout (the child side of [`Workers`]).
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
    let store = cli.open(false)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut write_error = None;
    let result = StoreSource(&store).read(table, from.as_deref(), &mut |k, v| {
        let sent = out
            .write_all(&[ROW])
            .and_then(|()| write_bytes(&mut out, k))
            .and_then(|()| write_bytes(&mut out, v));
        match sent {
            Ok(()) => true,
            Err(e) => {
                write_error = Some(e);
                false
            }
        }
    });
    if let Some(e) = write_error {
        return Err(CliError::Output(e));
    }
    match result {
        Ok(_) => out.write_all(&[END])?,
        Err(text) => {
            out.write_all(&[FAILED])?;
            write_bytes(&mut out, text.as_bytes())?;
            out.flush()?;
            return Err(CliError::Failed(text));
        }
    }
    out.flush()?;
    Ok(())
}
