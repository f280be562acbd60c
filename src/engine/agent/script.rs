//! `script:FILE`: answers from a scenario file, for tests and examples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Agent, AgentError, AgentReply, AgentRequest};

#[derive(Debug, Clone, Deserialize)]
struct ScriptStep {
    role: String,
    output: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepList {
    steps: Vec<ScriptStep>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default)]
    steps: Option<Vec<ScriptStep>>,
    #[serde(default)]
    workflows: Option<BTreeMap<String, StepList>>,
    #[serde(default)]
    compact: Vec<String>,
}

/// `script:FILE`: step *i* answers when the thread already has *i*
/// agent-answered role steps.
#[derive(Debug, Clone)]
pub struct ScriptAgent {
    path: PathBuf,
    scenario: Scenario,
}

impl ScriptAgent {
    /// Loads a scenario file: `steps:` (step *i* is the role and the reply
    /// for a thread with *i* answered steps), or `workflows:` (steps per
    /// workflow name, for child workflows).
    ///
    /// ```
    /// use uwf_db::Store;
    /// use uwf_db::engine::StartOptions;
    /// use uwf_db::engine::agent::ScriptAgent;
    /// use uwf_db::thread::ThreadStatus;
    /// use uwf_db::workflow::parse_workflow;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let file = dir.path().join("scenario.yaml");
    /// std::fs::write(&file, "steps:\n  - role: worker\n    output: All done\n")?;
    /// let mut agent = ScriptAgent::load(&file)?;
    ///
    /// # let yaml = "name: one\nroles:\n  worker: { goal: Work }\ngraph:\n  $START: { _: { role: worker, prompt: 'Work' } }\n  worker: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let store = Store::memory();
    /// # let wf = parse_workflow(yaml, Some("one"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let options = StartOptions::default();
    /// let (_, report) = store.engine().run_workflow(workflow, "a task", &options, &mut agent)?;
    /// assert_eq!(report.into_result()?[0].status, ThreadStatus::Completed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<ScriptAgent, AgentError> {
        let bad = |detail: String| AgentError::Scenario {
            path: path.to_path_buf(),
            detail,
        };
        let text = crate::input::read_text_capped(path, crate::input::MAX_SCENARIO, "scenario")
            .map_err(|e| match e {
                crate::input::InputError::Unreadable { source, .. } => {
                    AgentError::ScenarioUnreadable {
                        path: path.to_path_buf(),
                        source,
                    }
                }
                other => bad(other.to_string()),
            })?;
        ScriptAgent::parse(path, &text)
    }

    /// A scenario from its text (`path` names it in errors): what
    /// [`ScriptAgent::load`] does after reading the file.
    ///
    /// ```
    /// use std::path::Path;
    /// use uwf_db::engine::agent::{AgentError, ScriptAgent};
    /// assert!(ScriptAgent::parse(Path::new("s.yaml"), "steps: []").is_ok());
    /// let e = ScriptAgent::parse(Path::new("s.yaml"), "steps: [").unwrap_err();
    /// assert!(matches!(e, AgentError::ScenarioYaml { .. }));
    /// ```
    pub fn parse(path: &Path, text: &str) -> Result<ScriptAgent, AgentError> {
        let scenario: Scenario =
            crate::yaml::from_str(text).map_err(|e| AgentError::ScenarioYaml {
                path: path.to_path_buf(),
                source: Box::new(e),
            })?;
        if scenario.steps.is_none() == scenario.workflows.is_none() {
            return Err(AgentError::Scenario {
                path: path.to_path_buf(),
                detail: "give exactly one of `steps:` or `workflows:`".into(),
            });
        }
        Ok(ScriptAgent {
            path: path.to_path_buf(),
            scenario,
        })
    }
}

impl Agent for ScriptAgent {
    fn needs_step_count(&self) -> bool {
        true
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }

    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        if let Some(i) = req.summary_index {
            return self
                .scenario
                .compact
                .get(i)
                .cloned()
                .map(AgentReply::from)
                .ok_or_else(|| AgentError::Scenario {
                    path: self.path.clone(),
                    detail: format!(
                        "no compact answer {i} (it has {})",
                        self.scenario.compact.len()
                    ),
                });
        }
        let steps = match (&self.scenario.steps, &self.scenario.workflows) {
            (Some(s), _) => s,
            (None, Some(w)) => {
                &w.get(req.workflow)
                    .ok_or_else(|| AgentError::Scenario {
                        path: self.path.clone(),
                        detail: format!("no steps for workflow '{}'", req.workflow),
                    })?
                    .steps
            }
            (None, None) => {
                return Err(AgentError::Scenario {
                    path: self.path.clone(),
                    detail: "give exactly one of `steps:` or `workflows:`".into(),
                });
            }
        };
        let i = req.answered_steps;
        let step = steps.get(i).ok_or_else(|| AgentError::PastEnd {
            index: i,
            len: steps.len(),
            actual: req.role_name.to_owned(),
        })?;
        if step.role != req.role_name {
            return Err(AgentError::RoleMismatch {
                index: i,
                expected: step.role.clone(),
                actual: req.role_name.to_owned(),
            });
        }
        Ok(step.output.clone().into())
    }
}
