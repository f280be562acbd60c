//! The CLI's documentation stays true: every `--help` text against its
//! snapshot (`tests/cmd/help.md`, run by trycmd), and the README's console
//! example run for real.
//!
//! The README's example shows real ids, hashes and times, which differ on
//! every run, so both the README block and a real run are checked against
//! one checked-in transcript, `tests/snapshots/readme-console.txt`, where
//! `[ID]` stands for the thread's id, `[..]` for any text on a line and
//! `...` for any number of lines.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const README: &str = include_str!("../README.md");
const TRANSCRIPT: &str = include_str!("snapshots/readme-console.txt");

#[test]
fn help_texts_match_their_snapshots() {
    let cases = trycmd::TestCases::new();
    cases.register_bin("uwf-db", std::path::Path::new(BIN));
    // clap prints the values of these variables in the help; pin them.
    cases.env("UWF_STORE", "").env("UWF_MAX_MAP_SIZE", "");
    cases.case("tests/cmd/help.md");
}

/// The README's first ```console block.
fn readme_console_block() -> &'static str {
    let start = README
        .find("```console\n")
        .expect("the README has a console example")
        + "```console\n".len();
    let len = README[start..]
        .find("```")
        .expect("the console block is closed");
    &README[start..start + len]
}

/// `[ID]` stands for `id`; everything else is compared as snapbox does.
fn assert_matches_transcript(actual: &str, id: &str) {
    let mut redactions = snapbox::Redactions::new();
    redactions.insert("[ID]", id.to_owned()).unwrap();
    snapbox::Assert::new()
        .redact_with(redactions)
        .eq(actual, TRANSCRIPT);
}

/// The id the README's `run` printed.
fn started_thread(output: &str) -> &str {
    output
        .lines()
        .find_map(|l| l.strip_prefix("started thread "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a 'started thread ID' line")
}

#[test]
fn the_readme_console_example_matches_the_transcript() {
    let block = readme_console_block();
    assert_matches_transcript(block, started_thread(block));
}

/// Runs each `$ uwf-db …` line of the README's block on a fresh store, with
/// the README's thread id (or a prefix of it) replaced by the real one, and
/// checks the whole session against the transcript.
fn the_readme_console_example_runs_as_shown(b: TestBackend) {
    let cli = Cli::new(b);
    let block = readme_console_block();
    let readme_id = started_thread(block);
    let mut real_id: Option<String> = None;
    let mut session = String::new();
    let commands: Vec<&str> = block.lines().filter_map(|l| l.strip_prefix("$ ")).collect();
    assert_eq!(commands.len(), 3, "run, thread log, verify");
    for line in commands {
        let mut words = shell_words::split(line).unwrap();
        assert_eq!(words.remove(0), "uwf-db", "{line}");
        // Substitute the README's id or a prefix of it (at least 6
        // characters, as the CLI needs).
        let mut shown = line.to_owned();
        for w in &mut words {
            if w.len() >= 6 && readme_id.starts_with(w.as_str()) {
                let id = real_id.as_deref().expect("an id before it is used");
                shown = shown.replace(w.as_str(), &id[..w.len()]);
                *w = id[..w.len()].to_owned();
            }
        }
        let o = cli.uwf(&words.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code(&o), Some(0), "{line}: {}", stderr(&o));
        let out = stdout(&o);
        if real_id.is_none() {
            real_id = Some(started_thread(&out).to_owned());
        }
        session.push_str(&format!("$ {shown}\n{out}"));
    }
    assert_matches_transcript(&session, real_id.as_deref().unwrap());
}

process_conformance!(the_readme_console_example_runs_as_shown);
