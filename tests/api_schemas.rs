//! The JSON contract (SPEC §12): the schema of every answer type, generated
//! from the code, must equal the one committed under `docs/schemas/v2/`.
//! After a deliberate change, `UWF_BLESS_SCHEMAS=1 cargo test --test
//! api_schemas` rewrites the files; review the diff like code.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schemas")
        .join(format!("v{}", uwf_db::api::API_VERSION))
}

fn text(schema: &schemars::Schema) -> String {
    let mut t = serde_json::to_string_pretty(schema.as_value()).unwrap();
    t.push('\n');
    t
}

#[test]
fn committed_schemas_match_the_code() {
    let dir = dir();
    let bless = std::env::var_os("UWF_BLESS_SCHEMAS").is_some();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut stale = Vec::new();
    let mut names = BTreeSet::new();
    for answer in uwf_db::api::schemas() {
        assert!(names.insert(answer.name), "{} is listed twice", answer.name);
        let path = dir.join(format!("{}.json", answer.name));
        let want = text(&answer.schema);
        if bless {
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{} differs from the code", path.display())),
            Err(e) => stale.push(format!("{}: {e}", path.display())),
        }
    }
    // No schema of a type that is gone.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let name = file.strip_suffix(".json").unwrap_or(&file).to_owned();
        if !names.contains(name.as_str()) {
            if bless {
                std::fs::remove_file(dir.join(&file)).unwrap();
            } else {
                stale.push(format!("{file} names no type of uwf_db::api::schemas()"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the committed JSON Schemas are not the code's (after a deliberate change run \
         `UWF_BLESS_SCHEMAS=1 cargo test --test api_schemas`):\n{}",
        stale.join("\n")
    );
}

#[test]
fn every_schema_is_a_valid_draft_2020_12_schema() {
    for answer in uwf_db::api::schemas() {
        let value = answer.schema.as_value();
        assert!(
            jsonschema::meta::is_valid(value),
            "{}: not a valid JSON Schema",
            answer.name
        );
        assert_eq!(
            value["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{}",
            answer.name
        );
        jsonschema::validator_for(value).unwrap_or_else(|e| panic!("{}: {e}", answer.name));
    }
}

/// A schema accepts what the type serializes to, and refuses a value with
/// a field of the wrong type (so the schema is not `true`).
#[test]
fn a_schema_accepts_its_type_and_refuses_a_wrong_field() {
    let schemas = uwf_db::api::schemas();
    let schema = |name: &str| {
        let s = schemas.iter().find(|s| s.name == name).unwrap();
        jsonschema::validator_for(s.schema.as_value()).unwrap()
    };
    let removed = uwf_db::api::ThreadRemoved {
        head: uwf_db::Hash::of(b"x"),
        removed: true,
        thread: "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap(),
    };
    let mut value = serde_json::to_value(&removed).unwrap();
    let v = schema("ThreadRemoved");
    assert!(v.is_valid(&value), "{value}");
    value["head"] = "not a hash".into();
    assert!(!v.is_valid(&value), "a bad hash passed");
    value["head"] = serde_json::to_value(removed.head).unwrap();
    value.as_object_mut().unwrap().remove("thread");
    assert!(!v.is_valid(&value), "a missing field passed");
}
