//! `workflow add|list|show|validate`, and resolving a WORKFLOW argument.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use uwf_db::api;
use uwf_db::workflow::{Workflow, WorkflowError, draw, parse_workflow_file};
use uwf_db::{Hash, Store};

use crate::output::Output;
use crate::{Cli, CliError};

#[derive(Subcommand)]
pub enum WorkflowCommand {
    /// Validate and register a workflow YAML file under its name
    Add {
        /// The YAML file (its stem must equal its `name`)
        file: PathBuf,
    },
    /// Registered workflows
    List,
    /// A registered workflow (by name or hash)
    Show {
        /// Name, or hash (prefix) of a stored workflow
        workflow: String,
        /// `text`: its fields and edges; `mermaid`: a flowchart (GitHub and most Markdown
        /// viewers draw it); `dot`: Graphviz (`| dot -Tsvg > graph.svg`)
        #[arg(long, value_enum, default_value_t = ShowFormat::Text)]
        format: ShowFormat,
    },
    /// Check a workflow YAML file and report every problem with its location
    Validate {
        /// The YAML file
        file: PathBuf,
    },
}

/// How `workflow show` prints a workflow.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShowFormat {
    Text,
    Mermaid,
    Dot,
}

/// Reads and validates a workflow file (a folder: its `index.yaml`);
/// child workflows must be registered.
pub fn load_file(store: Option<&Store>, file: &Path) -> Result<Workflow, CliError> {
    let index;
    let file = if file.is_dir() {
        index = folder_index(file)?;
        index.as_path()
    } else {
        file
    };
    let text = uwf_db::input::read_text_capped(file, uwf_db::input::MAX_WORKFLOW, "workflow file")
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let registered =
        |name: &str| store.is_some_and(|s| matches!(s.workflows().by_name(name), Ok(Some(_))));
    parse_workflow_file(&text, file, &registered).map_err(|problems| {
        WorkflowError::Invalid {
            source_name: file.display().to_string(),
            problems,
        }
        .into()
    })
}

/// A workflow folder's file: `DIR/index.yaml` (or `index.yml`).
fn folder_index(dir: &Path) -> Result<PathBuf, CliError> {
    ["index.yaml", "index.yml"]
        .iter()
        .map(|f| dir.join(f))
        .find(|f| f.is_file())
        .ok_or_else(|| {
            CliError::Failed(format!(
                "cannot read {} as a workflow: it is a folder without an index.yaml (a workflow folder holds its workflow in index.yaml)",
                dir.display()
            ))
        })
}

/// A WORKFLOW argument: a YAML file or a folder with an `index.yaml`
/// (registered first), or a registered name.
pub fn resolve(store: &Store, arg: &str) -> Result<(Hash, Arc<Workflow>), CliError> {
    let path = Path::new(arg);
    if arg.ends_with(".yaml")
        || arg.ends_with(".yml")
        || path.is_file()
        || (path.is_dir() && folder_index(path).is_ok())
    {
        let wf = load_file(Some(store), path)?;
        let (hash, _) = store.workflows().add(&wf)?;
        return Ok((hash, Arc::new(wf)));
    }
    store
        .workflows()
        .by_name(arg)?
        .ok_or_else(|| WorkflowError::Unknown(arg.to_owned()).into())
}

pub fn run(cli: &Cli, cmd: &WorkflowCommand, out: &mut Output) -> Result<(), CliError> {
    match cmd {
        WorkflowCommand::Add { file } => {
            let store = cli.open(true)?;
            let wf = load_file(Some(&store), file)?;
            let (hash, changed) = store.workflows().add(&wf)?;
            if out.json {
                out.json_value(&api::WorkflowAdded {
                    changed,
                    hash,
                    name: wf.name.clone(),
                })?;
            } else if changed {
                out.line(format_args!("registered {} as {}", wf.name, hash))?;
            } else {
                out.line(format_args!(
                    "{} is already registered as {} (unchanged)",
                    wf.name, hash
                ))?;
            }
            Ok(())
        }
        WorkflowCommand::List => {
            let store = cli.open(false)?;
            let list = store.workflows().list()?;
            if out.json {
                let rows: Vec<_> = list
                    .iter()
                    .map(|(n, h)| api::WorkflowEntry {
                        hash: *h,
                        name: n.clone(),
                    })
                    .collect();
                return Ok(out.json_value(&rows)?);
            }
            if list.is_empty() {
                return Ok(out.line("no workflows registered")?);
            }
            let rows: Vec<[String; 2]> = list
                .iter()
                .map(|(n, h)| [n.clone(), h.to_string()])
                .collect();
            Ok(out.columns(&["NAME", "HASH"], &rows)?)
        }
        WorkflowCommand::Show { workflow, format } => {
            let store = cli.open(false)?;
            let (hash, wf) = match store.workflows().by_name(workflow)? {
                Some(found) => found,
                None => {
                    let prefix = workflow
                        .parse()
                        .map_err(|_| WorkflowError::Unknown(workflow.clone()))?;
                    let hash = store.resolve(&prefix)?;
                    (hash, store.workflows().load(hash)?)
                }
            };
            if out.json && *format != ShowFormat::Text {
                return Err(CliError::Failed(
                    "--json prints the workflow as JSON and --format draws it: give one of them"
                        .into(),
                ));
            }
            match format {
                ShowFormat::Mermaid => return Ok(out.raw(draw::mermaid(&wf).as_bytes())?),
                ShowFormat::Dot => return Ok(out.raw(draw::dot(&wf).as_bytes())?),
                ShowFormat::Text => {}
            }
            if out.json {
                return Ok(out.json_value(&api::WorkflowDetail {
                    workflow: (*wf).clone(),
                    hash,
                })?);
            }
            out.table(&[
                ("name", wf.name.clone()),
                ("hash", hash.to_string()),
                ("description", wf.description.clone().unwrap_or_default()),
                ("maxRounds", wf.max_rounds.to_string()),
                (
                    "roles",
                    wf.roles.keys().cloned().collect::<Vec<_>>().join(", "),
                ),
            ])?;
            for (from, edges) in &wf.graph {
                for (status, edge) in edges {
                    out.line(format_args!(
                        "  {from} --{status}--> {}: {:?}",
                        edge.role, edge.prompt
                    ))?;
                }
            }
            Ok(())
        }
        WorkflowCommand::Validate { file } => {
            // Child workflows are checked against the store when one exists.
            let store = cli.open(false).ok();
            match load_file(store.as_ref(), file) {
                Ok(wf) => {
                    if out.json {
                        out.json_value(&api::WorkflowValidation {
                            name: Some(wf.name.clone()),
                            problems: Vec::new(),
                            valid: true,
                        })?;
                    } else {
                        out.line(format_args!(
                            "{}: valid workflow '{}'",
                            file.display(),
                            wf.name
                        ))?;
                    }
                    Ok(())
                }
                Err(CliError::Workflow(WorkflowError::Invalid { problems, .. })) => {
                    if out.json {
                        out.json_value(&api::WorkflowValidation {
                            name: None,
                            problems: problems.clone(),
                            valid: false,
                        })?;
                    } else {
                        for p in &problems {
                            let sep = if p.line.is_some() { ":" } else { ": " };
                            out.line(format_args!("{}{sep}{p}", file.display()))?;
                        }
                        let n = problems.len();
                        out.line(format_args!("{n} problem{}", if n == 1 { "" } else { "s" }))?;
                    }
                    Err(CliError::Reported)
                }
                Err(e) => Err(e),
            }
        }
    }
}
