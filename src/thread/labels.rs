//! Labels: `KEY=VALUE` pairs on a thread (SPEC §11), and the keys of the
//! `labels` index that serves `thread list --label` a page at a time.
//!
//! Index layout (`docs/design.md` §4, `labels`): the key is the label's
//! key, a 0 byte, its value, a 0 byte, then the thread's last activity
//! (u64 BE ms) and id — the same 24-byte suffix as the thread's `activity`
//! entry — and the value is that `activity` entry's value. A thread with
//! three labels has three entries, all moved with its `activity` entry by
//! every write of the record. Keys and values contain no 0 byte, so the
//! prefix of one label never is the prefix of another.

use super::ThreadId;

pub use crate::record::Labels;

/// Most labels on one thread.
pub const MAX_LABELS: usize = 32;

/// Longest label key, in bytes.
pub const MAX_LABEL_KEY: usize = 63;

/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE: usize = 255;

/// Why a label was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// Not `KEY=VALUE`.
    #[error("label '{0}' is not KEY=VALUE")]
    NotPair(String),
    /// A key with characters outside the allowed set, empty or too long.
    #[error(
        "label key '{0}' is not valid: use 1 to 63 letters, digits, '.', '_', '-' or '/', starting with a letter or digit"
    )]
    BadKey(String),
    /// A value over [`MAX_LABEL_VALUE`] bytes.
    #[error("the value of label '{key}' has {len} bytes; the most is 255")]
    ValueTooLong {
        /// The label's key.
        key: String,
        /// The value's length.
        len: usize,
    },
    /// A value with a control character (a 0 byte, a newline, …).
    #[error("the value of label '{0}' contains a control character")]
    ValueControl(String),
    /// More than [`MAX_LABELS`] labels on one thread.
    #[error("a thread carries at most 32 labels; this would give it {0}")]
    TooMany(usize),
}

/// Checks a label key: 1 to 63 ASCII letters, digits, `.`, `_`, `-` or
/// `/`, starting with a letter or digit.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_LABEL_KEY
        && key
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
    if ok {
        Ok(())
    } else {
        Err(LabelError::BadKey(key.to_owned()))
    }
}

/// Checks a label: its key ([`check_key`]) and its value (at most 255
/// bytes of UTF-8 without control characters; empty is allowed).
pub fn check_label(key: &str, value: &str) -> Result<(), LabelError> {
    check_key(key)?;
    if value.len() > MAX_LABEL_VALUE {
        return Err(LabelError::ValueTooLong {
            key: key.to_owned(),
            len: value.len(),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(LabelError::ValueControl(key.to_owned()));
    }
    Ok(())
}

/// Checks every label of a set and their number.
pub fn check_labels(labels: &Labels) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany(labels.len()));
    }
    labels.iter().try_for_each(|(k, v)| check_label(k, v))
}

/// Parses `KEY=VALUE` (split at the first `=`) and checks it.
pub fn parse_label(text: &str) -> Result<(String, String), LabelError> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| LabelError::NotPair(text.to_owned()))?;
    check_label(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// The key prefix of one label's entries in the `labels` index.
pub(crate) fn label_prefix(key: &str, value: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + value.len() + 2 + 24);
    k.extend_from_slice(key.as_bytes());
    k.push(0);
    k.extend_from_slice(value.as_bytes());
    k.push(0);
    k
}

/// A `labels` index key: the label's prefix, then `suffix` (the thread's
/// `activity` key: last activity, id).
pub(crate) fn label_key(key: &str, value: &str, suffix: &[u8; 24]) -> Vec<u8> {
    let mut k = label_prefix(key, value);
    k.extend_from_slice(suffix);
    k
}

/// A `labels` index key's parts: the label's key and value, the last
/// activity and the thread; `None` for bytes of another shape.
pub(crate) fn parse_label_key(key: &[u8]) -> Option<(String, String, u64, ThreadId)> {
    let split = key.len().checked_sub(24)?;
    let (label, suffix) = key.split_at(split);
    let (at, id) = suffix.split_first_chunk::<8>()?;
    let label = label.strip_suffix(&[0])?;
    let zero = label.iter().position(|b| *b == 0)?;
    let (k, v) = (label.get(..zero)?, label.get(zero + 1..)?);
    Some((
        String::from_utf8(k.to_vec()).ok()?,
        String::from_utf8(v.to_vec()).ok()?,
        u64::from_be_bytes(*at),
        ThreadId::from_slice(id)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_check() {
        assert_eq!(
            parse_label("team=a=b").unwrap(),
            ("team".into(), "a=b".into())
        );
        assert_eq!(parse_label("k=").unwrap(), ("k".into(), String::new()));
        assert!(matches!(parse_label("team"), Err(LabelError::NotPair(_))));
        assert!(matches!(parse_label("=a"), Err(LabelError::BadKey(_))));
        assert!(matches!(parse_label("-x=a"), Err(LabelError::BadKey(_))));
        assert!(matches!(parse_label("a b=c"), Err(LabelError::BadKey(_))));
        assert!(matches!(
            parse_label(&format!("{}=v", "k".repeat(64))),
            Err(LabelError::BadKey(_))
        ));
        assert!(parse_label(&format!("{}=v", "k".repeat(63))).is_ok());
        assert!(matches!(
            parse_label(&format!("k={}", "v".repeat(256))),
            Err(LabelError::ValueTooLong { len: 256, .. })
        ));
        assert!(matches!(
            parse_label("k=a\0b"),
            Err(LabelError::ValueControl(_))
        ));
        assert!(matches!(
            parse_label("k=a\nb"),
            Err(LabelError::ValueControl(_))
        ));
        let many: Labels = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(check_labels(&many), Err(LabelError::TooMany(33)));
    }

    #[test]
    fn label_keys_parse_back() {
        let id = ThreadId::generate();
        let mut suffix = [0u8; 24];
        suffix[..8].copy_from_slice(&77u64.to_be_bytes());
        suffix[8..].copy_from_slice(&id.to_bytes());
        let key = label_key("team", "a=b", &suffix);
        assert_eq!(
            parse_label_key(&key),
            Some(("team".into(), "a=b".into(), 77, id))
        );
        // No 0 byte between key and value: not a label key.
        let mut no_split = b"team".to_vec();
        no_split.push(0);
        no_split.extend_from_slice(&suffix);
        assert_eq!(parse_label_key(&no_split), None);
        assert_eq!(parse_label_key(b"short"), None);
    }

    #[test]
    fn one_labels_prefix_is_never_anothers() {
        // `a=bc` and `ab=c`, `a=b` and `a=bc`: 0 bytes keep them apart.
        let pairs = [("a", "bc"), ("ab", "c"), ("a", "b"), ("a", "")];
        for (i, (k1, v1)) in pairs.iter().enumerate() {
            for (j, (k2, v2)) in pairs.iter().enumerate() {
                if i != j {
                    assert!(!label_prefix(k1, v1).starts_with(&label_prefix(k2, v2)));
                }
            }
        }
    }
}
