//! Committed test vectors pin the canonical encoding: value → bytes → hash.
//! If this test fails, the on-disk format changed: bump FORMAT_VERSION and
//! regenerate with `cargo test --test vectors -- --ignored --nocapture`.

mod common;

use std::collections::BTreeMap;

use uwf_db::{Blob, CodecError, Hash};

const VECTORS: &str = include_str!("vectors/blobs.json");

#[derive(serde::Deserialize, serde::Serialize)]
struct Vector {
    bytes: String,
    hash: String,
}

#[test]
fn every_kind_encodes_to_the_committed_bytes_and_hash() {
    let expected: BTreeMap<String, Vector> = serde_json::from_str(VECTORS).unwrap();
    let blobs = common::vector_blobs();
    assert_eq!(expected.len(), blobs.len(), "one vector per fixture");
    for (name, blob) in blobs {
        let v = &expected[name];
        let enc = blob.encode().unwrap();
        assert_eq!(common::hex(enc.bytes()), v.bytes, "{name}: bytes");
        assert_eq!(enc.hash().to_string(), v.hash, "{name}: hash");
        // The hash is BLAKE3 of exactly these bytes, and they decode back.
        assert_eq!(
            blake3::hash(enc.bytes()).to_hex().as_str(),
            v.hash,
            "{name}"
        );
        assert_eq!(Blob::decode(enc.bytes()).unwrap(), blob, "{name}: decode");
    }
}

#[test]
fn a_content_vector_is_readable_by_hand() {
    // {"kind":"content","payload":"","refs":[]}
    let enc = Blob::content("", []).encode().unwrap();
    let mut want = vec![0x83, 0xa4];
    want.extend(b"kind");
    want.push(0xa7);
    want.extend(b"content");
    want.push(0xa7);
    want.extend(b"payload");
    want.push(0xa0);
    want.push(0xa4);
    want.extend(b"refs");
    want.push(0x90);
    assert_eq!(enc.bytes(), want.as_slice());
}

#[test]
fn hashes_are_32_byte_binary() {
    let enc = Blob::content("x", [Hash::from_bytes([7; 32])])
        .encode()
        .unwrap();
    let bytes = enc.bytes();
    // refs: fixarray(1), bin8, length 32, then the raw bytes.
    let tail = &bytes[bytes.len() - 35..];
    assert_eq!(&tail[..3], &[0x91, 0xc4, 32]);
    assert_eq!(&tail[3..], &[7; 32]);
}

/// Replaces the first occurrence of `from` in `bytes` by `to`.
fn splice(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    [&bytes[..at], to, &bytes[at + from.len()..]].concat()
}

#[test]
fn non_canonical_encodings_are_rejected_on_decode() {
    let blobs = common::vector_blobs();
    let state = &blobs.iter().find(|(n, _)| *n == "state_first").unwrap().1;
    let bytes = state.encode().unwrap().bytes().to_vec();

    // seq 1 as a positive fixint (0x01) re-encoded as uint8 0xcc 0x01.
    let seq_key = [&[0xa3][..], b"seq"].concat();
    let non_minimal = splice(
        &bytes,
        &[&seq_key[..], &[0x01]].concat(),
        &[&seq_key[..], &[0xcc, 0x01]].concat(),
    );
    assert!(matches!(
        Blob::decode(&non_minimal),
        Err(CodecError::NotCanonical { .. })
    ));

    // The top-level keys in the wrong order: refs before kind.
    let content = Blob::content("hi", []).encode().unwrap();
    let b = content.bytes();
    // 0x83, "kind" entry, "payload" entry, "refs" entry.
    let kind_entry = [&[0xa4][..], b"kind", &[0xa7], b"content"].concat();
    let refs_entry = [&[0xa4][..], b"refs", &[0x90]].concat();
    let rest = &b[1 + kind_entry.len()..b.len() - refs_entry.len()];
    let unsorted = [&[0x83][..], &refs_entry, &kind_entry, rest].concat();
    let err = Blob::decode(&unsorted).unwrap_err();
    assert!(
        matches!(err, CodecError::NotCanonical { reason, .. } if reason.contains("sorted")),
        "{err}"
    );

    // A str 8 header for a 2-byte string.
    let long_header = splice(b, &[0xa2, b'h', b'i'], &[0xd9, 0x02, b'h', b'i']);
    assert!(Blob::decode(&long_header).is_err());

    // Trailing garbage.
    let trailing = [b, &[0x00]].concat();
    assert!(matches!(
        Blob::decode(&trailing),
        Err(CodecError::TrailingBytes { count: 1 })
    ));
}

#[test]
fn nan_in_meta_is_rejected() {
    let blobs = common::vector_blobs();
    let state = &blobs.iter().find(|(n, _)| *n == "state_full").unwrap().1;
    let bytes = state.encode().unwrap().bytes().to_vec();
    let nan = splice(
        &bytes,
        &[&[0xcb][..], &0.75f64.to_be_bytes()].concat(),
        &[&[0xcb][..], &f64::NAN.to_be_bytes()].concat(),
    );
    assert!(matches!(Blob::decode(&nan), Err(CodecError::NaN { .. })));
}

#[test]
#[ignore = "regenerates tests/vectors/blobs.json; run only on a deliberate format change"]
fn print_vectors() {
    let out: BTreeMap<&str, Vector> = common::vector_blobs()
        .into_iter()
        .map(|(name, blob)| {
            let enc = blob.encode().unwrap();
            (
                name,
                Vector {
                    bytes: common::hex(enc.bytes()),
                    hash: enc.hash().to_string(),
                },
            )
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
