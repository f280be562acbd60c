//! The extractor never panics on an arbitrary agent reply (untrusted text),
//! for a role with a schema and for one without; and the frontmatter fast
//! path agrees with the YAML parser on every input it takes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uwf_db::engine::extract::{extract, flat_frontmatter};
use uwf_db::workflow::Role;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let schema = serde_json::json!({"oneOf": [
        {"properties": {"$status": {"const": "ok"}, "refs": {"type": "array", "items": {"format": "uwf-hash"}}}, "required": ["$status"]},
        {"properties": {"$status": {"const": "no"}, "reason": {"type": "string"}}, "required": ["$status", "reason"]}
    ]});
    let with_schema = Role { frontmatter: Some(schema), ..Role::default() };
    let _ = extract(&with_schema, text);
    let _ = extract(&Role::default(), text);
    if let Some(fast) = flat_frontmatter(text) {
        let parsed: serde_json::Value =
            uwf_db::yaml::from_str(text).expect("the parser takes what the fast path takes");
        assert_eq!(parsed, serde_json::Value::Object(fast), "{text:?}");
    }
});
