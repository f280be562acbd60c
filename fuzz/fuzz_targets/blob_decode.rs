//! The blob decoder never panics on arbitrary bytes, and whatever it accepts
//! is canonical: it re-encodes to exactly the input, with the same hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uwf_db::{Blob, Hash};

fuzz_target!(|data: &[u8]| {
    // The canonical-form checker alone must not panic either.
    let _ = uwf_db::codec::check_canonical(data);
    // Neither must the trusted path (used for blobs read back from the store).
    let _ = Blob::decode_trusted(data);
    if let Ok(blob) = Blob::decode(data) {
        let enc = blob.encode().expect("a decoded blob re-encodes");
        assert_eq!(enc.bytes(), data, "accepted bytes are canonical");
        assert_eq!(enc.hash(), Hash::of(data));
        assert_eq!(enc.refs(), blob.collect_refs().as_slice());
    }
});
