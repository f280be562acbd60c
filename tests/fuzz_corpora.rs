//! Replays every committed fuzz corpus file (`fuzz/seeds/<target>/` and,
//! when present, `fuzz/corpus/<target>/`) through the same checks the
//! cargo-fuzz targets run (`fuzz/checks/mod.rs`), so `cargo test` and CI
//! fail on a regression of any crash a fuzzer ever found.

#[path = "../fuzz/checks/mod.rs"]
mod checks;

use std::path::Path;

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_passes_its_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (target, check) in checks::TARGETS {
        let seeds = files(&root.join("seeds").join(target));
        assert!(
            !seeds.is_empty(),
            "fuzz/seeds/{target} is empty or missing: every target has a committed seed corpus"
        );
        let corpus = files(&root.join("corpus").join(target));
        for file in seeds.iter().chain(&corpus) {
            let data = std::fs::read(file).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{target}: {} fails its check",
                file.display()
            );
        }
        println!(
            "{target}: {} seeds, {} corpus files",
            seeds.len(),
            corpus.len()
        );
    }
}
