//! Blobs and their typed payloads: `start`, `state`, `content`, `workflow`.
//!
//! A blob is encoded as the canonical map `{kind, payload, refs}` (see
//! [`crate::codec`] and `docs/design.md`). For every kind, `refs` is derived
//! from the payload by [`Blob::collect_refs`] and never supplied by hand, so a
//! decoded blob whose `refs` differ from its payload's is refused.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::codec::{self, CodecError};
use crate::hash::Hash;

/// The kind of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Kind {
    /// A thread's start node.
    Start,
    /// One role step, or one end of a thread.
    State,
    /// Text (an agent's reply, an instruction, a prompt) plus artifact refs.
    Content,
    /// A parsed, validated workflow definition.
    Workflow,
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 4] = [Kind::Start, Kind::State, Kind::Content, Kind::Workflow];

    /// The name used in the encoding and in output.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Start => "start",
            Kind::State => "state",
            Kind::Content => "content",
            Kind::Workflow => "workflow",
        }
    }

    /// The one-byte code stored in the blob record header (`docs/design.md`).
    pub const fn code(self) -> u8 {
        match self {
            Kind::Start => 0,
            Kind::State => 1,
            Kind::Content => 2,
            Kind::Workflow => 3,
        }
    }

    /// The kind for a header code.
    pub fn from_code(code: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The kind for an encoded name.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Structured data inside a payload (a state node's `meta`, a workflow).
///
/// Like JSON, but with the canonical rules built in: maps are `BTreeMap`s
/// (sorted keys whatever features other crates turn on), non-negative integers
/// are always [`Value::UInt`], and NaN cannot be decoded.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    /// Null.
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// A negative integer (non-negative ones are [`Value::UInt`]).
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    /// A float (not NaN), always encoded as `float 64`; `-0.0` is encoded as
    /// `0.0`, to which it is equal.
    Float(f64),
    /// UTF-8 text.
    Str(String),
    /// A list.
    Array(Vec<Value>),
    /// A map with sorted string keys.
    Map(BTreeMap<String, Value>),
}

impl Value {
    /// An integer in its canonical variant.
    pub fn int(v: i64) -> Value {
        u64::try_from(v).map_or(Value::Int(v), Value::UInt)
    }

    /// Converts from JSON. Integers keep their value; other numbers become floats.
    pub fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => n
                .as_u64()
                .map(Value::UInt)
                .or_else(|| n.as_i64().map(Value::int))
                .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(0.0))),
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(a) => Value::Array(a.iter().map(Value::from_json).collect()),
            serde_json::Value::Object(o) => Value::Map(
                o.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Converts to JSON (infinite floats become null, as JSON has no infinity).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::UInt(u) => serde_json::Value::from(*u),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Array(a) => serde_json::Value::Array(a.iter().map(Value::to_json).collect()),
            Value::Map(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }
}

/// A value is any JSON value (maps have string keys).
impl schemars::JsonSchema for Value {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Value".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Any JSON value: null, a boolean, a number, a string, a list or a map."
        })
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::UInt(u) => s.serialize_u64(*u),
            // -0.0 == 0.0: one value, one encoding.
            Value::Float(f) if *f == 0.0 => s.serialize_f64(0.0),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::Array(a) => a.serialize(s),
            Value::Map(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null, a boolean, a number, a string, a list or a map")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_none<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
                Ok(Value::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
                Ok(Value::int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
                Ok(Value::UInt(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
                if v.is_nan() {
                    return Err(E::custom("NaN is not allowed"));
                }
                Ok(Value::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Value, E> {
                Ok(Value::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element()? {
                    out.push(v);
                }
                Ok(Value::Array(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.insert(k, v);
                }
                Ok(Value::Map(out))
            }
        }
        d.deserialize_any(ValueVisitor)
    }
}

/// The first node of a thread: which workflow, with which task.
///
/// Fields are declared in the byte order of their names: the encoder writes
/// them in declaration order and the canonical layout needs sorted keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartNode {
    /// 0 for a top-level thread, parent depth + 1 for a child workflow.
    pub depth: u32,
    /// Loop protection: role steps allowed between two ends.
    pub max_rounds: u32,
    /// The workflow's name.
    pub name: String,
    /// The parent thread's head when this child workflow was spawned.
    pub parent_state: Option<Hash>,
    /// The `content` blob holding the task prompt.
    pub prompt: Hash,
    /// The stored `workflow` blob this thread runs.
    pub workflow: Hash,
}

/// One role step, or one end (`role == "__end__"`) of a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateNode {
    /// The parent state first, then up to 10 more recent ancestors, newest first.
    pub ancestors: Vec<Hash>,
    /// The final state of a child thread this step ran.
    pub child_thread: Option<Hash>,
    /// A summary of everything before this node.
    pub compact: Option<Hash>,
    /// The `content` node with the agent's reply body and artifact refs.
    pub content: Hash,
    /// The `content` node with the exact instruction the role was given.
    pub input: Hash,
    /// The agent's frontmatter, including `$status`.
    pub meta: BTreeMap<String, Value>,
    /// The role that ran, or `__end__`.
    pub role: String,
    /// Position in the chain: 1 for the first node after the start.
    pub seq: u64,
    /// The thread's start node.
    pub start: Hash,
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
}

/// Text plus the artifacts it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentNode {
    /// UTF-8 text.
    pub text: String,
    /// Artifact hashes (stored as the blob's `refs`).
    pub artifacts: Vec<Hash>,
}

/// A stored workflow definition (its typed model arrives with the engine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkflowNode {
    /// The definition as structured data.
    pub definition: Value,
}

/// A typed blob.
///
/// ```
/// use uwf_db::{Blob, ContentNode};
/// let blob = Blob::Content(ContentNode { text: "hello".into(), artifacts: vec![] });
/// let enc = blob.encode().unwrap();
/// assert_eq!(Blob::decode(enc.bytes()).unwrap(), blob);
/// assert_eq!(enc.hash(), uwf_db::Hash::of(enc.bytes()));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Blob {
    /// A start node.
    Start(StartNode),
    /// A state node.
    State(StateNode),
    /// A content node.
    Content(ContentNode),
    /// A workflow definition.
    Workflow(WorkflowNode),
}

/// A blob in its canonical bytes, with what the store needs beside them.
///
/// Only [`Blob::encode`] makes one, so `hash` always matches `bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedBlob {
    hash: Hash,
    kind: Kind,
    refs: Vec<Hash>,
    /// For state nodes: `refs` without the ancestors implied by the parent.
    to_check: Option<Vec<Hash>>,
    bytes: Vec<u8>,
}

impl EncodedBlob {
    /// BLAKE3 of the canonical bytes.
    pub fn hash(&self) -> Hash {
        self.hash
    }
    /// The blob's kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The blob's refs, as encoded.
    pub fn refs(&self) -> &[Hash] {
        &self.refs
    }
    /// The canonical encoding.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// The refs a write must find in the store. A state node's older
    /// ancestors are implied by its parent (`ancestors[0]`), which was itself
    /// checked when it was written, so only the parent is looked up.
    pub fn refs_to_check(&self) -> &[Hash] {
        self.to_check.as_deref().unwrap_or(&self.refs)
    }
}

/// Keeps the first occurrence of each hash, in order.
fn dedup_in_order(hashes: impl IntoIterator<Item = Hash>) -> Vec<Hash> {
    let mut out: Vec<Hash> = Vec::new();
    for h in hashes {
        if !out.contains(&h) {
            out.push(h);
        }
    }
    out
}

impl Blob {
    /// A content blob; duplicate artifacts are dropped, the first kept.
    pub fn content(text: impl Into<String>, artifacts: impl IntoIterator<Item = Hash>) -> Blob {
        Blob::Content(ContentNode {
            text: text.into(),
            artifacts: dedup_in_order(artifacts),
        })
    }

    /// The blob's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Blob::Start(_) => Kind::Start,
            Blob::State(_) => Kind::State,
            Blob::Content(_) => Kind::Content,
            Blob::Workflow(_) => Kind::Workflow,
        }
    }

    /// The blob's refs, derived from its payload: in the order SPEC §2 gives
    /// for each kind, null fields skipped, duplicates dropped (first kept).
    pub fn collect_refs(&self) -> Vec<Hash> {
        match self {
            Blob::Start(s) => dedup_in_order(
                [Some(s.prompt), Some(s.workflow), s.parent_state]
                    .into_iter()
                    .flatten(),
            ),
            Blob::State(s) => dedup_in_order(
                [s.start, s.content, s.input]
                    .into_iter()
                    .chain(s.ancestors.iter().copied())
                    .chain(s.compact)
                    .chain(s.child_thread),
            ),
            Blob::Content(c) => dedup_in_order(c.artifacts.iter().copied()),
            Blob::Workflow(_) => Vec::new(),
        }
    }

    /// Encodes the blob canonically and hashes it.
    pub fn encode(&self) -> Result<EncodedBlob, CodecError> {
        let refs = self.collect_refs();
        let bytes = codec::to_canonical(&WireBlob {
            blob: self,
            refs: &refs,
        })?;
        let to_check = match self {
            Blob::State(s) => Some(dedup_in_order(
                [s.start, s.content, s.input]
                    .into_iter()
                    .chain(s.ancestors.first().copied())
                    .chain(s.compact)
                    .chain(s.child_thread),
            )),
            _ => None,
        };
        Ok(EncodedBlob {
            hash: Hash::of(&bytes),
            kind: self.kind(),
            refs,
            to_check,
            bytes,
        })
    }

    /// Decodes canonical bytes, refusing any non-canonical encoding and any
    /// `refs` that differ from what the payload derives.
    pub fn decode(bytes: &[u8]) -> Result<Blob, CodecError> {
        codec::check_canonical(bytes)?;
        let DecodedBlob { blob, refs } = decode_wire(bytes)?;
        let derived = blob.collect_refs();
        if refs != derived {
            return Err(CodecError::Decode(format!(
                "refs {} do not match the {} payload's refs {}",
                list(&refs),
                blob.kind(),
                list(&derived)
            )));
        }
        let again = codec::to_canonical(&WireBlob {
            blob: &blob,
            refs: &derived,
        })?;
        if again != bytes {
            return Err(CodecError::ReencodeMismatch);
        }
        Ok(blob)
    }

    /// Decodes bytes that are known to be canonical (read back from the
    /// store, where they were checked when written and `verify` re-hashes
    /// them). Shape errors are still reported; canonicality is not rechecked.
    pub fn decode_trusted(bytes: &[u8]) -> Result<Blob, CodecError> {
        if let Some(content) = content_canonical(bytes) {
            return Ok(Blob::Content(content));
        }
        decode_wire(bytes).map(|d| d.blob)
    }
}

/// The canonical bytes every content blob starts with, up to its text's
/// header: `{"kind": "content", "payload": "...`.
const CONTENT_PREFIX: &[u8] = b"\x83\xa4kind\xa7content\xa7payload";

/// A content blob read straight from its canonical bytes: the most read
/// kind (every reply and instruction), and a text and a list of hashes
/// need no general decoder. `None` for anything else, which the general
/// decoder then reads (and reports, if it is malformed).
fn content_canonical(bytes: &[u8]) -> Option<ContentNode> {
    let rest = bytes.strip_prefix(CONTENT_PREFIX)?;
    let (len, rest) = match rest.split_first()? {
        (&h @ 0xa0..=0xbf, rest) => (usize::from(h & 0x1f), rest),
        (0xd9, rest) => (usize::from(*rest.first()?), rest.get(1..)?),
        (0xda, rest) => (
            usize::from(u16::from_be_bytes(*rest.first_chunk()?)),
            rest.get(2..)?,
        ),
        (0xdb, rest) => (
            usize::try_from(u32::from_be_bytes(*rest.first_chunk()?)).ok()?,
            rest.get(4..)?,
        ),
        _ => return None,
    };
    let (text, rest) = rest.split_at_checked(len)?;
    let rest = rest.strip_prefix(b"\xa4refs")?;
    let (n, items) = match rest.split_first()? {
        (&h @ 0x90..=0x9f, rest) => (usize::from(h & 0x0f), rest),
        (0xdc, rest) => (
            usize::from(u16::from_be_bytes(*rest.first_chunk()?)),
            rest.get(2..)?,
        ),
        (0xdd, rest) => (
            usize::try_from(u32::from_be_bytes(*rest.first_chunk()?)).ok()?,
            rest.get(4..)?,
        ),
        _ => return None,
    };
    if items.len() != n.checked_mul(34)? {
        return None;
    }
    let artifacts = items
        .chunks_exact(34)
        .map(|item| item.strip_prefix(&[0xc4, 0x20]).and_then(Hash::from_slice))
        .collect::<Option<Vec<Hash>>>()?;
    let text = std::str::from_utf8(text).ok()?.to_owned();
    Some(ContentNode { text, artifacts })
}

/// The canonical bytes every state blob starts with, up to its `ancestors`
/// array header: `{"kind": "state", "payload": {"ancestors": [...`.
const STATE_PREFIX: &[u8] = b"\x83\xa4kind\xa5state\xa7payload\x8a\xa9ancestors";

/// A state blob's `ancestors`, read from its canonical bytes without decoding
/// the rest (the list is the first field of the payload). `None` if `bytes`
/// are not a state blob in the canonical layout.
///
/// ```
/// use std::collections::BTreeMap;
/// use uwf_db::{Blob, Hash, StateNode, node::state_ancestors};
/// let s = StateNode {
///     ancestors: vec![Hash::of(b"p")], child_thread: None, compact: None,
///     content: Hash::of(b"c"), input: Hash::of(b"i"), meta: BTreeMap::new(),
///     role: "dev".into(), seq: 2, start: Hash::of(b"s"), timestamp: 0,
/// };
/// let enc = Blob::State(s.clone()).encode().unwrap();
/// assert_eq!(state_ancestors(enc.bytes()), Some(s.ancestors));
/// ```
pub fn state_ancestors(bytes: &[u8]) -> Option<Vec<Hash>> {
    let raw = state_ancestors_raw(bytes)?;
    raw.chunks_exact(34)
        .map(|item| item.get(2..).and_then(Hash::from_slice))
        .collect()
}

/// The encoded `ancestors` array items of a state blob (34 bytes each: a
/// `bin 8` header and the 32 hash bytes), borrowed from its canonical bytes.
/// `None` if `bytes` are not a state blob in the canonical layout.
pub fn state_ancestors_raw(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(STATE_PREFIX)?;
    let (&header, rest) = rest.split_first()?;
    // A fixarray (at most 15 entries; ancestors hold at most 11).
    if header & 0xf0 != 0x90 {
        return None;
    }
    let items = rest.get(..usize::from(header & 0x0f) * 34)?;
    items
        .chunks_exact(34)
        .all(|item| item.starts_with(&[0xc4, 0x20]))
        .then_some(items)
}

fn decode_wire(bytes: &[u8]) -> Result<DecodedBlob, CodecError> {
    rmp_serde::from_slice::<DecodedBlob>(bytes).map_err(|e| CodecError::Decode(e.to_string()))
}

fn list(hashes: &[Hash]) -> String {
    let items: Vec<String> = hashes.iter().map(|h| h.short(12)).collect();
    format!("[{}]", items.join(", "))
}

/// The encoding of a blob: `{kind, payload, refs}`.
struct WireBlob<'a> {
    blob: &'a Blob,
    refs: &'a [Hash],
}

impl Serialize for WireBlob<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("kind", self.blob.kind().as_str())?;
        match self.blob {
            Blob::Start(p) => map.serialize_entry("payload", p)?,
            Blob::State(p) => map.serialize_entry("payload", p)?,
            Blob::Content(p) => map.serialize_entry("payload", &p.text)?,
            Blob::Workflow(p) => map.serialize_entry("payload", p)?,
        }
        map.serialize_entry("refs", self.refs)?;
        map.end()
    }
}

/// A decoded blob together with the refs its bytes carried.
struct DecodedBlob {
    blob: Blob,
    refs: Vec<Hash>,
}

impl<'de> Deserialize<'de> for DecodedBlob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(BlobVisitor)
    }
}

struct BlobVisitor;

/// A key expected to be `self.0`, read from the bytes without allocating:
/// `None` when it is, the text found when not (kept for the message). Every
/// decode reads three keys and a kind's name ([`KindName`]); reading them
/// as `String`s cost four allocations a blob.
struct Is(&'static str);

impl<'de> de::DeserializeSeed<'de> for Is {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Is {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the key '{}'", self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok((v != self.0).then(|| v.to_owned()))
    }
}

/// A blob's kind, read from its name without allocating.
struct KindName;

impl<'de> de::DeserializeSeed<'de> for KindName {
    type Value = Kind;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Kind, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KindName {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a blob kind's name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        Kind::from_name(v).ok_or_else(|| E::custom(format!("unknown blob kind '{v}'")))
    }
}

impl BlobVisitor {
    fn expect_key<'de, A: MapAccess<'de>>(map: &mut A, want: &'static str) -> Result<(), A::Error> {
        match map.next_key_seed(Is(want))? {
            Some(None) => Ok(()),
            Some(Some(k)) => Err(de::Error::custom(format!(
                "expected key '{want}', found '{k}' (a blob is {{kind, payload, refs}} in that order)"
            ))),
            None => Err(de::Error::missing_field(want)),
        }
    }
}

impl<'de> Visitor<'de> for BlobVisitor {
    type Value = DecodedBlob;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a blob map {kind, payload, refs}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DecodedBlob, A::Error> {
        Self::expect_key(&mut map, "kind")?;
        let kind = map.next_value_seed(KindName)?;
        Self::expect_key(&mut map, "payload")?;
        let partial = match kind {
            Kind::Start => Blob::Start(map.next_value()?),
            Kind::State => Blob::State(map.next_value()?),
            Kind::Content => Blob::content(map.next_value::<String>()?, []),
            Kind::Workflow => Blob::Workflow(map.next_value()?),
        };
        Self::expect_key(&mut map, "refs")?;
        let refs: Vec<Hash> = map.next_value()?;
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("unexpected key after 'refs'"));
        }
        let blob = match partial {
            Blob::Content(c) => Blob::Content(ContentNode {
                text: c.text,
                artifacts: refs.clone(),
            }),
            other => other,
        };
        Ok(DecodedBlob { blob, refs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_read_straight_is_what_the_decoder_reads() {
        let texts = [
            String::new(),
            "a".repeat(31),
            "a".repeat(32),
            "é".repeat(127),
            "a".repeat(256),
            "z".repeat(65_535),
            "z".repeat(65_536),
            "line\nwith \"quotes\" and \u{0} and 🦀".to_owned(),
        ];
        for text in &texts {
            for n in [0u8, 1, 15, 16] {
                let refs: Vec<Hash> = (0..n).map(|i| Hash::of(&[i])).collect();
                let blob = Blob::content(text.as_str(), refs.iter().copied());
                let enc = blob.encode().unwrap();
                let straight = content_canonical(enc.bytes()).expect("canonical content");
                assert_eq!(Blob::Content(straight), blob);
                assert_eq!(decode_wire(enc.bytes()).unwrap().blob, blob);
                // A byte cut off anywhere, or one more: not read straight.
                let bytes = enc.bytes();
                for cut in [1, 2, 35, bytes.len() / 2] {
                    if let Some(short) = bytes.len().checked_sub(cut) {
                        assert!(content_canonical(&bytes[..short]).is_none());
                    }
                }
                let mut longer = bytes.to_vec();
                longer.push(0);
                assert!(content_canonical(&longer).is_none());
            }
        }
        // Not UTF-8: left to the decoder, which refuses it.
        let mut bad = Blob::content("ab", []).encode().unwrap().bytes().to_vec();
        let at = CONTENT_PREFIX.len() + 1;
        bad[at] = 0xff;
        assert!(content_canonical(&bad).is_none());
        assert!(Blob::decode_trusted(&bad).is_err());
        // Other kinds are left to the decoder.
        let wf = Blob::Workflow(WorkflowNode {
            definition: Value::Str("x".into()),
        });
        assert!(content_canonical(wf.encode().unwrap().bytes()).is_none());
    }

    fn h(n: u8) -> Hash {
        Hash::from_bytes([n; 32])
    }

    #[test]
    fn state_refs_follow_the_spec_order_and_drop_duplicates() {
        let s = StateNode {
            ancestors: vec![h(4), h(5)],
            child_thread: Some(h(7)),
            compact: Some(h(6)),
            content: h(2),
            input: h(2),
            meta: BTreeMap::new(),
            role: "dev".into(),
            seq: 3,
            start: h(1),
            timestamp: 0,
        };
        assert_eq!(
            Blob::State(s).collect_refs(),
            vec![h(1), h(2), h(4), h(5), h(6), h(7)]
        );
    }

    #[test]
    fn content_refs_with_duplicates_do_not_decode() {
        // Build bytes by hand with a repeated artifact.
        let bytes = codec::to_canonical(&WireBlob {
            blob: &Blob::content("x", []),
            refs: &[h(1), h(1)],
        })
        .unwrap();
        let err = Blob::decode(&bytes).unwrap_err();
        assert!(err.to_string().contains("refs"), "{err}");
    }

    #[test]
    fn typed_refs_that_differ_from_the_payload_do_not_decode() {
        let start = Blob::Start(StartNode {
            depth: 0,
            max_rounds: 5,
            name: "w".into(),
            parent_state: None,
            prompt: h(1),
            workflow: h(2),
        });
        let bytes = codec::to_canonical(&WireBlob {
            blob: &start,
            refs: &[h(2), h(1)],
        })
        .unwrap();
        let err = Blob::decode(&bytes).unwrap_err();
        assert!(err.to_string().contains("do not match"), "{err}");
    }

    #[test]
    fn unknown_kind_and_unknown_fields_are_named() {
        let bytes = codec::to_canonical(&BTreeMap::from([
            ("kind", Value::Str("tree".into())),
            ("payload", Value::Null),
            ("refs", Value::Array(vec![])),
        ]))
        .unwrap();
        let err = Blob::decode(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("unknown blob kind 'tree'"),
            "{err}"
        );
    }

    #[test]
    fn values_convert_to_and_from_json() {
        let json = serde_json::json!({"a": [1, -2, 1.5, null, true, "s"], "b": {"c": 18446744073709551615u64}});
        assert_eq!(Value::from_json(&json).to_json(), json);
        assert_eq!(Value::int(3), Value::UInt(3));
        assert_eq!(Value::int(-3), Value::Int(-3));
    }
}
