//! Terminal and JSON output: one writer, sizes and times for people.

use std::io::{self, BufWriter, IsTerminal, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Buffered stdout plus the `--json` switch. It takes stdout's lock only
/// while it writes (a flush): `uwf-db mcp` writes the protocol to stdout
/// from other threads while the command's `Output` lives.
pub struct Output {
    pub json: bool,
    /// How many `-v` were given.
    pub verbose: u8,
    out: BufWriter<Stdout>,
}

/// `-q`: no progress bars and no notes (set once, before the command).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Sets `-q` for the process.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A note for the person at the terminal on stderr (a summary beside a
/// bundle on stdout, where the next page starts…), unless `-q`. Not for
/// errors, which always print.
pub fn note(text: impl std::fmt::Display) {
    if !QUIET.load(Ordering::Relaxed) {
        // Not `eprintln!`, which panics when stderr is gone.
        let _ = writeln!(io::stderr().lock(), "{text}");
    }
}

impl Output {
    pub fn new(json: bool) -> Self {
        Output {
            json,
            verbose: 0,
            out: BufWriter::new(io::stdout()),
        }
    }

    /// Prints one JSON value on its own line.
    pub fn json_value<T: serde::Serialize>(&mut self, value: &T) -> io::Result<()> {
        // `io::Error::from` hands back the writer's own error, so a closed
        // pipe stays `BrokenPipe` (exit 0, like text output).
        serde_json::to_writer(&mut self.out, value).map_err(io::Error::from)?;
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

    /// An aligned table with a header row.
    pub fn columns<const N: usize>(
        &mut self,
        header: &[&str; N],
        rows: &[[String; N]],
    ) -> io::Result<()> {
        let mut widths = header.map(str::len);
        for row in rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut line = |cells: Vec<&str>| {
            let mut text = String::new();
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                if i + 1 == N {
                    text.push_str(cell);
                } else {
                    text.push_str(&format!("{cell:<w$}  "));
                }
            }
            writeln!(self.out, "{}", text.trim_end())
        };
        line(header.to_vec())?;
        for row in rows {
            line(row.iter().map(String::as_str).collect())?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A progress bar on stderr when it is a terminal and `-q` was not given;
/// hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !shows_progress() {
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

/// Whether progress bars are drawn: stderr is a terminal and not `-q`.
pub fn shows_progress() -> bool {
    io::stderr().is_terminal() && !QUIET.load(Ordering::Relaxed)
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

/// `0`, `90s`, `30m`, `1h 30m`, `7d`: a duration in ms, for people.
pub fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 if ms == 0 => "0".to_owned(),
        0 => format!("{ms}ms"),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s >= 3_600 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Milliseconds since the epoch as UTC date and time, to the second.
pub fn timestamp(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        )
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

/// Every duration flag's syntax, one parser: [`uwf_db::input::parse_duration`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    uwf_db::input::parse_duration(s)
}

/// Parses `--since`/`--until`: RFC 3339, or a duration ago
/// ([`parse_duration`]'s syntax: `30m`, `24h`, `7d`, `2w`).
pub fn parse_time(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Ok(ts) = t.parse::<jiff::Timestamp>() {
        return u64::try_from(ts.as_millisecond()).map_err(|_| format!("'{s}' is before 1970"));
    }
    let ago = parse_duration(t).map_err(|_| {
        format!("'{s}' is neither RFC 3339 nor a relative time like 30m, 24h or 7d")
    })?;
    let ago = u64::try_from(ago.as_millis()).map_err(|_| format!("'{s}' is too far back"))?;
    Ok(uwf_db::store::now_ms().saturating_sub(ago))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_duration_syntax_for_every_flag() {
        let secs = |s| parse_duration(s).map(|d| d.as_secs_f64());
        assert_eq!(secs("90"), Ok(90.0));
        assert_eq!(secs("0.5"), Ok(0.5));
        assert_eq!(secs("500ms"), Ok(0.5));
        assert_eq!(secs("90s"), Ok(90.0));
        assert_eq!(secs("10m"), Ok(600.0));
        assert_eq!(secs("1.5h"), Ok(5400.0));
        assert_eq!(secs("1h 30m"), Ok(5400.0));
        assert_eq!(secs("7d"), Ok(604_800.0));
        assert_eq!(secs("2w"), Ok(1_209_600.0));
        assert_eq!(secs("PT90S"), Ok(90.0));
        assert!(
            parse_duration("2months")
                .unwrap_err()
                .contains("use days or weeks")
        );
        for bad in ["", "soon", "10x", "-5m", "1 month", "2y"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("is not a duration")
        );
    }

    #[test]
    fn since_and_until_take_rfc_3339_or_the_same_durations_ago() {
        assert_eq!(parse_time("2026-01-02T03:04:05Z"), Ok(1_767_323_045_000));
        let now = uwf_db::store::now_ms();
        let day_ago = parse_time("1d").unwrap();
        assert!((now - 86_400_000..=now - 86_400_000 + 5_000).contains(&day_ago));
        let ninety = parse_time("1h 30m").unwrap();
        assert!((now - 5_400_000..=now - 5_400_000 + 5_000).contains(&ninety));
        assert!(parse_time("yesterday").is_err());
    }
}
