//! Property tests: canonical round trips and derived refs for random nodes.

use std::collections::BTreeMap;

use proptest::prelude::*;
use uwf_db::{Blob, ContentNode, Hash, StartNode, StateNode, Value, WorkflowNode};

fn hash() -> impl Strategy<Value = Hash> {
    // A small alphabet of hashes makes duplicate refs likely.
    prop_oneof![
        (0u8..4).prop_map(|n| Hash::from_bytes([n; 32])),
        any::<[u8; 32]>().prop_map(Hash::from_bytes),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::int),
        any::<u64>().prop_map(Value::UInt),
        any::<f64>()
            .prop_filter("NaN has no encoding", |f| !f.is_nan())
            .prop_map(Value::Float),
        ".{0,40}".prop_map(Value::Str),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,12}", inner, 0..6).prop_map(Value::Map),
        ]
    })
}

fn blob() -> impl Strategy<Value = Blob> {
    let start = (
        any::<u32>(),
        any::<u32>(),
        "[a-z-]{1,20}",
        prop::option::of(hash()),
        hash(),
        hash(),
    )
        .prop_map(
            |(depth, max_rounds, name, parent_state, prompt, workflow)| {
                Blob::Start(StartNode {
                    depth,
                    max_rounds,
                    name,
                    parent_state,
                    prompt,
                    workflow,
                })
            },
        );
    let state = (
        prop::collection::vec(hash(), 0..12),
        prop::option::of(hash()),
        prop::option::of(hash()),
        (hash(), hash(), hash()),
        prop::collection::btree_map("\\$?[a-z_]{1,10}", value(), 0..5),
        "[a-z_]{1,12}",
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                ancestors,
                child_thread,
                compact,
                (content, input, start),
                meta,
                role,
                seq,
                timestamp,
            )| {
                Blob::State(StateNode {
                    ancestors,
                    child_thread,
                    compact,
                    content,
                    input,
                    meta: meta.into_iter().collect::<BTreeMap<_, _>>(),
                    role,
                    seq,
                    start,
                    timestamp,
                })
            },
        );
    let content = (".{0,200}", prop::collection::vec(hash(), 0..5))
        .prop_map(|(text, artifacts)| Blob::content(text, artifacts));
    let workflow = value().prop_map(|definition| Blob::Workflow(WorkflowNode { definition }));
    prop_oneof![start, state, content, workflow]
}

/// refs as SPEC §2 spells them out, computed independently of the library.
fn spec_refs(blob: &Blob) -> Vec<Hash> {
    let listed: Vec<Hash> = match blob {
        Blob::Start(s) => [Some(s.prompt), Some(s.workflow), s.parent_state]
            .into_iter()
            .flatten()
            .collect(),
        Blob::State(s) => {
            let mut v = vec![s.start, s.content, s.input];
            v.extend(&s.ancestors);
            v.extend(s.compact);
            v.extend(s.child_thread);
            v
        }
        Blob::Content(ContentNode { artifacts, .. }) => artifacts.clone(),
        Blob::Workflow(_) => vec![],
    };
    let mut out = Vec::new();
    for h in listed {
        if !out.contains(&h) {
            out.push(h);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn encode_decode_round_trip(b in blob()) {
        let enc = b.encode().unwrap();
        prop_assert_eq!(enc.hash(), Hash::of(enc.bytes()));
        let back = Blob::decode(enc.bytes()).unwrap();
        prop_assert_eq!(&back, &b);
        // One value, one encoding: re-encoding gives the same bytes.
        let again = back.encode().unwrap();
        prop_assert_eq!(again.bytes(), enc.bytes());
        uwf_db::codec::check_canonical(enc.bytes()).unwrap();
    }

    #[test]
    fn collect_refs_matches_the_spec_and_the_encoded_refs(b in blob()) {
        let refs = b.collect_refs();
        prop_assert_eq!(&refs, &spec_refs(&b));
        let enc = b.encode().unwrap();
        prop_assert_eq!(enc.refs(), refs.as_slice());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(b) = Blob::decode(&bytes) {
            // Anything accepted is canonical: it re-encodes to the same bytes.
            let again = b.encode().unwrap();
            prop_assert_eq!(again.bytes(), bytes.as_slice());
        }
    }

    #[test]
    fn flipping_a_byte_never_yields_a_different_valid_blob_with_the_same_hash(
        b in blob(), at in any::<prop::sample::Index>(), bit in 0u8..8
    ) {
        let enc = b.encode().unwrap();
        let mut bytes = enc.bytes().to_vec();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert_ne!(Hash::of(&bytes), enc.hash());
        if let Ok(other) = Blob::decode(&bytes) {
            prop_assert_ne!(other, b);
        }
    }
}
