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

/// The visible commands `uwf-db --help` lists, with their subcommands from
/// each group's own `--help`: `["init", "cas", "cas put", …]`.
fn visible_commands() -> Vec<String> {
    fn listed(args: &[&str]) -> Vec<String> {
        let o = std::process::Command::new(BIN)
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8(o.stdout).unwrap();
        let Some(start) = help.find("Commands:\n") else {
            return Vec::new();
        };
        help[start + "Commands:\n".len()..]
            .lines()
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(str::to_owned)
            .collect()
    }
    let mut all = Vec::new();
    for top in listed(&[]) {
        let subs = listed(&[top.as_str()]);
        all.push(top.clone());
        all.extend(subs.into_iter().map(|s| format!("{top} {s}")));
    }
    all
}

#[test]
fn completion_scripts_name_every_command_and_bash_reads_them() {
    let cli = Cli::new(TestBackend::Lmdb);
    let commands = visible_commands();
    assert!(commands.len() > 30, "{commands:?}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = cli.uwf(&["completions", shell]);
        assert_eq!(code(&o), Some(0), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for c in &commands {
            let last = c.rsplit(' ').next().unwrap();
            assert!(script.contains(last), "{shell}: no '{last}' in the script");
        }
        assert!(
            !script.contains("salvage-read"),
            "{shell}: a hidden command"
        );
    }
    // bash parses the script, and completing `uwf-db thread l` offers
    // `list`, `label`, `log`.
    let script = cli.file("uwf-db.bash", &stdout(&cli.uwf(&["completions", "bash"])));
    let check = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; bash -n '{script}'; source '{script}'; \
             COMP_WORDS=(uwf-db thread l); COMP_CWORD=2; COMP_LINE='uwf-db thread l'; \
             COMP_POINT=${{#COMP_LINE}}; _uwf__db uwf-db l thread; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        ))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let offered = String::from_utf8(check.stdout).unwrap();
    for word in ["list", "label", "log"] {
        assert!(offered.lines().any(|l| l == word), "{offered}");
    }
    // Two words deep: `uwf-db thread list --st` offers `--status` and `--store`.
    let check = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; source '{script}'; \
             COMP_WORDS=(uwf-db thread list --st); COMP_CWORD=3; \
             _uwf__db uwf-db --st list; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        ))
        .output()
        .unwrap();
    let offered = String::from_utf8(check.stdout).unwrap();
    let mut offered: Vec<&str> = offered.lines().collect();
    offered.sort();
    assert_eq!(offered, ["--status", "--store"]);
    let o = cli.uwf(&["completions", "tcsh"]);
    assert_eq!(code(&o), Some(2));
    assert!(
        stderr(&o).contains("invalid value 'tcsh'"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn manual_pages_cover_every_visible_command() {
    let cli = Cli::new(TestBackend::Lmdb);
    let dir = cli.path("man/man1");
    let o = cli.uwf(&["man", "--out", dir.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let mut written: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    let mut expected: Vec<String> = std::iter::once("uwf-db.1".to_owned())
        .chain(
            visible_commands()
                .iter()
                .map(|c| format!("uwf-db-{}.1", c.replace(' ', "-"))),
        )
        .map(|f| dir.join(f).display().to_string())
        .collect();
    written.sort();
    expected.sort();
    assert_eq!(written, expected);
    let page = std::fs::read_to_string(dir.join("uwf-db-thread-list.1")).unwrap();
    assert!(page.starts_with(".ie \\n(.g .ds Aq"), "{}", &page[..80]);
    assert!(page.contains(".TH uwf-db-thread-list 1"), "{page}");
    assert!(page.contains("\\-\\-status"), "{page}");
    assert!(!dir.join("uwf-db-salvage-read.1").exists());
    // Without --out: the top page on stdout, naming the commands.
    let top = stdout(&cli.uwf(&["man"]));
    assert!(
        top.contains(".TH uwf-db 1") && top.contains("uwf\\-db\\-thread(1)"),
        "{top}"
    );
}

/// `docs/cli.md` is what `uwf-db man --markdown` prints (regenerate with
/// `UWF_BLESS_DOCS=1 cargo test --test cli_docs`), and it has a section
/// for every visible command.
#[test]
fn the_cli_reference_is_generated_and_current() {
    let o = std::process::Command::new(BIN)
        .args(["man", "--markdown"])
        .env_remove("UWF_STORE")
        .env_remove("UWF_MAX_MAP_SIZE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let generated = String::from_utf8(o.stdout).unwrap();
    let path = root().join("docs/cli.md");
    if std::env::var_os("UWF_BLESS_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/cli.md is not what `uwf-db man --markdown` prints: regenerate it with \
         UWF_BLESS_DOCS=1 cargo test --test cli_docs"
    );
    for cmd in visible_commands() {
        let heading = format!("\n## uwf-db {cmd}\n");
        assert!(generated.contains(&heading), "no section {heading:?}");
    }
    assert!(
        !generated.contains("salvage-read"),
        "hidden commands stay out"
    );
}

/// The ```sh block under `heading` in `doc`.
fn sh_block<'a>(doc: &'a str, heading: &str) -> &'a str {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let start = doc[at..].find("```sh\n").expect("a ```sh block") + at + "```sh\n".len();
    let len = doc[start..].find("```").expect("closed");
    &doc[start..start + len]
}

/// The README's five-minute tour, run as a newcomer would: every line in
/// order in one shell (`bash -e`: the first failing command fails the
/// test), from the repository root, with `uwf-db` on the PATH and a fresh
/// HOME (so the default store, `~/.uwf`, is new).
#[test]
fn the_readme_tour_runs_on_a_fresh_home() {
    let tour = sh_block(README, "\n## A five-minute tour\n");
    assert!(
        tour.lines().filter(|l| l.starts_with("uwf-db ")).count() >= 10,
        "{tour}"
    );
    let home = tempfile::tempdir().unwrap();
    let bin_dir = home.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(BIN, bin_dir.join("uwf-db")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = std::process::Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", tour])
        .env("HOME", home.path())
        .env("PATH", path)
        .env_remove("UWF_STORE")
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .current_dir(root())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "the tour failed: {}\n--- stdout\n{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        home.path().join(".uwf/data.mdb").exists(),
        "the default store, ~/.uwf"
    );
    assert!(out.contains("flowchart"), "the Mermaid drawing: {out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("verified ") && last.ends_with(": ok"),
        "{last}"
    );
}

/// Every complete workflow in `docs/workflows.md` and `docs/cookbook.md`
/// (a ```yaml block with a top-level `name:`) is accepted by `workflow
/// add`, in the page's order, in a fresh store; and each page has such
/// examples.
#[test]
fn the_workflow_examples_in_the_docs_register() {
    for (page, least) in [("docs/workflows.md", 5), ("docs/cookbook.md", 3)] {
        examples_register(page, least);
    }
}

fn examples_register(page: &str, least: usize) {
    let doc = std::fs::read_to_string(root().join(page)).unwrap();
    let env = Cli::new(TestBackend::Lmdb);
    let mut added = 0;
    for block in doc.split("```yaml\n").skip(1) {
        let block = &block[..block.find("```").expect("closed")];
        let Some(name) = block
            .lines()
            .find_map(|l| l.strip_prefix("name: "))
            .map(str::trim)
        else {
            continue;
        };
        let file = env.file(&format!("{name}.yaml"), block);
        let o = env.uwf(&["workflow", "add", &file]);
        assert!(
            o.status.success(),
            "{page}: {name}: {}\n{block}",
            stderr(&o)
        );
        added += 1;
    }
    assert!(added >= least, "{page}: only {added} complete examples");
}
