//! `claude:[ARGS]`: Claude Code answers in print mode. The process is
//! run by `cmd:`'s machinery ([`CmdAgent::run`]); this file builds the
//! command line and reads the JSON result (see [`ClaudeAgent`]).

use std::process::ExitStatus;

use serde::Deserialize;
use serde_json::Value as Json;

use super::command::{CmdAgent, Finished};
use super::{Agent, AgentError, AgentOptions, AgentReply, AgentRequest, NoResultReport};
use crate::usage::Usage;

/// The environment variable naming the program a `claude:` agent runs
/// (unset or empty: `claude`, found on `PATH`). Read when the agent is
/// built, so a thread's stored spec (`claude:…`) runs whichever program
/// the environment names at the time, as `cmd:` programs go by `PATH`.
pub const CLAUDE_PROGRAM_VAR: &str = "UWF_CLAUDE";

/// The program run when [`CLAUDE_PROGRAM_VAR`] is unset.
pub const CLAUDE_PROGRAM: &str = "claude";

/// The arguments every call starts with: print mode, one JSON result.
const PRINT_JSON: [&str; 3] = ["-p", "--output-format", "json"];

/// Flags a spec may not give: they would change what stdin or stdout
/// carry, which this agent depends on.
const FIXED_FLAGS: [&str; 2] = ["--output-format", "--input-format"];

/// How much of stdout an error without a result quotes.
const STDOUT_EXCERPT: usize = 200;

/// The longest agent message kept in an error (the rest is counted).
const MESSAGE_BYTES: usize = 4096;

/// A parsed `claude:` spec: the words after the colon, split like shell
/// words, given to the program after `-p --output-format json` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaudeSpec {
    /// Extra arguments (`--model sonnet`, `--allowedTools "Read,Edit"`, …).
    pub args: Vec<String>,
}

impl ClaudeSpec {
    /// Parses what follows `claude:`; refuses `--output-format` and
    /// `--input-format` (the agent sets the first and feeds the prompt as
    /// text), answering why.
    ///
    /// ```
    /// use uwf_db::engine::agent::ClaudeSpec;
    ///
    /// let spec = ClaudeSpec::parse("--model sonnet --allowedTools 'Read,Edit'")?;
    /// assert_eq!(spec.args, ["--model", "sonnet", "--allowedTools", "Read,Edit"]);
    /// assert_eq!(ClaudeSpec::parse("")?, ClaudeSpec::default());
    /// assert!(ClaudeSpec::parse("--output-format text").is_err());
    /// # Ok::<(), String>(())
    /// ```
    pub fn parse(words: &str) -> Result<ClaudeSpec, String> {
        let args = shell_words::split(words).map_err(|e| e.to_string())?;
        for word in &args {
            let flag = word.split_once('=').map_or(word.as_str(), |(f, _)| f);
            if FIXED_FLAGS.contains(&flag) {
                return Err(format!(
                    "a claude: agent runs with -p --output-format json and the prompt on stdin; {flag} cannot be given"
                ));
            }
        }
        Ok(ClaudeSpec { args })
    }

    /// What a role adds to the command line: `--model M` for its `model:`
    /// and `--allowedTools T1,T2` for its `allowedTools:`, each only when
    /// the spec does not set that flag itself (the operator's spec wins
    /// over the workflow's role).
    ///
    /// ```
    /// use uwf_db::engine::agent::ClaudeSpec;
    /// use uwf_db::workflow::Role;
    ///
    /// let role = Role {
    ///     model: Some("opus".into()),
    ///     allowed_tools: vec!["Read".into(), "Bash(cargo test:*)".into()],
    ///     ..Role::default()
    /// };
    /// let none = ClaudeSpec::default();
    /// assert_eq!(
    ///     none.role_args(&role),
    ///     ["--model", "opus", "--allowedTools", "Read,Bash(cargo test:*)"]
    /// );
    /// let pinned = ClaudeSpec::parse("--model=haiku")?;
    /// assert_eq!(pinned.role_args(&role), ["--allowedTools", "Read,Bash(cargo test:*)"]);
    /// # Ok::<(), String>(())
    /// ```
    pub fn role_args(&self, role: &crate::workflow::Role) -> Vec<String> {
        let sets = |flags: &[&str]| {
            self.args.iter().any(|a| {
                let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
                flags.contains(&flag)
            })
        };
        let mut out = Vec::new();
        if let Some(model) = &role.model
            && !sets(&["--model"])
        {
            out.extend(["--model".to_owned(), model.clone()]);
        }
        if !role.allowed_tools.is_empty() && !sets(&["--allowedTools", "--allowed-tools"]) {
            out.extend(["--allowedTools".to_owned(), role.allowed_tools.join(",")]);
        }
        out
    }

    /// The command line of a call: `program -p --output-format json ARGS`
    /// (then what the role adds, [`ClaudeSpec::role_args`]).
    ///
    /// ```
    /// use uwf_db::engine::agent::ClaudeSpec;
    ///
    /// let spec = ClaudeSpec::parse("--model haiku")?;
    /// assert_eq!(
    ///     spec.argv("claude"),
    ///     ["claude", "-p", "--output-format", "json", "--model", "haiku"]
    /// );
    /// # Ok::<(), String>(())
    /// ```
    pub fn argv(&self, program: &str) -> Vec<String> {
        std::iter::once(program)
            .chain(PRINT_JSON)
            .map(str::to_owned)
            .chain(self.args.iter().cloned())
            .collect()
    }
}

/// `claude:[ARGS]`: Claude Code (or a compatible agent CLI) in print mode.
///
/// Each call runs `claude -p --output-format json ARGS` (ARGS: the spec's
/// words after the colon, as written) with the prompt on stdin, exactly as
/// a `cmd:` program runs: in the step's directory, in a process group of
/// its own (killed whole at the timeout, on cancel, or when the reply cap
/// is passed), with `UWF_THREAD`, `UWF_ROLE` and `UWF_STORE` set. Claude
/// Code prints one JSON result object; from it:
///
/// - `result` is the reply (markdown with the role's frontmatter);
/// - `usage` and `total_cost_usd` are the call's [`Usage`]: input tokens
///   are `input_tokens` + `cache_creation_input_tokens` +
///   `cache_read_input_tokens` (every prompt token the model read; the
///   cache discount is in the cost), output tokens `output_tokens`, the
///   model the `modelUsage` key that cost the most (a run may use a small
///   model on the side). `duration_ms` is not kept: the engine measures
///   every call's wall time itself. A malformed usage field is ignored,
///   never a reason to fail the step;
/// - `is_error: true`, or a `subtype` starting with `error`, fails the
///   call with [`AgentError::Reported`] and the agent's message.
///
/// Stdout that holds no result object (a crash, a login prompt) fails the
/// call with [`AgentError::NoResult`], quoting the start of stdout and the
/// tail of stderr. The program is `claude` from `PATH`, or the one
/// [`CLAUDE_PROGRAM_VAR`] (`UWF_CLAUDE`) names: a stand-in for tests, a
/// wrapper, or another agent CLI with the same flags and JSON.
#[derive(Debug, Clone)]
pub struct ClaudeAgent {
    program: String,
    spec: ClaudeSpec,
    command: CmdAgent,
}

impl ClaudeAgent {
    /// The agent for `spec`, running the program [`CLAUDE_PROGRAM_VAR`] names,
    /// else [`CLAUDE_PROGRAM`]. Nothing is started yet: a missing program
    /// fails the first call ([`AgentError::Spawn`]).
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentOptions, ClaudeAgent, ClaudeSpec};
    ///
    /// let options = AgentOptions { reasks: 1, ..AgentOptions::default() };
    /// let agent = ClaudeAgent::new(&ClaudeSpec::default(), &options)?;
    /// assert_eq!(agent.reasks(), 1);
    /// # Ok::<(), uwf_db::engine::agent::AgentError>(())
    /// ```
    pub fn new(spec: &ClaudeSpec, options: &AgentOptions) -> Result<Self, AgentError> {
        let program = std::env::var_os(CLAUDE_PROGRAM_VAR)
            .filter(|p| !p.is_empty())
            .map_or_else(
                || CLAUDE_PROGRAM.to_owned(),
                |p| p.to_string_lossy().into_owned(),
            );
        Self::with_program(program, spec, options)
    }

    /// The agent for `spec` running `program` instead of `claude` (a
    /// relative path with a directory in it is taken from the driver's
    /// working directory, as for `cmd:`).
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentOptions, ClaudeAgent, ClaudeSpec};
    ///
    /// let spec = ClaudeSpec::parse("--model opus")?;
    /// let agent = ClaudeAgent::with_program("/opt/bin/my-agent-cli", &spec, &AgentOptions::default())?;
    /// assert_eq!(agent.program(), "/opt/bin/my-agent-cli");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_program(
        program: impl Into<String>,
        spec: &ClaudeSpec,
        options: &AgentOptions,
    ) -> Result<Self, AgentError> {
        let program = program.into();
        let command = CmdAgent::new(spec.argv(&program), options)?;
        Ok(ClaudeAgent {
            program,
            spec: spec.clone(),
            command,
        })
    }

    /// The program a call runs.
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentOptions, ClaudeAgent, ClaudeSpec};
    ///
    /// let agent = ClaudeAgent::with_program("claude", &ClaudeSpec::default(), &AgentOptions::default())?;
    /// assert_eq!(agent.program(), "claude");
    /// # Ok::<(), uwf_db::engine::agent::AgentError>(())
    /// ```
    pub fn program(&self) -> &str {
        &self.program
    }
}

impl Agent for ClaudeAgent {
    fn reasks(&self) -> usize {
        self.command.reasks()
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }

    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        // The role's model and tools, where the spec leaves them open.
        let extra = self.spec.role_args(req.role);
        let Finished {
            status,
            stdout,
            stderr,
        } = if extra.is_empty() {
            self.command.run(req)?
        } else {
            self.command.with_args(&extra).run(req)?
        };
        reply_of(&self.program, status, &stdout, stderr)
    }
}

/// The fields of Claude Code's result object this agent reads. Usage
/// fields stay JSON values, read leniently ([`usage_of`]): a malformed one
/// must not cost the reply.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ResultObject {
    #[serde(rename = "type")]
    kind: Option<String>,
    subtype: Option<String>,
    is_error: Option<bool>,
    result: Option<String>,
    total_cost_usd: Json,
    usage: Json,
    #[serde(rename = "modelUsage")]
    model_usage: Json,
    model: Json,
}

/// The reply (or the error) a finished run gives.
fn reply_of(
    agent: &str,
    status: ExitStatus,
    stdout: &[u8],
    stderr: String,
) -> Result<AgentReply, AgentError> {
    let object = match result_object(stdout) {
        Ok(object) => object,
        Err(problem) => {
            let problem = if status.success() {
                problem
            } else {
                format!("it exited with {status}; {problem}")
            };
            return Err(no_result(agent, problem, stdout, stderr));
        }
    };
    let subtype = object.subtype.as_deref().unwrap_or_default();
    if object.is_error == Some(true) || subtype.starts_with("error") {
        return Err(AgentError::Reported {
            agent: agent.to_owned(),
            message: error_message(&object),
            usage: usage_of(&object).map(Box::new),
        });
    }
    if !status.success() {
        // A result that says success from a run that failed: trust the
        // exit status.
        return Err(AgentError::Exit {
            status: status.to_string(),
            stderr,
        });
    }
    // A success without `result` is refused rather than read as an empty
    // reply: an empty answer and a changed format must not look alike.
    let Some(output) = object.result.clone() else {
        let problem = "its result object has no 'result' text".to_owned();
        return Err(no_result(agent, problem, stdout, stderr));
    };
    Ok(AgentReply {
        output,
        child_thread: None,
        usage: usage_of(&object),
        stderr: Some(stderr).filter(|s| !s.is_empty()),
    })
}

/// [`AgentError::NoResult`] for `agent`'s run, quoting the start of its
/// stdout.
fn no_result(agent: &str, problem: String, stdout: &[u8], stderr: String) -> AgentError {
    AgentError::NoResult(Box::new(NoResultReport {
        agent: agent.to_owned(),
        problem,
        stdout: excerpt(stdout),
        stderr,
    }))
}

/// The result object stdout holds: one JSON object (the documented
/// format), or, with `--verbose`, an array of messages whose last `result`
/// is taken. Stdout that is not JSON as a whole is tried on its last
/// non-empty line (something may have printed before the result).
fn result_object(stdout: &[u8]) -> Result<ResultObject, String> {
    let text = stdout.trim_ascii();
    if text.is_empty() {
        return Err("stdout was empty".to_owned());
    }
    let value = match serde_json::from_slice::<Json>(text) {
        Ok(value) => value,
        Err(whole) => text
            .split(|b| *b == b'\n')
            .map(<[u8]>::trim_ascii)
            .rfind(|line| !line.is_empty())
            .and_then(|line| serde_json::from_slice::<Json>(line).ok())
            .ok_or_else(|| format!("stdout is not JSON: {whole}"))?,
    };
    let value = match value {
        Json::Array(messages) => messages
            .into_iter()
            .rfind(|m| m.get("type").and_then(Json::as_str) == Some("result"))
            .ok_or("stdout is a JSON array without a result message")?,
        Json::Object(_) => value,
        _ => return Err("stdout is JSON but not an object".to_owned()),
    };
    let object: ResultObject =
        serde_json::from_value(value).map_err(|e| format!("stdout is not a result object: {e}"))?;
    match object.kind.as_deref() {
        Some("result") => Ok(object),
        Some(other) => Err(format!(
            "stdout is JSON of type '{other}', not a result object"
        )),
        None if object.result.is_some() || object.subtype.is_some() => Ok(object),
        None => Err("stdout is JSON without a result".to_owned()),
    }
}

/// What a failed result says: its `result` text (after the subtype when
/// that says more than `success`), else the subtype, cut to
/// [`MESSAGE_BYTES`].
fn error_message(object: &ResultObject) -> String {
    let text = object.result.as_deref().map(str::trim).unwrap_or_default();
    let subtype = object.subtype.as_deref().unwrap_or_default();
    let message = match (text.is_empty(), subtype) {
        (true, "") => "is_error with no message".to_owned(),
        (true, subtype) => subtype.to_owned(),
        (false, "" | "success") => text.to_owned(),
        (false, subtype) => format!("{subtype}: {text}"),
    };
    if message.len() <= MESSAGE_BYTES {
        return message;
    }
    let kept = cut(&message, MESSAGE_BYTES);
    format!(
        "{kept}[… {} more bytes]",
        message.len().saturating_sub(kept.len())
    )
}

/// The call's usage, or `None` when the result reports none (then a
/// `$usage` in the reply's frontmatter counts instead).
fn usage_of(object: &ResultObject) -> Option<Usage> {
    let tokens = |key: &str| object.usage.get(key).and_then(Json::as_u64);
    let input = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .into_iter()
    .filter_map(tokens)
    .reduce(u64::saturating_add);
    let model = model_of(&object.model_usage).or_else(|| object.model.as_str().map(str::to_owned));
    // Through `Usage::from_json`: the same checks as a `$usage` report
    // (a cost must be finite and non-negative, a model name is cut).
    let usage = Usage::from_json(&serde_json::json!({
        "input_tokens": input,
        "output_tokens": tokens("output_tokens"),
        "cost_usd": object.total_cost_usd,
        "model": model,
    }))?;
    (usage != Usage::default()).then_some(usage)
}

/// The model of a `modelUsage` map (model name → its figures) that cost
/// the most, then wrote the most; of equals the last name (a dated id
/// sorts after its alias).
fn model_of(model_usage: &Json) -> Option<String> {
    let figure = |m: &Json, key: &str| m.get(key).and_then(Json::as_f64).unwrap_or(0.0);
    model_usage
        .as_object()?
        .iter()
        .max_by(|(_, a), (_, b)| {
            figure(a, "costUSD")
                .total_cmp(&figure(b, "costUSD"))
                .then(figure(a, "outputTokens").total_cmp(&figure(b, "outputTokens")))
        })
        .map(|(name, _)| name.clone())
}

/// The first [`STDOUT_EXCERPT`] bytes of stdout, as text, `…` when cut.
fn excerpt(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    let kept = cut(text, STDOUT_EXCERPT);
    if kept.len() < text.len() {
        format!("{kept}…")
    } else {
        kept.to_owned()
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    const SUCCESS: &str = r#"{"type":"result","subtype":"success","is_error":false,
        "result":"---\n$status: done\n---\nDone.","duration_ms":1234,"duration_api_ms":1000,
        "num_turns":3,"session_id":"s-1","total_cost_usd":0.0123,
        "usage":{"input_tokens":10,"output_tokens":20,"cache_creation_input_tokens":2,"cache_read_input_tokens":5},
        "modelUsage":{"claude-haiku-4-5":{"outputTokens":3,"costUSD":0.001},
                      "claude-sonnet-4-5":{"outputTokens":17,"costUSD":0.0113}}}"#;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn reply(code: i32, stdout: &str, stderr: &str) -> Result<AgentReply, AgentError> {
        reply_of("claude", exited(code), stdout.as_bytes(), stderr.to_owned())
    }

    #[test]
    fn a_success_result_gives_the_reply_and_its_usage() {
        let r = reply(0, SUCCESS, "a warning").unwrap();
        assert_eq!(r.output, "---\n$status: done\n---\nDone.");
        assert_eq!(r.child_thread, None);
        let u = r.usage.unwrap();
        assert_eq!(
            u.input_tokens,
            Some(10 + 2 + 5),
            "cache tokens count as input"
        );
        assert_eq!(u.output_tokens, Some(20));
        assert_eq!(u.cost_usd, Some(0.0123));
        assert_eq!(
            u.model.as_deref(),
            Some("claude-sonnet-4-5"),
            "the costlier"
        );
    }

    #[test]
    fn usage_is_read_leniently_and_absent_usage_is_none() {
        let r = reply(
            0,
            r#"{"type":"result","subtype":"success","result":"hi",
                "total_cost_usd":-1,"usage":{"input_tokens":"ten","output_tokens":null,
                "cache_read_input_tokens":4},"modelUsage":[]}"#,
            "",
        )
        .unwrap();
        assert_eq!(r.output, "hi");
        let u = r.usage.unwrap();
        assert_eq!(u.input_tokens, Some(4), "the well-formed part only");
        assert_eq!((u.output_tokens, u.cost_usd, u.model), (None, None, None));
        let r = reply(0, r#"{"type":"result","result":"hi","usage":7}"#, "").unwrap();
        assert_eq!(
            r.usage, None,
            "nothing reported: a frontmatter $usage may count"
        );
        // Without modelUsage a top-level model string is taken.
        let r = reply(0, r#"{"type":"result","result":"x","model":"m-2"}"#, "").unwrap();
        assert_eq!(r.usage.unwrap().model.as_deref(), Some("m-2"));
    }

    #[test]
    fn of_equal_models_the_dated_id_is_named() {
        let m = serde_json::json!({"claude-haiku-4-5": {}, "claude-haiku-4-5-20251001": {}});
        assert_eq!(model_of(&m).as_deref(), Some("claude-haiku-4-5-20251001"));
        assert_eq!(model_of(&serde_json::json!({})), None);
    }

    #[test]
    fn an_error_result_is_reported_with_the_agents_message() {
        let e = reply(
            1,
            r#"{"type":"result","subtype":"success","is_error":true,"result":"Credit balance is too low"}"#,
            "",
        )
        .unwrap_err();
        assert!(
            matches!(&e, AgentError::Reported { agent, message, usage: None }
                if agent == "claude" && message == "Credit balance is too low"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "claude reported an error: Credit balance is too low"
        );
        // An error subtype with no text names the subtype, even on exit 0.
        let e = reply(
            0,
            r#"{"type":"result","subtype":"error_max_turns","num_turns":9}"#,
            "",
        )
        .unwrap_err();
        assert!(e.to_string().ends_with("error_max_turns"), "{e}");
        let e = reply(
            1,
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"result":"tool failed"}"#,
            "",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .ends_with("error_during_execution: tool failed"),
            "{e}"
        );
        // A long message is cut and counted.
        let long = format!(
            r#"{{"type":"result","is_error":true,"result":"{}"}}"#,
            "é".repeat(3000)
        );
        let e = reply(1, &long, "").unwrap_err();
        assert!(e.to_string().ends_with("[… 1904 more bytes]"), "{e}");
    }

    #[test]
    fn stdout_without_a_result_is_named_with_its_start_and_stderr() {
        let garbage = format!("Segmentation fault {}", "x".repeat(300));
        let e = reply(1, &garbage, "internal error: boom").unwrap_err();
        let AgentError::NoResult(report) = &e else {
            panic!("{e:?}")
        };
        let NoResultReport {
            agent,
            problem,
            stdout,
            stderr,
        } = &**report;
        assert_eq!(agent, "claude");
        assert!(
            problem.starts_with("it exited with exit status: 1; stdout is not JSON"),
            "{problem}"
        );
        assert_eq!(stdout.len(), STDOUT_EXCERPT + "…".len());
        assert!(stdout.starts_with("Segmentation fault xx"), "{stdout}");
        assert_eq!(stderr, "internal error: boom");
        let text = e.to_string();
        assert!(
            text.starts_with("claude printed no JSON result ("),
            "{text}"
        );
        assert!(text.contains("internal error: boom"), "{text}");

        for (stdout, says) in [
            ("", "stdout was empty"),
            ("[1, 2]", "array without a result"),
            ("42", "not an object"),
            (
                r#"{"type":"assistant","message":{}}"#,
                "of type 'assistant'",
            ),
            (r#"{"session_id":"s"}"#, "without a result"),
            (r#"{"type":"result","result":7}"#, "not a result object"),
            (
                r#"{"type":"result","subtype":"success"}"#,
                "no 'result' text",
            ),
        ] {
            let e = reply(0, stdout, "").unwrap_err();
            assert!(
                matches!(&e, AgentError::NoResult(r) if r.problem.contains(says)),
                "{stdout}: {e}"
            );
        }
    }

    #[test]
    fn a_verbose_array_or_a_line_before_the_json_still_gives_the_result() {
        let verbose = r#"[{"type":"system","subtype":"init"},
            {"type":"assistant","message":{}},
            {"type":"result","subtype":"success","result":"the answer"}]"#;
        assert_eq!(reply(0, verbose, "").unwrap().output, "the answer");
        let noisy = "Update available\n{\"type\":\"result\",\"result\":\"ok\"}\n";
        assert_eq!(reply(0, noisy, "").unwrap().output, "ok");
    }

    #[test]
    fn a_success_result_from_a_failed_exit_is_a_failure() {
        let e = reply(2, SUCCESS, "killed by a hook").unwrap_err();
        assert!(
            matches!(&e, AgentError::Exit { status, stderr }
                if status.contains('2') && stderr == "killed by a hook"),
            "{e:?}"
        );
    }

    #[test]
    fn the_excerpt_cuts_on_a_character_boundary() {
        let text = "é".repeat(150);
        let e = excerpt(text.as_bytes());
        assert!(e.ends_with('…'));
        assert_eq!(e.len(), STDOUT_EXCERPT + "…".len());
        assert_eq!(excerpt(b"  short\n"), "short");
    }

    #[test]
    fn specs_keep_their_words_and_refuse_a_changed_format() {
        let spec =
            ClaudeSpec::parse("--model sonnet --allowedTools \"Read,Edit\" --verbose").unwrap();
        assert_eq!(
            spec.argv("claude"),
            [
                "claude",
                "-p",
                "--output-format",
                "json",
                "--model",
                "sonnet",
                "--allowedTools",
                "Read,Edit",
                "--verbose"
            ]
        );
        for bad in [
            "--output-format text",
            "--output-format=stream-json",
            "--input-format stream-json",
        ] {
            let e = ClaudeSpec::parse(bad).unwrap_err();
            assert!(e.contains("cannot be given"), "{bad}: {e}");
        }
        assert!(ClaudeSpec::parse("--model 'unclosed").is_err());
    }

    /// The whole call through the stand-in executable the CLI tests use:
    /// the process machinery is `cmd:`'s, the reply comes from the JSON.
    #[test]
    fn a_call_runs_the_program_and_reads_its_result() {
        use crate::engine::Cancel;
        use crate::thread::ThreadId;
        use crate::workflow::Role;

        let fake = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake-claude");
        let options = AgentOptions {
            reasks: 3,
            ..AgentOptions::default()
        };
        let mut agent = ClaudeAgent::with_program(fake, &ClaudeSpec::default(), &options).unwrap();
        assert_eq!(agent.reasks(), 3);
        let dir = tempfile::tempdir().unwrap();
        let (role, cancel) = (Role::default(), Cancel::new());
        let request = AgentRequest {
            thread: ThreadId::generate(),
            workflow: "w",
            role_name: "reviewer",
            role: &role,
            instruction: "i",
            prompt: "Review the change",
            answered_steps: 0,
            cwd: Some(dir.path()),
            summary_index: None,
            cancel: &cancel,
        };
        let r = agent.call(&request).unwrap();
        assert!(
            r.output.starts_with("---\n$status: approved\n---\n"),
            "{}",
            r.output
        );
        let u = r.usage.unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (Some(15), Some(20)));
    }
}
