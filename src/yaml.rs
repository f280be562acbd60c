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

/// [`from_str`] with other options (see [`options_for_file`]).
pub fn from_str_with<'de, T: Deserialize<'de>>(
    yaml: &'de str,
    options: serde_saphyr::Options,
) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(yaml, options)
}

/// [`options`] for a workflow read from `file`, where `!include PATH`
/// takes the YAML of another file (SPEC §13): `PATH` is relative to the
/// including file's folder and must stay inside `file`'s folder (no
/// absolute path, no `..` out of it, no symlink, no hidden file, a
/// regular `.yaml`/`.yml` file), an include cycle is refused, and the
/// files read together are at most [`crate::input::MAX_WORKFLOW`] bytes.
/// serde-saphyr's `SafeFileResolver` makes these checks.
pub fn options_for_file(file: &std::path::Path) -> std::io::Result<serde_saphyr::Options> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let resolver = serde_saphyr::SafeFileResolver::new(&dir)?.with_root_file(file)?;
    let mut options = options().with_include_resolver(resolver.into_callback());
    let mut budget = options.budget.clone().unwrap_or_default();
    budget.max_reader_input_bytes = usize::try_from(crate::input::MAX_WORKFLOW).ok();
    options.budget = Some(budget);
    Ok(options)
}
