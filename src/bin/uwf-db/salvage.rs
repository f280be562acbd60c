//! `uwf-db salvage SRC DST`: everything still readable in a damaged store,
//! copied into a new one (the library's `salvage` decides what is kept).
//!
//! Every read of SRC runs in a child process (`uwf-db salvage-read`, not
//! listed in the help) that streams rows to this one over a pipe, so a page
//! that makes LMDB crash costs that child only: the library then asks for
//! a read at a later key, in a new child. This process never maps SRC.
//!
//! Before the first read, SRC's meta pages are read with plain file reads
//! (`LmdbDataFile`): when one is not valid, or the file is shorter than
//! its snapshot uses, the children read a working copy made beside DST
//! (both meta pages the snapshot's, padded with zeros) and removed at the
//! end. When no child can open the current snapshot, the previous one is
//! read instead. Each child first sends `O` once the store is open, so a
//! failed open is told apart from a damaged page.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use uwf_db::Store;
use uwf_db::backend::Table;
use uwf_db::hash::hex;
use uwf_db::salvage::{
    LmdbDataFile, ReadFailure, SalvageError, SalvageReport, SalvageSource, StoreSource, salvage,
};

use crate::output::{self, Output};
use crate::{Cli, CliError};

/// A reader that sends nothing for this long is killed (a damaged page
/// can send LMDB round a cycle of pages).
const STALL: Duration = Duration::from_secs(30);
/// Readers killed for stalling after which no more are started: the
/// salvage stops and reports (each costs [`STALL`]).
const MAX_STALLS: u32 = 3;
/// Largest row a reader may send: a longer one is a damaged length.
const MAX_ROW: u32 = 1 << 30;

const OPENED: u8 = b'O';
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
    let (report, notes) = if postgres {
        // A server's pages are the server's to protect: read in-process.
        let src = cli.open_at(source, false)?;
        (salvage(&mut StoreSource(&src), &dst, progress), Vec::new())
    } else {
        let mut workers =
            Workers::new(cli, source, destination).map_err(|e| CliError::Failed(error_text(&e)))?;
        let report = salvage(&mut workers, &dst, progress);
        (report, std::mem::take(&mut workers.notes))
    };
    bar.finish_and_clear();
    let report = report.map_err(|e| CliError::Failed(error_text(&e)))?;
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

/// Reads SRC through child processes.
struct Workers {
    exe: PathBuf,
    max_map_size: Option<u64>,
    file: LmdbDataFile,
    /// Where working copies are made (created when first needed).
    scratch: Scratch,
    /// The snapshot read (an index into `file.snapshots()`).
    snapshot: usize,
    /// The store directory the children open: SRC, or a working copy.
    reading: PathBuf,
    /// A child has opened `reading`.
    opened: bool,
    stalls: u32,
    /// What was done to read SRC, for the report.
    notes: Vec<String>,
}

/// What a reader sent.
enum Frame {
    Opened,
    Row(Vec<u8>, Vec<u8>),
    End,
    Failed(String),
}

/// How one reader ended.
enum Ended {
    Done(bool),
    /// Failed before it opened the store.
    NotOpened(String),
    Failed(String),
    Stalled,
}

impl Workers {
    fn new(cli: &Cli, source: &Path, destination: &Path) -> Result<Workers, SalvageError> {
        let file = LmdbDataFile::inspect(source)?;
        // Beside DST: its file system has room for a store of SRC's size.
        let parent = match destination.parent() {
            _ if cli_is_url(destination) => std::env::temp_dir(),
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut workers = Workers {
            exe: std::env::current_exe().map_err(|e| SalvageError::Io {
                op: "find the running program",
                path: PathBuf::from("uwf-db"),
                source: e,
            })?,
            max_map_size: cli.max_map_size,
            file,
            scratch: Scratch {
                dir: parent.join(format!(".uwf-salvage-{}", std::process::id())),
                made: false,
            },
            snapshot: 0,
            reading: source.to_path_buf(),
            opened: false,
            stalls: 0,
            notes: Vec::new(),
        };
        workers.read_snapshot(0)?;
        Ok(workers)
    }

    /// Makes the children read snapshot `at`: SRC itself when LMDB can
    /// open it as it is, else a working copy.
    fn read_snapshot(&mut self, at: usize) -> Result<(), SalvageError> {
        let repairs = self.file.repairs(at);
        self.snapshot = at;
        self.opened = false;
        if repairs.is_empty() {
            return Ok(());
        }
        let dir = self.scratch.make(at)?;
        let unreadable = self.file.write_copy(at, &dir)?;
        let txnid = self.file.snapshots().get(at).map_or(0, |m| m.txnid);
        self.notes.extend(repairs);
        if !unreadable.is_empty() {
            self.notes.push(format!(
                "pages {unreadable:?} could not be read from the disk and were copied as zeros"
            ));
        }
        self.notes.push(format!(
            "read a working copy with both meta pages of transaction {txnid} ({})",
            dir.display()
        ));
        self.reading = dir;
        Ok(())
    }

    /// One reader from `from`.
    fn read_once(
        &mut self,
        table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Ended {
        let mut command = Command::new(&self.exe);
        command
            .arg("--store")
            .arg(&self.reading)
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
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                return Ended::NotOpened(format!(
                    "cannot start a reader ({}): {e}",
                    self.exe.display()
                ));
            }
        };
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
                let last = !matches!(frame, Ok(Frame::Row(..) | Frame::Opened));
                if tx.send(frame).is_err() || last {
                    return;
                }
            }
        });
        let mut opened = false;
        let outcome = loop {
            match rx.recv_timeout(STALL) {
                Ok(Ok(Frame::Opened)) => opened = true,
                Ok(Ok(Frame::Row(k, v))) => {
                    if !sink(&k, &v) {
                        break Ended::Done(false);
                    }
                }
                Ok(Ok(Frame::End)) => break Ended::Done(true),
                Ok(Ok(Frame::Failed(detail))) => break Ended::Failed(detail),
                // The pipe closed without an end: the reader died.
                Ok(Err(())) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Ended::Failed(String::new());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break Ended::Stalled,
            }
        };
        let status = finish(&mut child);
        drop(rx);
        let _ = reader.join();
        let stderr = errors.join().unwrap_or_default();
        match outcome {
            Ended::Failed(detail) => {
                let detail = if detail.is_empty() {
                    died(status, &stderr)
                } else {
                    detail
                };
                if opened {
                    Ended::Failed(detail)
                } else {
                    Ended::NotOpened(detail)
                }
            }
            other => other,
        }
    }
}

/// Whether `path` is a `postgres://` URL.
fn cli_is_url(path: &Path) -> bool {
    path.to_str().is_some_and(uwf_db::backend::is_postgres_url)
}

/// The directory of working copies, removed with everything in it when
/// the salvage ends.
struct Scratch {
    dir: PathBuf,
    made: bool,
}

impl Scratch {
    /// A new directory for snapshot `at`'s copy.
    fn make(&mut self, at: usize) -> Result<PathBuf, SalvageError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SalvageError::Io {
                op: "create the working directory",
                path,
                source,
            }
        };
        if !self.made {
            std::fs::create_dir(&self.dir).map_err(io(&self.dir))?;
            self.made = true;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(&self.dir))?;
        }
        let dir = self.dir.join(format!("snapshot-{at}"));
        std::fs::create_dir(&dir).map_err(io(&dir))?;
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl SalvageSource for Workers {
    fn read(
        &mut self,
        table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, ReadFailure> {
        // An open that fails is tried once more (it may be passing, say a
        // file-descriptor limit); one that keeps failing before any reader
        // opened this snapshot moves to the previous snapshot.
        let mut open_failures = 0;
        loop {
            if self.stalls >= MAX_STALLS {
                return Err(ReadFailure::Stop(format!(
                    "{MAX_STALLS} readers sent nothing for {} s and were killed",
                    STALL.as_secs()
                )));
            }
            match self.read_once(table, from, sink) {
                Ended::Done(end) => {
                    self.opened = true;
                    return Ok(end);
                }
                Ended::Failed(detail) => {
                    self.opened = true;
                    return Err(ReadFailure::Page(detail));
                }
                Ended::Stalled => {
                    self.stalls += 1;
                    return Err(ReadFailure::Page(format!(
                        "the reader sent nothing for {} s and was killed",
                        STALL.as_secs()
                    )));
                }
                Ended::NotOpened(detail) => {
                    open_failures += 1;
                    if open_failures < 2 {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    let next = self.snapshot + 1;
                    if !self.opened && next < self.file.snapshots().len() {
                        self.notes.push(format!(
                            "the store could not be opened at transaction {}: {detail}",
                            self.file
                                .snapshots()
                                .get(self.snapshot)
                                .map_or(0, |m| m.txnid)
                        ));
                        self.read_snapshot(next)
                            .map_err(|e| ReadFailure::Stop(error_text(&e)))?;
                        open_failures = 0;
                        continue;
                    }
                    return Err(ReadFailure::Stop(format!(
                        "the store cannot be opened: {detail}"
                    )));
                }
            }
        }
    }

    fn orphans(
        &mut self,
        table: Table,
        sink: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), ReadFailure> {
        self.orphan_rows(table, sink)
    }
}

impl Workers {
    /// Rows below the damaged pages of `table`, found with plain reads of
    /// SRC's data file (no reader: nothing there is mapped or trusted).
    fn orphan_rows(
        &mut self,
        table: Table,
        sink: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), ReadFailure> {
        let scan = self
            .file
            .orphan_rows(self.snapshot, table, sink)
            .map_err(|e| ReadFailure::Page(error_text(&e)))?;
        if scan.rows > 0 {
            self.notes.push(format!(
                "{}: {} rows read on {} pages that no tree reaches (below a damaged page)",
                table.name(),
                scan.rows,
                scan.pages
            ));
        }
        Ok(())
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
        OPENED => Ok(Frame::Opened),
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
    let location = cli.store_path()?;
    let store = match location.to_str() {
        Some(url) if uwf_db::backend::is_postgres_url(url) => cli.open(false)?,
        _ => {
            // Opening already reads pages: guard before it.
            crate::fault::guard_lmdb_store(&location);
            uwf_db::salvage::open_damaged(&location).map_err(uwf_db::StoreError::from)?
        }
    };
    // Unbuffered frames (one write each): a page that crashes this
    // process loses no row it already read.
    let mut out = std::io::stdout().lock();
    out.write_all(&[OPENED])?;
    out.flush()?;
    let mut frame = Vec::new();
    let mut write_error = None;
    let result = StoreSource(&store).read(table, from.as_deref(), &mut |k, v| {
        frame.clear();
        frame.push(ROW);
        let sent = write_bytes(&mut frame, k)
            .and_then(|()| write_bytes(&mut frame, v))
            .and_then(|()| out.write_all(&frame))
            .and_then(|()| out.flush());
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
        Err(failure) => {
            let text = failure.to_string();
            out.write_all(&[FAILED])?;
            write_bytes(&mut out, text.as_bytes())?;
            out.flush()?;
            return Err(CliError::Failed(text));
        }
    }
    out.flush()?;
    Ok(())
}
