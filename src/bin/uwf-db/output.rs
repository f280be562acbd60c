//! Terminal and JSON output: one writer, sizes and times for people.

use std::io::{self, BufWriter, IsTerminal, StdoutLock, Write};

use indicatif::{ProgressBar, ProgressStyle};

/// Buffered stdout plus the `--json` switch.
pub struct Output {
    pub json: bool,
    out: BufWriter<StdoutLock<'static>>,
}

impl Output {
    pub fn new(json: bool) -> Self {
        Output {
            json,
            out: BufWriter::new(io::stdout().lock()),
        }
    }

    /// Prints one JSON value on its own line.
    pub fn json_value<T: serde::Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value).map_err(io::Error::other)?;
        self.out.write_all(b"\n")
    }

    pub fn line(&mut self, text: impl std::fmt::Display) -> io::Result<()> {
        writeln!(self.out, "{text}")
    }

    pub fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    /// Aligned `key  value` rows.
    pub fn table(&mut self, rows: &[(&str, String)]) -> io::Result<()> {
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            writeln!(self.out, "{k:<width$}  {v}")?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

/// `1536` → `1.5 KiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC.
pub fn timestamp(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{ms} ms"), |t| t.to_string())
}

/// Parses `4096`, `64KiB`, `512MiB`, `4GiB`, `1TiB` (also `KB`/`MB`/`GB`, binary).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 1048576, 512MiB, 4GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' (use KiB, MiB, GiB or TiB)"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}
