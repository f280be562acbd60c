//! Reading a damaged LMDB store through child processes, so that a page
//! that makes LMDB crash costs one child, not the salvage
//! (`docs/design.md` §6b).
//!
//! [`ReaderProcesses`] is a [`SalvageSource`]: each read runs a reader
//! program the caller names (the CLI runs itself as
//! `uwf-db --store DIR salvage-read TABLE [--from HEX]`), which opens the
//! store, calls [`serve_read`] and so streams the table's rows to the
//! parent over its stdout in frames:
//!
//! | frame | bytes |
//! |---|---|
//! | opened | `O` (the store is open: a later failure is a page's) |
//! | row | `R`, key length (u32 LE), key, value length (u32 LE), value |
//! | end | `E` (the table ended) |
//! | failed | `X`, length (u32 LE), the failure's text |
//!
//! A reader that dies without a `failed` frame (LMDB followed a garbage
//! pointer) is described by its exit status and the first line it wrote
//! on stderr, word for word. A reader that sends nothing for
//! [`STALL`] is killed. Before the first read, the data file's meta pages
//! are read with plain file reads ([`LmdbDataFile`]): when one is not
//! valid, or the file is shorter than its snapshot uses, the readers read
//! a working copy made beside the destination (both meta pages the
//! snapshot's, padded with zeros), removed at the end; when no reader can
//! open the current snapshot, the previous one is read instead.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{LmdbDataFile, ReadFailure, SalvageError, SalvageSource, StoreSource};
use crate::Store;
use crate::backend::Table;

/// A reader that sends nothing for this long is killed (a damaged page
/// can send LMDB round a cycle of pages).
pub const STALL: Duration = Duration::from_secs(30);
/// Readers killed for stalling after which no more are started: the
/// salvage stops and reports (each costs [`STALL`]).
const MAX_STALLS: u32 = 3;
/// Largest row a reader may send: a longer one is a damaged length.
const MAX_ROW: u32 = 1 << 30;

const OPENED: u8 = b'O';
const ROW: u8 = b'R';
const END: u8 = b'E';
const FAILED: u8 = b'X';

/// Makes the command that runs one reader: of the store directory given
/// (the source, or a working copy), for `table`, from the key given.
pub type ReaderCommand = dyn Fn(&Path, Table, Option<&[u8]>) -> Command;

/// Reads a store through reader processes: see the module docs.
pub struct ReaderProcesses {
    command: Box<ReaderCommand>,
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

impl ReaderProcesses {
    /// Readers of the LMDB store in `source`, started by `command`; working
    /// copies, when needed, are made beside `destination` (or in the
    /// temporary directory when it is a URL).
    pub fn new(
        source: &Path,
        destination: &Path,
        command: Box<ReaderCommand>,
    ) -> Result<ReaderProcesses, SalvageError> {
        let file = LmdbDataFile::inspect(source)?;
        // Beside DST: its file system has room for a store of SRC's size.
        let parent = match destination.parent() {
            _ if is_url(destination) => std::env::temp_dir(),
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut readers = ReaderProcesses {
            command,
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
        readers.read_snapshot(0)?;
        Ok(readers)
    }

    /// What was done to read the source (working copies, older
    /// snapshots, orphaned rows), for the report.
    pub fn notes(&self) -> &[String] {
        &self.notes
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
        let mut command = (self.command)(&self.reading, table, from);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                return Ended::NotOpened(format!(
                    "cannot start a reader ({}): {e}",
                    command.get_program().to_string_lossy()
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
fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(crate::backend::is_postgres_url)
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

impl SalvageSource for ReaderProcesses {
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

impl ReaderProcesses {
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

/// Why a reader died: its exit status and the first line it wrote on
/// stderr (at most 300 bytes of it), word for word.
fn died(status: String, stderr: &str) -> String {
    let said = stderr.lines().map(str::trim).find(|l| !l.is_empty());
    match said {
        Some(said) => {
            let mut end = said.len().min(300);
            while !said.is_char_boundary(end) {
                end -= 1;
            }
            let cut = if end < said.len() { " …" } else { "" };
            format!("the reader died ({status}): {}{cut}", &said[..end])
        }
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

fn write_bytes(out: &mut (impl Write + ?Sized), bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|l| *l <= MAX_ROW)
        .ok_or_else(|| std::io::Error::other(format!("a row of {} bytes", bytes.len())))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(bytes)
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

/// The reader's side: sends `opened`, then `table`'s rows of `store` from
/// `from` (all with `None`), then `end`, or `failed` with the read's
/// failure, on `out` (unbuffered: one write per frame, so a page that
/// crashes the process loses no row already read). A read failure is
/// also returned, after its frame is sent.
///
/// ```
/// use uwf_db::backend::Table;
/// let store = uwf_db::Store::memory();
/// store.put(&uwf_db::Blob::content("one row", []))?;
/// let mut frames = Vec::new();
/// uwf_db::salvage::process::serve_read(&store, Table::Blobs, None, &mut frames)?;
/// assert_eq!(frames.first(), Some(&b'O')); // opened
/// assert_eq!(frames.get(1), Some(&b'R')); // a row
/// assert_eq!(frames.last(), Some(&b'E')); // the end of the table
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve_read(
    store: &Store,
    table: Table,
    from: Option<&[u8]>,
    out: &mut dyn Write,
) -> Result<(), ServeError> {
    out.write_all(&[OPENED])?;
    out.flush()?;
    let mut frame = Vec::new();
    let mut write_error = None;
    let result = StoreSource(store).read(table, from, &mut |k, v| {
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
        return Err(ServeError::Output(e));
    }
    match result {
        Ok(_) => out.write_all(&[END])?,
        Err(failure) => {
            let text = failure.to_string();
            out.write_all(&[FAILED])?;
            write_bytes(out, text.as_bytes())?;
            out.flush()?;
            return Err(ServeError::Read(failure));
        }
    }
    out.flush()?;
    Ok(())
}

/// Why [`serve_read`] stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The parent's pipe could not be written (it went away).
    #[error("cannot send rows to the salvage")]
    Output(#[from] std::io::Error),
    /// The read failed (its `failed` frame was sent).
    #[error("{0}")]
    Read(ReadFailure),
}
