//! `uwf-db completions` and `uwf-db man`: shell completions and manual
//! pages generated from the same clap definitions that parse the flags, so
//! they can never disagree with the binary.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::output::Output;
use crate::{Cli, CliError};

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell, out: &mut Output) -> Result<(), CliError> {
    // The generators offer hidden commands too (`salvage-read`, the
    // salvage reader's internal one): build the command without them.
    let full = Cli::command();
    let mut cmd = clap::Command::new("uwf-db")
        .version(env!("CARGO_PKG_VERSION"))
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "uwf-db", &mut script);
    if shell == clap_complete::Shell::Bash {
        // clap_complete's bash script spells a hyphenated program's states
        // two ways (its loop `uwf__db__subcmd__thread`, its case arms
        // `uwf__subcmd__db__subcmd__thread`), so nothing past the first
        // word completed (clap-rs/clap#6421, open): spell the arms as the
        // loop does. The completion test drives the script in bash.
        let text = String::from_utf8_lossy(&script).replace("uwf__subcmd__db", "uwf__db");
        script = text.into_bytes();
    }
    out.raw(&script)?;
    Ok(())
}

/// Writes the manual pages: with `dir`, one page per visible command
/// (`uwf-db.1`, `uwf-db-thread.1`, `uwf-db-thread-list.1`, …) into it,
/// created if absent, naming each file written; without, `uwf-db(1)` on
/// stdout.
pub fn man(dir: Option<&Path>, out: &mut Output) -> Result<(), CliError> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        out.raw(&page)?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        CliError::Failed(format!(
            "cannot create the directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut written = Vec::new();
    write_pages(cmd, dir, &mut written).map_err(|e| {
        CliError::Failed(format!(
            "cannot write manual pages into {}: {e}",
            dir.display()
        ))
    })?;
    if out.json {
        let paths: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        out.json_value(&serde_json::json!({ "written": paths }))?;
    } else {
        for p in &written {
            out.line(p.display())?;
        }
    }
    Ok(())
}

/// `cmd`'s page, then its visible subcommands' pages, depth first.
fn write_pages(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let subcommands: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    written.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
    for sub in subcommands {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
