//! Automatic compaction: with `compact: {every: N}`, after every N role
//! steps the agent is asked for a summary of the thread (not a role step),
//! which is staged for the next step (`docs/design.md` §5c).

use super::agent::{Agent, AgentRequest};
use super::cancel::Cancel;
use super::extract::extract;
use super::prompt::{RECENT_STEPS, assemble, output_format};
use super::{Engine, EngineError};
use crate::thread::ThreadRecord;
use crate::workflow::Workflow;

impl Engine {
    /// Automatic compaction: after every `every` role steps, ask the agent
    /// for a summary (not a role step) and stage it. A summary that fails
    /// (a read error included) is recorded as the thread's last error; the
    /// step stands. Returns whether it changed the record; failing to record
    /// the failure is an error.
    pub(super) fn maybe_compact(
        &self,
        wf: &Workflow,
        record: &ThreadRecord,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<bool, EngineError> {
        let Some(c) = &wf.compact else {
            return Ok(false);
        };
        let rounds = record.rounds();
        if record.status.is_done() || rounds == 0 || !rounds.is_multiple_of(u64::from(c.every)) {
            return Ok(false);
        }
        if let Err(e) = self.compact_now(wf, c, record, agent, cancel) {
            tracing::warn!(thread = %record.id, error = %e, "automatic compaction failed");
            self.threads()
                .low_level()
                .record_failure(record.id, &format!("automatic compaction failed: {e}"))?;
        } else {
            tracing::info!(thread = %record.id, rounds, "thread compacted");
        }
        Ok(true)
    }

    /// Asks the agent for a summary of the thread and stages it.
    fn compact_now(
        &self,
        wf: &Workflow,
        c: &crate::workflow::Compact,
        record: &ThreadRecord,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<(), EngineError> {
        let summaries = self.summaries_so_far(record)?;
        let instruction = c.prompt.clone().unwrap_or_else(|| {
            "Summarise everything that has happened in this thread so far, so that the next steps can rely on your summary instead of the full history.".into()
        });
        let context = self.threads().context(record.id, RECENT_STEPS * 4)?;
        let role_def = crate::workflow::Role::default();
        let prompt = assemble(
            "summariser",
            &role_def,
            &output_format(&role_def),
            "",
            &context,
            &|h| self.text(h),
            &instruction,
        )?;
        let request = AgentRequest {
            thread: record.id,
            workflow: &wf.name,
            role_name: "summariser",
            role: &role_def,
            instruction: &instruction,
            prompt: &prompt,
            answered_steps: 0,
            cwd: record.cwd.as_deref().map(std::path::Path::new),
            summary_index: Some(summaries),
            cancel,
        };
        let called = std::time::Instant::now();
        let reply = agent.call(&request)?;
        let wall_ms = u64::try_from(called.elapsed().as_millis()).unwrap_or(u64::MAX);
        // A summary is plain text; frontmatter, if any, is dropped (its
        // `$usage` is counted).
        let (body, reported) = match extract(&role_def, &reply.output) {
            Ok(x) => (x.body, reply.usage.clone().or(x.usage)),
            Err(_) => (reply.output.clone(), reply.usage.clone()),
        };
        let mut usage = crate::usage::StepUsage::default();
        usage.add_call(wall_ms, reported.as_ref());
        self.threads()
            .stage_compact_counted(record.id, record.head, &body, Some(usage))?;
        Ok(())
    }

    fn summaries_so_far(&self, record: &ThreadRecord) -> Result<usize, EngineError> {
        let mut n = usize::from(record.staged_compact.is_some());
        let mut before = None;
        loop {
            let page = self.threads().log(record.id, 1024, before)?;
            n += page.iter().filter(|e| e.node.compact.is_some()).count();
            match page.last() {
                Some(last) if page.len() == 1024 => before = Some(last.hash),
                _ => return Ok(n),
            }
        }
    }
}
