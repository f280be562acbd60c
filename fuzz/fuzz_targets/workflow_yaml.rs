//! Fuzz target `workflow_yaml`: see `checks::workflow_yaml` (fuzz/checks/mod.rs), which
//! `tests/fuzz_corpora.rs` also runs over the committed corpus.
#![no_main]

#[path = "../checks/mod.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::workflow_yaml(data));
