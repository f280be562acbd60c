//! What a role step keeps of its agent call, for debugging an agent: the
//! exact prompt it was sent and the tail of what it wrote on stderr
//! (`docs/design.md` §5e "Kept with a step"). Each is a content blob, a
//! ref of the step's input node (so GC, export and `verify` treat it as
//! the rest of the chain), named by the step's `$prompt` and `$stderr`
//! meta keys. A store-wide switch turns keeping prompts off.

use std::sync::atomic::Ordering;

use crate::backend::Table;
use crate::hash::Hash;
use crate::node::{Blob, EncodedBlob, Value};
use crate::store::StoreError;

use super::{Engine, EngineError};

/// The meta key naming the step's kept prompt (a hash, in hex).
pub const PROMPT_META: &str = "$prompt";
/// The meta key naming the step's kept stderr tail (a hash, in hex).
pub const STDERR_META: &str = "$stderr";
/// The most bytes of a prompt kept; a longer one is kept to there, with a
/// line saying how much was left out.
pub const MAX_KEPT_PROMPT: usize = 1 << 20;

/// The `meta` table's key of the switch (absent: prompts are kept).
const SWITCH_KEY: &str = "keep_prompts";
/// [`EngineState::keep_prompts`](super::state::EngineState): not read yet,
/// off, on.
pub(super) const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// `text` cut to at most `max` bytes (on a character boundary), with a
/// line saying how many bytes were left out.
fn capped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[uwf-db kept the first {end} of {} bytes of this prompt]\n",
        &text[..end],
        text.len()
    )
}

/// Meta entries to add to a step.
pub(super) type MetaEntries = Vec<(String, Value)>;

/// The blobs to keep with a step and the meta entries naming them:
/// the prompt (unless `keep_prompt` is off) and a non-empty stderr tail.
/// Encoded (and hashed) once, here, outside the write transaction.
pub(super) fn kept_blobs(
    prompt: &str,
    stderr: Option<&str>,
    keep_prompt: bool,
) -> Result<(Vec<EncodedBlob>, MetaEntries), EngineError> {
    let mut blobs = Vec::new();
    let mut meta = Vec::new();
    let mut keep = |key: &str, text: String| -> Result<(), EngineError> {
        let blob = Blob::content(text, []).encode().map_err(StoreError::from)?;
        meta.push((key.to_owned(), Value::Str(blob.hash().to_string())));
        blobs.push(blob);
        Ok(())
    };
    if keep_prompt {
        keep(PROMPT_META, capped(prompt, MAX_KEPT_PROMPT))?;
    }
    if let Some(tail) = stderr.map(str::trim).filter(|t| !t.is_empty()) {
        keep(STDERR_META, tail.to_owned())?;
    }
    Ok((blobs, meta))
}

/// The hash a kept-text meta key names, when it is one of the input
/// node's refs (an agent's own `$prompt: …` frontmatter is never taken
/// for one: the engine drops such keys before it writes a step).
pub fn kept_ref(
    meta: &std::collections::BTreeMap<String, Value>,
    key: &str,
    input_refs: &[Hash],
) -> Option<Hash> {
    match meta.get(key) {
        Some(Value::Str(s)) => s.parse::<Hash>().ok().filter(|h| input_refs.contains(h)),
        _ => None,
    }
}

impl Engine {
    /// Whether role steps keep the exact prompt their agent was sent (the
    /// store-wide switch; on unless turned off). Read once per store
    /// handle: a driver already running keeps what it read.
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// assert!(store.engine().keep_prompts()?);
    /// store.engine().set_keep_prompts(false)?;
    /// assert!(!store.engine().keep_prompts()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep_prompts(&self) -> Result<bool, EngineError> {
        let known = &self.engine_state().keep_prompts;
        match known.load(Ordering::Relaxed) {
            ON => return Ok(true),
            OFF => return Ok(false),
            _ => {}
        }
        let stored = self.store.read(|r| {
            Ok::<_, StoreError>(
                r.tables()
                    .get(Table::Meta, SWITCH_KEY.as_bytes())?
                    .map(|v| v.into_owned()),
            )
        })?;
        let on = stored.as_deref() != Some(b"off".as_slice());
        known.store(if on { ON } else { OFF }, Ordering::Relaxed);
        Ok(on)
    }

    /// Turns keeping prompts on or off for the whole store (drivers that
    /// open it afterwards, and this handle at once). Stderr tails are kept
    /// either way: they are the agent's own words about the call.
    pub fn set_keep_prompts(&self, on: bool) -> Result<(), EngineError> {
        self.store.write(|w| {
            let t = w.tables_mut();
            if on {
                t.remove(Table::Meta, SWITCH_KEY.as_bytes())?;
            } else {
                t.put(Table::Meta, SWITCH_KEY.as_bytes(), b"off")?;
            }
            Ok::<_, StoreError>(())
        })?;
        self.engine_state()
            .keep_prompts
            .store(if on { ON } else { OFF }, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_is_kept_to_its_cap_on_a_character_boundary() {
        let text = "é".repeat(10);
        let kept = capped(&text, 5);
        assert!(
            kept.starts_with("éé\n[uwf-db kept the first 4 of 20 bytes"),
            "{kept}"
        );
        assert_eq!(capped("short", 5), "short");
    }

    #[test]
    fn an_empty_stderr_keeps_nothing() {
        let (blobs, meta) = kept_blobs("p", Some("  \n"), false).unwrap();
        assert!(blobs.is_empty() && meta.is_empty());
        let (blobs, meta) = kept_blobs("p", Some("warn\n"), true).unwrap();
        assert_eq!(blobs.len(), 2);
        assert_eq!(meta[0].0, PROMPT_META);
        assert_eq!(meta[1].0, STDERR_META);
    }
}
