//! Answers of the content-addressed store's commands (`cas`).

use schemars::JsonSchema;
use serde::Serialize;

use crate::hash::Hash;
use crate::node::Blob;
use crate::store::StoredBlob;

/// `cas pin | unpin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BlobPin {
    /// Whether this call changed anything.
    pub changed: bool,
    /// The blob.
    pub hash: Hash,
    /// Whether it is pinned now.
    pub pinned: bool,
}

/// `cas put`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BlobPut {
    /// The content blob's hash.
    pub hash: Hash,
    /// Whether it was not stored before.
    pub new: bool,
    /// Its canonical size in bytes.
    pub size: u64,
}

/// `cas get`: a blob, its header and its payload.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct BlobDetail {
    /// The blob.
    pub hash: Hash,
    /// `content`, `start`, `state` or `workflow`.
    pub kind: String,
    /// A content blob's text; a node's fields; a workflow's definition.
    pub payload: serde_json::Value,
    /// The blobs it refers to.
    pub refs: Vec<Hash>,
    /// Its canonical size in bytes.
    pub size: u64,
    /// When it was first written.
    pub written_at: super::Timestamp,
}

impl BlobDetail {
    /// The detail of `stored`, whose decoded form is `blob`.
    pub fn of(stored: &StoredBlob, blob: &Blob) -> Self {
        BlobDetail {
            hash: stored.hash,
            kind: stored.kind.as_str().to_owned(),
            payload: payload(blob),
            refs: stored.refs.clone(),
            size: stored.bytes.len() as u64,
            written_at: super::Timestamp(stored.written_at),
        }
    }
}

/// A blob's payload as JSON: text for content, an object otherwise.
pub fn payload(blob: &Blob) -> serde_json::Value {
    match blob {
        Blob::Content(c) => serde_json::Value::String(c.text.clone()),
        Blob::Start(s) => serde_json::to_value(s).unwrap_or_default(),
        Blob::State(s) => serde_json::to_value(s).unwrap_or_default(),
        Blob::Workflow(w) => w.definition.to_json(),
    }
}

/// `cas has`: whether a hash or prefix names a stored blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BlobPresence {
    /// The blob found.
    pub hash: Option<Hash>,
    /// Whether one was found.
    pub present: bool,
    /// What was asked.
    pub query: String,
}

/// One line of `cas refs`: a blob referred to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BlobRef {
    /// The blob.
    pub hash: Hash,
    /// Its kind, when stored.
    pub kind: Option<String>,
    /// Whether it is stored.
    pub present: bool,
}

/// One line of `cas walk`: a blob reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WalkedBlob {
    /// The blob.
    pub hash: Hash,
    /// Its kind.
    pub kind: String,
    /// The blobs it refers to.
    pub refs: Vec<Hash>,
    /// Its canonical size in bytes.
    pub size: u64,
}

impl From<&StoredBlob> for WalkedBlob {
    fn from(b: &StoredBlob) -> Self {
        WalkedBlob {
            hash: b.hash,
            kind: b.kind.as_str().to_owned(),
            refs: b.refs.clone(),
            size: b.bytes.len() as u64,
        }
    }
}
