//! The extractor: an agent's markdown reply → frontmatter `meta` (validated
//! against the role's JSON Schema), the body text, and artifact refs
//! (schema properties with `format: uwf-hash`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::hash::Hash;
use crate::node::Value;
use crate::workflow::Role;

use crate::cache::Bounded;

/// What a reply yields.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// The frontmatter keys the schema names (and `$status`).
    pub meta: BTreeMap<String, Value>,
    /// The body after the frontmatter.
    pub body: String,
    /// Hashes from `format: uwf-hash` properties.
    pub artifacts: Vec<Hash>,
    /// The reserved `$usage` key, taken out of the frontmatter before the
    /// schema sees it (`crate::usage`).
    pub usage: Option<crate::usage::Usage>,
}

/// Why a reply was not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// The role has a schema but the reply has no frontmatter.
    #[error(
        "the reply has no frontmatter: it must start with a '---' line, YAML, and a closing '---' line"
    )]
    Missing,
    /// The frontmatter is not YAML, or not a map.
    #[error("the frontmatter is not a YAML map: {0}")]
    NotYaml(String),
    /// The frontmatter does not satisfy the schema.
    #[error("the frontmatter does not match the role's schema: {0}")]
    Schema(String),
    /// A `format: uwf-hash` value is not a full hash.
    #[error("property '{property}' must be a full 64-character hash (format uwf-hash): {detail}")]
    BadHash {
        /// The property.
        property: String,
        /// What is wrong.
        detail: String,
    },
}

/// The info strings of a code fence a reply may be wrapped in.
const REPLY_FENCES: [&str; 5] = ["", "markdown", "md", "yaml", "yml"];

/// A reply as models write it, made into the shape the extractor reads
/// (SPEC §13; `docs/design.md` §5f), exactly:
///
/// 1. every `\r\n` becomes `\n` (a lone `\r` stays);
/// 2. when what follows the leading whitespace (blank lines, spaces, tabs)
///    starts with `---` or a code fence, that whitespace is removed;
/// 3. when the reply is then one code fence — a first line of three
///    backticks with no info string or `markdown`, `md`, `yaml` or `yml`,
///    and a last non-blank line of three backticks — whose inside starts
///    with a `---` line, the reply is that inside (one fence only: a fence
///    inside it stays).
///
/// Anything else is left as it is, so a reply that is still not
/// frontmatter is re-asked with the extractor's error.
///
/// ```
/// use uwf_db::engine::extract::normalize_reply;
///
/// let wrapped = "\r\n```markdown\r\n---\r\n$status: done\r\n---\r\nAll done.\r\n```\r\n";
/// assert_eq!(normalize_reply(wrapped), "---\n$status: done\n---\nAll done.\n");
/// // A code block that holds no frontmatter is content, kept as it is.
/// assert_eq!(normalize_reply("```rust\nfn main() {}\n```"), "```rust\nfn main() {}\n```");
/// ```
pub fn normalize_reply(text: &str) -> Cow<'_, str> {
    let mut out: Cow<'_, str> = if text.contains("\r\n") {
        Cow::Owned(text.replace("\r\n", "\n"))
    } else {
        Cow::Borrowed(text)
    };
    let start = out.trim_start();
    if !(start.starts_with("---") || start.starts_with("```")) {
        return out;
    }
    let skip = out.len() - start.len();
    if let Some(inside) = unfence(start) {
        return Cow::Owned(inside.to_owned());
    }
    if skip > 0 {
        out = match out {
            Cow::Borrowed(b) => Cow::Borrowed(&b[skip..]),
            Cow::Owned(mut o) => {
                o.drain(..skip);
                Cow::Owned(o)
            }
        };
    }
    out
}

/// The inside of a reply that is one fence around frontmatter (see
/// [`normalize_reply`]), with its last line's newline; `None` otherwise.
fn unfence(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("```")?;
    let (info, inside) = rest.split_once('\n')?;
    if !REPLY_FENCES.contains(&info.trim()) {
        return None;
    }
    let inside = inside.trim_end();
    let inside = inside.strip_suffix("```")?;
    // The closing fence is a line of its own.
    if !(inside.is_empty() || inside.ends_with('\n')) {
        return None;
    }
    let first = inside.split('\n').next().unwrap_or_default();
    (first.trim_end() == "---").then_some(inside)
}

/// Splits `---\nYAML\n---\nbody`; `None` when there is no frontmatter.
fn split(text: &str) -> Option<(&str, &str)> {
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            let body = &rest[offset + line.len()..];
            return Some((&rest[..offset], body.strip_prefix('\n').unwrap_or(body)));
        }
        offset += line.len();
    }
    None
}

/// The common shape of agent frontmatter, read without a YAML parser: one
/// `key: value` per line, where every key and value is a plain string that
/// YAML could not read as anything else. Any other text (`None`) goes to the
/// YAML parser, so the result is always what the parser would give; the
/// `agent_reply` fuzz target checks exactly that.
///
/// A line qualifies when its key is `[A-Za-z_$][A-Za-z0-9_$-]*`, then `": "`,
/// then a value that starts with an ASCII letter, holds only printable ASCII
/// other than `#` and `:`, and is not a word YAML 1.2 reads as null or a
/// boolean (see [`crate::yaml`]: `yes`, `no`, `on`, `off`, `y` and `n` are
/// strings).
/// Duplicate keys do not qualify (the parser rejects them).
#[doc(hidden)]
pub fn flat_frontmatter(yaml: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    fn special(word: &str) -> bool {
        // Null, the YAML 1.2 booleans, and non-finite float spellings the
        // parser might take. `yes`, `no`, `on`, `off`, `y` and `n` are plain
        // strings in the YAML 1.2 core schema (`crate::yaml`).
        const WORDS: [&str; 5] = ["null", "true", "false", "nan", "inf"];
        WORDS.iter().any(|w| w.eq_ignore_ascii_case(word))
    }
    let mut map = serde_json::Map::new();
    for line in yaml.strip_suffix('\n').unwrap_or(yaml).split('\n') {
        let (key, value) = line.split_once(": ")?;
        let mut chars = key.chars();
        if !chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
            || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '-'))
            || special(key)
        {
            return None;
        }
        let value = value.trim_end_matches(' ');
        if !value.starts_with(|c: char| c.is_ascii_alphabetic())
            || !value
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) && b != b'#' && b != b':')
            || special(value)
        {
            return None;
        }
        if map
            .insert(key.to_owned(), serde_json::Value::String(value.to_owned()))
            .is_some()
        {
            return None;
        }
    }
    Some(map)
}

/// Extracts a reply for `role` (compiling its schema, if any, for this one
/// call; the engine keeps compiled schemas per store).
pub fn extract(role: &Role, text: &str) -> Result<Extracted, ExtractError> {
    extract_with(&Validators::default(), None, role, text)
}

/// [`extract`] with a cache of compiled schemas; `key` (workflow hash, role
/// name) names a role of a stored workflow, so its compiled schema is found
/// without re-serialising the schema.
pub(crate) fn extract_with(
    validators: &Validators,
    key: Option<(Hash, &str)>,
    role: &Role,
    text: &str,
) -> Result<Extracted, ExtractError> {
    let text = &*normalize_reply(text);
    let Some((yaml, body)) = split(text) else {
        if role.frontmatter.is_some() {
            return Err(ExtractError::Missing);
        }
        return Ok(Extracted {
            meta: BTreeMap::new(),
            body: text.to_owned(),
            artifacts: Vec::new(),
            usage: None,
        });
    };
    let mut front: serde_json::Value = if yaml.trim().is_empty() {
        serde_json::json!({})
    } else if let Some(flat) = flat_frontmatter(yaml) {
        serde_json::Value::Object(flat)
    } else {
        crate::yaml::from_str(yaml).map_err(|e| ExtractError::NotYaml(e.to_string()))?
    };
    // `$usage` is the engine's, not the role's: out before validation.
    let usage = front
        .as_object_mut()
        .and_then(|m| m.remove(crate::usage::USAGE_META))
        .and_then(|u| crate::usage::Usage::from_json(&u));
    let Some(map) = front.as_object() else {
        return Err(ExtractError::NotYaml(
            "it is not a map of keys to values".into(),
        ));
    };
    if map.get("$status").and_then(|v| v.as_str()) == Some(crate::workflow::model::SUSPEND) {
        // A suspend request (SPEC §13): not one of the role's variants, so
        // its schema does not apply; its reason is kept for the message.
        let meta = ["$status", "reason", "message"]
            .into_iter()
            .filter_map(|k| map.get(k).map(|v| (k.to_owned(), Value::from_json(v))))
            .collect();
        return Ok(Extracted {
            meta,
            body: body.to_owned(),
            artifacts: Vec::new(),
            usage,
        });
    }
    let mut meta = BTreeMap::new();
    let mut artifacts = Vec::new();
    match &role.frontmatter {
        None => {
            for (k, v) in map {
                meta.insert(k.clone(), Value::from_json(v));
            }
        }
        Some(schema) => {
            let validator = match key {
                Some((wf, name)) => validators.for_role(wf, name, schema)?,
                None => validators.compiled(schema)?,
            };
            let errors: Vec<String> = validator
                .iter_errors(&front)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    if at.is_empty() {
                        e.to_string()
                    } else {
                        format!("{at}: {e}")
                    }
                })
                .collect();
            if !errors.is_empty() {
                return Err(ExtractError::Schema(errors.join("; ")));
            }
            let named = named_properties(schema);
            for (k, v) in map {
                if k == "$status" || named.contains_key(k) {
                    meta.insert(k.clone(), Value::from_json(v));
                }
            }
            for (k, is_hash) in &named {
                if !is_hash {
                    continue;
                }
                let values: Vec<&serde_json::Value> = match map.get(k) {
                    Some(serde_json::Value::Array(a)) => a.iter().collect(),
                    Some(v) => vec![v],
                    None => vec![],
                };
                for v in values {
                    let s = v.as_str().ok_or_else(|| ExtractError::BadHash {
                        property: k.clone(),
                        detail: format!("{v} is not a string"),
                    })?;
                    let h: Hash = s.parse().map_err(|e: crate::hash::ParseHashError| {
                        ExtractError::BadHash {
                            property: k.clone(),
                            detail: e.to_string(),
                        }
                    })?;
                    if !artifacts.contains(&h) {
                        artifacts.push(h);
                    }
                }
            }
        }
    }
    Ok(Extracted {
        meta,
        body: body.to_owned(),
        artifacts,
        usage,
    })
}

/// The `$usage` an agent's reply reports in its frontmatter, read on its
/// own: for a reply that [`extract`] refused (a re-ask still costs).
pub(crate) fn reported_usage(text: &str) -> Option<crate::usage::Usage> {
    let text = &*normalize_reply(text);
    let (yaml, _) = split(text)?;
    if !yaml.contains(crate::usage::USAGE_META) {
        return None;
    }
    let front: serde_json::Value = match flat_frontmatter(yaml) {
        Some(flat) => serde_json::Value::Object(flat),
        None => crate::yaml::from_str(yaml).ok()?,
    };
    crate::usage::Usage::from_json(front.get(crate::usage::USAGE_META)?)
}

/// Compiled frontmatter schemas (one cache per store, in its engine state).
#[derive(Debug)]
pub(crate) struct Validators {
    /// By the schema's JSON text (roles are immutable once stored, and
    /// compiling a schema costs far more than validating with it).
    compiled: Bounded<String, Arc<jsonschema::Validator>>,
    /// By workflow hash, then role name.
    by_role: Bounded<Hash, HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Default for Validators {
    fn default() -> Self {
        Validators {
            compiled: Bounded::new(4096),
            by_role: Bounded::new(4096),
        }
    }
}

impl Validators {
    /// The compiled `schema`.
    fn compiled(
        &self,
        schema: &serde_json::Value,
    ) -> Result<Arc<jsonschema::Validator>, ExtractError> {
        let key = schema.to_string();
        if let Some(v) = self.compiled.get(&key) {
            return Ok(v);
        }
        let v = Arc::new(
            jsonschema::validator_for(schema).map_err(|e| ExtractError::Schema(e.to_string()))?,
        );
        self.compiled.insert(key, Arc::clone(&v));
        Ok(v)
    }

    /// The compiled schema of role `role` of the stored workflow `workflow`.
    fn for_role(
        &self,
        workflow: Hash,
        role: &str,
        schema: &serde_json::Value,
    ) -> Result<Arc<jsonschema::Validator>, ExtractError> {
        if let Some(v) = self.by_role.lock().get(&workflow).and_then(|m| m.get(role)) {
            return Ok(Arc::clone(v));
        }
        let v = self.compiled(schema)?;
        let mut cache = self.by_role.lock();
        if cache.len() >= self.by_role.capacity() {
            cache.clear();
        }
        cache
            .entry(workflow)
            .or_default()
            .insert(role.to_owned(), Arc::clone(&v));
        Ok(v)
    }
}

/// Properties named anywhere in the schema's top level or `oneOf`/`anyOf`
/// variants, and whether each is a `format: uwf-hash` (or an array of them).
fn named_properties(schema: &serde_json::Value) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let mut scan = |s: &serde_json::Value| {
        if let Some(props) = s.get("properties").and_then(|p| p.as_object()) {
            for (k, p) in props {
                let is_hash = p.get("format").and_then(|f| f.as_str()) == Some("uwf-hash")
                    || p.get("items")
                        .and_then(|i| i.get("format"))
                        .and_then(|f| f.as_str())
                        == Some("uwf-hash");
                *out.entry(k.clone()).or_insert(false) |= is_hash;
            }
        }
    };
    scan(schema);
    for key in ["oneOf", "anyOf", "allOf"] {
        for v in schema
            .get(key)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            scan(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reviewer() -> Role {
        Role {
            frontmatter: Some(json!({"oneOf": [
                {"properties": {"$status": {"const": "approved"}}, "required": ["$status"]},
                {"properties": {"$status": {"const": "rejected"}, "reason": {"type": "string"},
                    "patch": {"type": "string", "format": "uwf-hash"}},
                 "required": ["$status", "reason"]}
            ]})),
            ..Role::default()
        }
    }

    #[test]
    fn frontmatter_body_and_artifacts() {
        let h = Hash::of(b"patch");
        let text = format!(
            "---\n$status: rejected\nreason: no tests\npatch: {h}\nnoise: 1\n---\nPlease add tests.\n"
        );
        let x = extract(&reviewer(), &text).unwrap();
        assert_eq!(x.meta["$status"], Value::Str("rejected".into()));
        assert_eq!(x.meta["reason"], Value::Str("no tests".into()));
        assert!(!x.meta.contains_key("noise"), "only keys the schema names");
        assert_eq!(x.body, "Please add tests.\n");
        assert_eq!(x.artifacts, vec![h]);
    }

    /// The YAML 1.1 boolean words in every case (lower, Upper, UPPER):
    /// YAML 1.2 strings.
    const YAML_11_BOOLEANS: [&str; 16] = [
        "y", "Y", "n", "N", "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off",
        "OFF",
    ];

    /// The YAML 1.1 boolean words are strings for the fast path and the
    /// parser alike, as keys and as values.
    #[test]
    fn yaml_11_boolean_words_are_strings() {
        for w in YAML_11_BOOLEANS {
            let yaml = format!("$status: {w}\n{w}: {w}\n");
            let expected = json!({"$status": w, w: w});
            let fast = flat_frontmatter(&yaml).map(serde_json::Value::Object);
            assert_eq!(fast.as_ref(), Some(&expected), "fast path, {yaml:?}");
            let parsed: serde_json::Value = crate::yaml::from_str(&yaml).unwrap();
            assert_eq!(parsed, expected, "parser, {yaml:?}");
        }
    }

    /// The fast path gives exactly what the YAML parser gives, or stands
    /// aside.
    #[test]
    fn flat_frontmatter_agrees_with_the_parser() {
        let values = [
            "approved",
            "the README does not mention --json",
            "null",
            "Null",
            "NULL",
            "true",
            "True",
            "FALSE",
            "nan",
            "NaN",
            ".nan",
            "inf",
            ".inf",
            "-.inf",
            "Infinity",
            "infinity",
            "e10",
            "E5",
            "x1",
            "0x1f",
            "0o17",
            "12",
            "1.5",
            "1e3",
            "~",
            "a: b",
            "a #c",
            "a#c",
            "'quoted'",
            "\"dq\"",
            "it's",
            "[a, b]",
            "{a: 1}",
            "a [b]",
            "a {b}",
            "*alias",
            "&anchor a",
            "!tag a",
            "|",
            ">",
            "- item",
            "?",
            "%x",
            "@x",
            "`x",
            "a,b",
            "a  b",
            "trailing  ",
            "tab\there",
            "ünïcode",
            "",
            "2026-11-22",
            "T",
            "F",
            "yes please",
            "nulls",
            "o",
            "off-by-one",
        ];
        let keys = [
            "$status", "reason", "_k", "a-b", "yes", "null", "1a", "a b", "a:b", "k",
        ];
        let mut checked = 0;
        for k in keys.into_iter().chain(YAML_11_BOOLEANS) {
            for v in values.into_iter().chain(YAML_11_BOOLEANS) {
                let yaml = format!("{k}: {v}\nother: word\n");
                let parsed: Result<serde_json::Value, _> = crate::yaml::from_str(&yaml);
                if let Some(fast) = flat_frontmatter(&yaml) {
                    checked += 1;
                    assert_eq!(
                        parsed.as_ref().ok(),
                        Some(&serde_json::Value::Object(fast)),
                        "{yaml:?}"
                    );
                }
            }
        }
        assert!(checked > 50, "the fast path took only {checked} inputs");
        assert!(flat_frontmatter("a: b\na: c\n").is_none(), "duplicate keys");
        assert!(flat_frontmatter("a: b\r\n").is_none());
        assert!(
            flat_frontmatter("a: b\n  c\n").is_none(),
            "continuation line"
        );
    }

    #[test]
    fn replies_as_models_write_them_are_accepted() {
        let want = extract(&reviewer(), "---\n$status: approved\n---\nLooks good.\n").unwrap();
        for reply in [
            "\n\n  ---\n$status: approved\n---\nLooks good.\n",
            "---\r\n$status: approved\r\n---\r\nLooks good.\r\n",
            "```markdown\n---\n$status: approved\n---\nLooks good.\n```",
            "```md\n---\n$status: approved\n---\nLooks good.\n```\n\n",
            "\n```yaml\r\n---\r\n$status: approved\r\n---\r\nLooks good.\r\n```\r\n",
            "```\n---\n$status: approved\n---\nLooks good.\n```",
        ] {
            assert_eq!(extract(&reviewer(), reply).as_ref(), Ok(&want), "{reply:?}");
        }
        // A fence inside the body stays; only the enclosing one goes.
        let x = extract(
            &reviewer(),
            "```markdown\n---\n$status: approved\n---\n```sh\nls\n```\n```",
        )
        .unwrap();
        assert_eq!(x.body, "```sh\nls\n```\n");
        // Not one enclosing fence of a known kind: still no frontmatter.
        for reply in [
            "```python\n---\n$status: approved\n---\n```",
            "```markdown\n---\n$status: approved\n---\n",
            "Here it is:\n```markdown\n---\n$status: approved\n---\n```",
            "```markdown\n---\n$status: approved\n---\nbody```",
        ] {
            assert_eq!(
                extract(&reviewer(), reply),
                Err(ExtractError::Missing),
                "{reply:?}"
            );
        }
        // A schemaless role's body keeps its code blocks and indentation.
        let x = extract(&Role::default(), "```sh\nls\n```").unwrap();
        assert_eq!(x.body, "```sh\nls\n```");
        let x = extract(&Role::default(), "    indented code").unwrap();
        assert_eq!(x.body, "    indented code");
    }

    #[test]
    fn invalid_replies_say_why() {
        assert_eq!(
            extract(&reviewer(), "no frontmatter"),
            Err(ExtractError::Missing)
        );
        let e = extract(&reviewer(), "---\n$status: rejected\n---\nbody").unwrap_err();
        assert!(matches!(e, ExtractError::Schema(_)), "{e}");
        let e = extract(&reviewer(), "---\n- a list\n---\n").unwrap_err();
        assert!(matches!(e, ExtractError::NotYaml(_)), "{e}");
        let e = extract(
            &reviewer(),
            "---\n$status: rejected\nreason: r\npatch: abc\n---\n",
        )
        .unwrap_err();
        assert!(matches!(e, ExtractError::BadHash { .. }), "{e}");
        // A role without a schema takes any reply.
        let x = extract(&Role::default(), "just text").unwrap();
        assert!(x.meta.is_empty());
    }
}
