//! Input files with caps: a workflow, a scenario, a prompts file or a blob
//! larger than anyone means is refused with a message naming the file, its
//! size and the cap, and reading it never holds more than the cap (plus
//! one byte) in memory, whatever the file is (`/dev/zero` included).

use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest workflow YAML file: 4 MiB.
pub const MAX_WORKFLOW: u64 = 4 << 20;
/// Largest scenario file (`script:` agents): 4 MiB.
pub const MAX_SCENARIO: u64 = 4 << 20;
/// Largest `batch --prompts` file: 64 MiB.
pub const MAX_PROMPTS: u64 = 64 << 20;
/// Largest single prompt: 1 MiB.
pub const MAX_PROMPT: usize = 1 << 20;
/// Largest `cas put` input: 256 MiB.
pub const MAX_BLOB_INPUT: u64 = 256 << 20;

/// An input that cannot be read, or is too large.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Unreadable {
        /// The file (`-`: stdin).
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is larger than its cap.
    #[error("{path} is larger than {cap} bytes, the most a {what} may be{size}")]
    TooLarge {
        /// The file (`-`: stdin).
        path: PathBuf,
        /// What kind of input it is.
        what: &'static str,
        /// The cap, in bytes.
        cap: u64,
        /// ", it is N bytes", when the size is known.
        size: String,
    },
    /// The file is not UTF-8 text.
    #[error("{path} is not UTF-8 text (invalid byte at offset {at})")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Offset of the first invalid byte.
        at: usize,
    },
}

/// The bytes of `path` (`-`: stdin), at most `cap` of them; `what` names
/// the kind of input in the error.
pub fn read_capped(path: &Path, cap: u64, what: &'static str) -> Result<Vec<u8>, InputError> {
    let unreadable = |source| InputError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(cap.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
    } else {
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let known = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        if let Some(size) = known.filter(|s| *s > cap) {
            return Err(InputError::TooLarge {
                path: path.to_path_buf(),
                what,
                cap,
                size: format!(", it is {size} bytes"),
            });
        }
        file.take(cap.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
    }
    if bytes.len() as u64 > cap {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            what,
            cap,
            size: String::new(),
        });
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64, what: &'static str) -> Result<String, InputError> {
    String::from_utf8(read_capped(path, cap, what)?).map_err(|e| InputError::NotUtf8 {
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })
}

/// Every duration's syntax (the CLI's flags, a workflow's `retry:`), one
/// parser (jiff's): a number and a unit
/// (`500ms`, `90s`, `10m`, `1.5h`, `7d`, `2w`), jiff's friendly format
/// (`1h 30m`, `2 days`), ISO 8601 (`PT90S`), or plain seconds (`90`,
/// `0.5`). Days are 24 hours; months and years are refused (they have no
/// fixed length).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return std::time::Duration::try_from_secs_f64(secs).map_err(|e| format!("'{s}': {e}"));
    }
    let span: jiff::Span = t
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (examples: 90s, 10m, 1h, 7d, 1h 30m)"))?;
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(format!(
            "'{s}': months and years have no fixed length; use days or weeks (e.g. 60d, 8w)"
        ));
    }
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| format!("'{s}' is too long"))?;
    std::time::Duration::try_from(signed).map_err(|_| format!("'{s}' is negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_its_cap_is_refused_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        std::fs::write(&path, "x".repeat(11)).unwrap();
        assert_eq!(read_capped(&path, 11, "workflow").unwrap().len(), 11);
        let e = read_capped(&path, 10, "workflow").unwrap_err().to_string();
        assert!(
            e.contains("larger than 10 bytes") && e.contains("it is 11 bytes"),
            "{e}"
        );
        // A device that never ends is read up to the cap only.
        let e = read_capped(Path::new("/dev/zero"), 1000, "workflow").unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
        std::fs::write(&path, [0xffu8, 0xfe]).unwrap();
        let e = read_text_capped(&path, 10, "workflow")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
