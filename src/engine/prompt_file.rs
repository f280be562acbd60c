//! The prompts file of `batch --prompts FILE`: one prompt per non-empty
//! line; in a `.jsonl` file each line is a JSON string or an object with a
//! `prompt` string and optional `labels` (so a prompt may span lines).
//! Read whole, capped ([`MAX_PROMPTS`] bytes, each prompt [`MAX_PROMPT`]),
//! and checked before any thread starts.

use std::path::{Path, PathBuf};

use super::batch::BatchPrompt;
use crate::input::{InputError, MAX_PROMPT, MAX_PROMPTS, read_text_capped};
use crate::thread::{Labels, check_label, check_labels};

/// Why a prompts file cannot be used; every variant names the file (and
/// the line, counted from 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PromptFileError {
    /// The file cannot be read, is too large or is not UTF-8.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A prompt longer than [`MAX_PROMPT`].
    #[error("{}:{line}: a prompt of {len} bytes; a prompt may be at most {MAX_PROMPT} bytes", path.display())]
    TooLong {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
        /// The prompt's length in bytes.
        len: usize,
    },
    /// A `.jsonl` line that is not JSON.
    #[error("{}:{line}: not JSON: {detail}", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
        /// The parser's message.
        detail: String,
    },
    /// A `.jsonl` line that is JSON but no prompt.
    #[error("{}:{line}: expected a JSON string or an object with a \"prompt\" string", path.display())]
    NotAPrompt {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
    },
    /// A line's `labels` that are not an object of valid labels.
    #[error("{}:{line}: {detail}", path.display())]
    BadLabels {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// No prompt at all.
    #[error("{} holds no prompts (one per non-empty line; JSON Lines for .jsonl)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The prompts of `file`, in order.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let file = dir.path().join("prompts.jsonl");
/// std::fs::write(&file, "\"one\"\n{\"prompt\": \"two\", \"labels\": {\"team\": \"a\"}}\n")?;
/// let prompts = uwf_db::engine::prompt_file::read_prompts(&file)?;
/// assert_eq!(prompts.len(), 2);
/// assert_eq!(prompts[1].labels["team"], "a");
/// std::fs::write(&file, "{\"prompt\": 3}\n")?;
/// let err = uwf_db::engine::prompt_file::read_prompts(&file).unwrap_err();
/// assert!(err.to_string().ends_with(":1: expected a JSON string or an object with a \"prompt\" string"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_prompts(file: &Path) -> Result<Vec<BatchPrompt>, PromptFileError> {
    let text = read_text_capped(file, MAX_PROMPTS, "prompts file")?;
    let json = file.extension().is_some_and(|e| e == "jsonl");
    let too_long = |line: usize, len: usize| PromptFileError::TooLong {
        path: file.to_path_buf(),
        line,
        len,
    };
    let mut prompts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = n + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !json {
            if line.len() > MAX_PROMPT {
                return Err(too_long(at, line.len()));
            }
            prompts.push(BatchPrompt::from(line.to_owned()));
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| PromptFileError::NotJson {
                path: file.to_path_buf(),
                line: at,
                detail: e.to_string(),
            })?;
        match value
            .as_str()
            .or_else(|| value.get("prompt").and_then(|p| p.as_str()))
        {
            Some(p) if p.len() > MAX_PROMPT => return Err(too_long(at, p.len())),
            Some(p) => prompts.push(BatchPrompt {
                prompt: p.to_owned(),
                labels: line_labels(&value).map_err(|detail| PromptFileError::BadLabels {
                    path: file.to_path_buf(),
                    line: at,
                    detail,
                })?,
            }),
            None => {
                return Err(PromptFileError::NotAPrompt {
                    path: file.to_path_buf(),
                    line: at,
                });
            }
        }
    }
    if prompts.is_empty() {
        return Err(PromptFileError::Empty {
            path: file.to_path_buf(),
        });
    }
    Ok(prompts)
}

/// The labels of a `.jsonl` prompt object (`"labels": {"K": "V", …}`):
/// absent is none; anything but an object of strings, or a bad label, is
/// an error.
fn line_labels(value: &serde_json::Value) -> Result<Labels, String> {
    let Some(labels) = value.get("labels") else {
        return Ok(Labels::new());
    };
    let object = labels
        .as_object()
        .ok_or_else(|| "\"labels\" must be an object of strings".to_owned())?;
    let mut out = Labels::new();
    for (k, v) in object {
        let v = v
            .as_str()
            .ok_or_else(|| format!("label '{k}' must be a string"))?;
        check_label(k, v).map_err(|e| e.to_string())?;
        out.insert(k.clone(), v.to_owned());
    }
    check_labels(&out).map_err(|e| e.to_string())?;
    Ok(out)
}
