//! What a role step keeps of its agent call, for debugging an agent: the
//! exact prompt it was sent and the tail of what it wrote on stderr
//! (`docs/design.md` §5e "Kept with a step"). The step's `$prompt` meta
//! holds the prompt: its role's header as a content blob (the same for
//! every step of the role, so stored once) and the rest inline, or in a
//! blob of its own when long; `$stderr` names a content blob. Every blob
//! kept is a ref of the step's input node, so GC, export and `verify`
//! treat it as the rest of the chain. A store-wide switch turns keeping
//! prompts off.

use std::sync::atomic::Ordering;

use crate::backend::Table;
use crate::hash::Hash;
use crate::node::{Blob, EncodedBlob, Value};
use crate::store::StoreError;

use super::{Engine, EngineError};

/// The meta key of the step's kept prompt: a map of `header` (a hash, in
/// hex) and `rest` (text) or `rest_blob` (a hash, in hex).
pub const PROMPT_META: &str = "$prompt";
/// The longest rest of a prompt kept inline in the step's node; a longer
/// one is a blob (a state node is read whole by every later step's
/// context, so it stays small).
pub const INLINE_REST: usize = 4 << 10;
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

/// The blobs to keep with a step (each a ref of its input node) and the
/// meta entries naming them: the prompt (unless `keep_prompt` is off)
/// and a non-empty stderr tail. Encoded (and hashed) once, here, outside
/// the write transaction.
///
/// A prompt that begins with its role's `header` (goal, procedure, output
/// format…: the same for every step of the role) keeps the header as a
/// blob shared by all those steps and only the rest, inline: a step of
/// the review workflow adds about a hundred bytes to its own node and no
/// new blob (its input node, the instruction with the header as its ref,
/// is shared too).
pub(super) fn kept_blobs(
    prompt: &str,
    header: &str,
    stderr: Option<&str>,
    keep_prompt: bool,
) -> Result<(Vec<EncodedBlob>, MetaEntries), EngineError> {
    let encode = |text: String| {
        Blob::content(text, [])
            .encode()
            .map_err(|e| EngineError::from(StoreError::from(e)))
    };
    let mut blobs = Vec::new();
    let mut meta = Vec::new();
    if keep_prompt {
        let mut kept = std::collections::BTreeMap::new();
        let rest = match prompt.strip_prefix(header).filter(|_| !header.is_empty()) {
            Some(rest) => {
                let head = encode(header.to_owned())?;
                kept.insert("header".to_owned(), Value::Str(head.hash().to_string()));
                blobs.push(head);
                rest
            }
            None => prompt,
        };
        let rest = capped(rest, MAX_KEPT_PROMPT);
        if rest.len() <= INLINE_REST {
            kept.insert("rest".to_owned(), Value::Str(rest));
        } else {
            let blob = encode(rest)?;
            kept.insert("rest_blob".to_owned(), Value::Str(blob.hash().to_string()));
            blobs.push(blob);
        }
        meta.push((PROMPT_META.to_owned(), Value::Map(kept)));
    }
    if let Some(tail) = stderr.map(str::trim).filter(|t| !t.is_empty()) {
        let blob = encode(tail.to_owned())?;
        meta.push((STDERR_META.to_owned(), Value::Str(blob.hash().to_string())));
        blobs.push(blob);
    }
    Ok((blobs, meta))
}

/// A hash in `value`, when it is one of the input node's refs (an
/// agent's own `$prompt`/`$stderr` frontmatter is never taken for kept
/// blobs: the engine drops such keys before it writes a step).
fn kept_hash(value: Option<&Value>, input_refs: &[Hash]) -> Option<Hash> {
    match value {
        Some(Value::Str(s)) => s.parse::<Hash>().ok().filter(|h| input_refs.contains(h)),
        _ => None,
    }
}

/// What a step kept, read from its node's meta and input refs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Whether the step kept its prompt.
    pub prompt: bool,
    /// The stderr tail's blob.
    pub stderr: Option<Hash>,
}

impl Kept {
    /// What the step with `meta` and input refs `input_refs` kept.
    pub fn of(meta: &std::collections::BTreeMap<String, Value>, input_refs: &[Hash]) -> Kept {
        let prompt = match meta.get(PROMPT_META) {
            Some(Value::Map(m)) => {
                let header_ok =
                    m.get("header").is_none() || kept_hash(m.get("header"), input_refs).is_some();
                let rest_ok = matches!(m.get("rest"), Some(Value::Str(_)))
                    || kept_hash(m.get("rest_blob"), input_refs).is_some();
                header_ok && rest_ok
            }
            _ => false,
        };
        Kept {
            prompt,
            stderr: kept_hash(meta.get(STDERR_META), input_refs),
        }
    }
}

/// The prompt a step kept, whole (its header's text, then the rest), or
/// `None` when it kept none.
pub fn prompt_text(
    store: &crate::Store,
    meta: &std::collections::BTreeMap<String, Value>,
    input_refs: &[Hash],
) -> Result<Option<String>, crate::thread::ThreadError> {
    if !Kept::of(meta, input_refs).prompt {
        return Ok(None);
    }
    let Some(Value::Map(m)) = meta.get(PROMPT_META) else {
        return Ok(None);
    };
    let mut text = match kept_hash(m.get("header"), input_refs) {
        Some(h) => store.threads().content_text(&h)?,
        None => String::new(),
    };
    match (m.get("rest"), kept_hash(m.get("rest_blob"), input_refs)) {
        (Some(Value::Str(rest)), _) => text.push_str(rest),
        (_, Some(h)) => text.push_str(&store.threads().content_text(&h)?),
        _ => {}
    }
    Ok(Some(text))
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
        let (blobs, meta) = kept_blobs("p", "", Some("  \n"), false).unwrap();
        assert!(blobs.is_empty() && meta.is_empty());
        let (blobs, meta) = kept_blobs("p", "", Some("warn\n"), true).unwrap();
        assert_eq!(blobs.len(), 1, "the stderr; the prompt is inline");
        assert_eq!(meta[0].0, PROMPT_META);
        assert_eq!(meta[1].0, STDERR_META);
    }

    /// Stores `blobs` and reads the prompt back as a log entry would.
    fn read_back(blobs: &[EncodedBlob], meta: &MetaEntries) -> Option<String> {
        let store = crate::Store::memory();
        store
            .write(|w| {
                for b in blobs {
                    w.store_encoded(b)?;
                }
                Ok::<_, StoreError>(())
            })
            .unwrap();
        let meta: std::collections::BTreeMap<String, Value> = meta.iter().cloned().collect();
        let refs: Vec<Hash> = blobs.iter().map(EncodedBlob::hash).collect();
        prompt_text(&store, &meta, &refs).unwrap()
    }

    #[test]
    fn a_prompt_is_kept_as_its_role_header_and_the_rest() {
        let header = "# Role: r\nGoal\n";
        let (blobs, meta) = kept_blobs("# Role: r\nGoal\n## Task\nt", header, None, true).unwrap();
        assert_eq!(blobs.len(), 1, "the header; the rest inline");
        assert_eq!(
            read_back(&blobs, &meta).as_deref(),
            Some("# Role: r\nGoal\n## Task\nt")
        );
        // Another step of the role shares the header blob.
        let (again, _) = kept_blobs("# Role: r\nGoal\n## Task\nu", header, None, true).unwrap();
        assert_eq!(again[0].hash(), blobs[0].hash());
        // A long rest is a blob of its own.
        let long = format!("{header}{}", "x".repeat(INLINE_REST + 1));
        let (blobs, meta) = kept_blobs(&long, header, None, true).unwrap();
        assert_eq!(blobs.len(), 2);
        assert_eq!(read_back(&blobs, &meta), Some(long));
        // Without the refs (an agent's own `$prompt`), nothing is taken.
        let meta: std::collections::BTreeMap<String, Value> = meta.into_iter().collect();
        assert!(!Kept::of(&meta, &[]).prompt);
    }
}
