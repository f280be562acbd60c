//! How this crate reads YAML: workflow files, `script:` scenario files and
//! agent frontmatter all go through [`from_str`], so they agree on what a
//! plain word means.
//!
//! The schema is the YAML 1.2 core schema: only `true` and `false` (also
//! `True`, `TRUE`, `False`, `FALSE`) are booleans. The YAML 1.1 words `y`,
//! `n`, `yes`, `no`, `on` and `off`, in any case, are strings, so a status
//! `const: no` or `required: [$status, n]` means what it says. serde-saphyr
//! reads YAML 1.1 booleans unless `strict_booleans` is set; everything else
//! is its default (including its limits for untrusted input, which agent
//! replies are).

use serde::Deserialize;

/// The serde-saphyr options every YAML document of this crate is read with.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
    }
}

/// Reads one YAML document with [`options`].
///
/// ```
/// let v: serde_json::Value = uwf_db::yaml::from_str("a: no\nb: On\nc: true\n").unwrap();
/// assert_eq!(v, serde_json::json!({"a": "no", "b": "On", "c": true}));
/// ```
pub fn from_str<'de, T: Deserialize<'de>>(yaml: &'de str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(yaml, options())
}
