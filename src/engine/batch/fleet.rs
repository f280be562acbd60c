//! Finishing what batches left: the threads `batch --continue` drives, and
//! fleets of runners sharing one workflow's threads (each thread driven by
//! whichever runner claims it first; a dead runner's threads taken over;
//! `docs/design.md` §5d, "Fleets").

use super::*;

impl Engine {
    /// Drives existing threads on, as a batch: each runs until it ends or
    /// suspends (a thread left `running` by a driver that died is taken
    /// over; one a live driver holds is reported as an error). For
    /// finishing what an interrupted batch left; see
    /// [`Engine::continuable_threads`] for which threads.
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::{BatchItem, BatchOptions};
    /// use uwf_db::engine::{DriveOptions, StartOptions};
    ///
    /// # struct Echo;
    /// # impl Agent for Echo {
    /// #     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    /// #         Ok(format!("{} did it", req.role_name).into())
    /// #     }
    /// # }
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// // Three threads that stopped after their writer's step.
    /// let one_step = DriveOptions { max_steps: Some(1), ..DriveOptions::default() };
    /// for prompt in ["first", "second", "third"] {
    ///     let thread = store.engine().start_workflow(workflow, prompt, &StartOptions::default())?;
    ///     store.engine().drive(thread.id, &one_step, &mut Echo).into_result()?;
    /// }
    ///
    /// let threads = store.engine().continuable_threads("review")?;
    /// assert_eq!(threads.len(), 3);
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo)];
    /// let options = BatchOptions::default();
    /// let report = store.engine().continue_threads(&threads, &options, agents, &mut |_: &BatchItem| {})?;
    /// assert_eq!((report.threads, report.completed), (3, 3));
    /// assert_eq!(report.steps, 3); // one reviewer step each
    /// assert!(store.engine().continuable_threads("review")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continue_threads<R: ItemFlow>(
        &self,
        threads: &[ThreadId],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        let mut agents = agents;
        self.continue_ids(threads, options, &mut agents, on_item, false, None)
    }

    /// Drives workflow `name`'s continuable threads
    /// ([`Engine::continuable_threads`]) on, sharing them with any other
    /// runner doing the same on this store, in this process or another,
    /// on this machine or another (`docs/design.md` §5d, "Fleets"): each
    /// thread is driven by whichever runner claims it first; one another
    /// runner took first is skipped (counted in
    /// [`BatchReport::skipped`]), never driven twice. When a pass is done
    /// the runner lists again, so threads a dead runner left are taken
    /// over; a thread whose drive stopped with an error here is not
    /// retried by this run.
    ///
    /// With `wait`, the runner also stays while another live runner holds
    /// a thread of the workflow, polling every `wait`: if that runner dies,
    /// its threads are finished here. Without it, the run ends when a
    /// listing finds nothing this runner can take.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::BatchOptions;
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("{} did it", req.role_name).into())
    ///     }
    /// }
    /// // Two threads started and left for any runner to finish.
    /// for task in ["one", "two"] {
    ///     store.engine().start_workflow(hash, task, &Default::default())?;
    /// }
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo)];
    /// let report = store.engine().continue_workflow("two", &BatchOptions::default(), None, agents, &mut |_| {})?;
    /// assert_eq!((report.threads, report.completed, report.skipped), (2, 2, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continue_workflow<R: ItemFlow>(
        &self,
        name: &str,
        options: &BatchOptions,
        wait: Option<Duration>,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        let mut agents = agents;
        let mut total = BatchReport::default();
        // Threads driven by this run (whatever the outcome).
        let mut driven: HashSet<ThreadId> = HashSet::new();
        let mut stopped = false;
        // Only threads with these labels (`batch --continue --label`).
        let labels: Vec<(String, String)> = options
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        while !stopped && !options.cancel.is_stopping() {
            let mut ids: Vec<ThreadId> = self
                .continuable_threads_labelled(name, &labels)?
                .into_iter()
                .filter(|id| !driven.contains(id))
                .collect();
            if ids.is_empty() {
                match wait {
                    Some(poll) if self.live_drives(name, &labels)? => {
                        options.cancel.sleep(poll);
                        continue;
                    }
                    _ => break,
                }
            }
            // Runners start their passes at different threads, so a fleet
            // does not queue up on the oldest one.
            let len = ids.len();
            ids.rotate_left(spread() % len);
            let mut on_driven = |item: &BatchItem| {
                if let Some(id) = item.thread {
                    driven.insert(id);
                }
                let stop = on_item(item).stop();
                stopped |= stop;
                if stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            let orphans = Orphans::new(name, &labels);
            let pass = self.continue_ids(
                &ids,
                options,
                &mut agents,
                &mut on_driven,
                true,
                Some(&orphans),
            )?;
            total.merge(&pass);
            // Another pass would fail the same way.
            stopped |= pass.store_full;
        }
        total.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(total)
    }

    /// Whether a live runner (another process, or a claim of this store
    /// handle) is driving a thread of workflow `name`.
    fn live_drives(&self, name: &str, labels: &[(String, String)]) -> Result<bool, EngineError> {
        Ok(self
            .running_threads(name, labels)?
            .iter()
            .any(|(_, held)| *held))
    }

    /// The `running` threads of workflow `name`, each with whether a live
    /// driver holds its claim.
    fn running_threads(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<Vec<(ThreadId, bool)>, EngineError> {
        let query = ThreadQuery {
            statuses: vec![ThreadStatus::Running],
            workflow: Some(name.to_owned()),
            labels: labels.to_vec(),
            limit: usize::MAX,
            ..ThreadQuery::default()
        };
        let running: Vec<ThreadId> = self.threads().list(&query)?.iter().map(|r| r.id).collect();
        let held = claim::are_held(&self.store, &running)?;
        Ok(running.into_iter().zip(held).collect())
    }

    /// [`Engine::continue_threads`]; with `skip_taken`, a thread another
    /// runner claimed or finished first is skipped instead of reported.
    /// With `orphans`, a driver about to take its next thread first takes
    /// one a dead runner left (see [`Orphans`]); the thread of the pass it
    /// would have taken waits for the next pass.
    pub(super) fn continue_ids<R: ItemFlow>(
        &self,
        threads: &[ThreadId],
        options: &BatchOptions,
        agents: &mut [Box<dyn Agent>],
        on_item: &mut dyn FnMut(&BatchItem) -> R,
        skip_taken: bool,
        orphans: Option<&Orphans>,
    ) -> Result<BatchReport, EngineError> {
        let drive = DriveOptions {
            agent_spec: options.agent_spec.clone(),
            cancel: options.cancel.clone(),
            ..DriveOptions::default()
        };
        self.drive_pool(
            Items::Slice(threads),
            options,
            agents,
            on_item,
            &|engine, index, &listed, agent| {
                let id = match orphans {
                    Some(o) => o.next(engine).unwrap_or(listed),
                    None => listed,
                };
                let outcome = engine.drive(id, &drive, agent);
                if skip_taken && outcome.results.is_empty() && taken_by_another(&outcome) {
                    return None;
                }
                let after = match engine.threads().get(id) {
                    Ok(r) => r.map(|r| r.underlying_status()),
                    Err(e) => {
                        return Some(BatchItem {
                            thread: Some(id),
                            ..BatchItem::failed(index, e.into())
                        });
                    }
                };
                Some(BatchItem::of(index, id, after, outcome))
            },
        )
    }

    /// The threads of workflow `name` that a driver left `running` and no
    /// longer holds (it died): what another runner takes over first.
    pub(crate) fn orphaned_threads(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<Vec<ThreadId>, EngineError> {
        Ok(self
            .running_threads(name, labels)?
            .into_iter()
            .filter_map(|(id, held)| (!held).then_some(id))
            .collect())
    }

    /// The threads of workflow `name` a `batch --continue` drives, oldest
    /// first: idle ones, and running ones whose driver is gone; not
    /// suspended ones (they wait for a human) nor ones a live driver holds.
    ///
    /// ```
    /// use uwf_db::engine::{Cancel, CancelOptions, StartOptions};
    ///
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let start = |prompt| store.engine().start_workflow(workflow, prompt, &StartOptions::default());
    /// let (idle, held, cancelled) = (start("idle")?, start("held")?, start("cancelled")?);
    /// store.engine().cancel_thread(cancelled.id, &CancelOptions::default())?;
    /// // Another driver holds this one.
    /// let claim = store.engine().claim(held.id, &Cancel::new())?;
    ///
    /// assert_eq!(store.engine().continuable_threads("review")?, [idle.id]);
    /// claim.release()?;
    /// let mut both = vec![idle.id, held.id];
    /// both.sort();
    /// assert_eq!(store.engine().continuable_threads("review")?, both);
    /// assert!(store.engine().continuable_threads("another workflow")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continuable_threads(&self, name: &str) -> Result<Vec<ThreadId>, EngineError> {
        self.continuable_threads_labelled(name, &[])
    }

    /// [`Engine::continuable_threads`] that carry every one of `labels`
    /// (`batch --continue --label K=V`).
    pub fn continuable_threads_labelled(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<Vec<ThreadId>, EngineError> {
        let query = ThreadQuery {
            statuses: vec![ThreadStatus::Idle, ThreadStatus::Running],
            workflow: Some(name.to_owned()),
            labels: labels.to_vec(),
            limit: usize::MAX,
            ..ThreadQuery::default()
        };
        let idle: Vec<ThreadId> = self
            .threads()
            .list(&query)?
            .into_iter()
            .filter(|r| r.underlying_status() == ThreadStatus::Idle)
            .map(|r| r.id)
            .collect();
        let held = claim::are_held(&self.store, &idle)?;
        let mut ids: Vec<ThreadId> = idle
            .into_iter()
            .zip(held)
            .filter_map(|(id, held)| (!held).then_some(id))
            .collect();
        ids.sort();
        Ok(ids)
    }
}

/// A batch's piece of work: item `index` driven with a driver's agent; its
/// outcome, or `None` when another runner took it first.
/// How often a `batch --continue` pass looks for threads a dead runner
/// left `running`, which its drivers then take before the rest of the
/// pass ([`Engine::continue_workflow`]).
pub const ORPHAN_CHECK: Duration = Duration::from_secs(5);

/// The threads a dead runner left `running` (their claims no longer held),
/// found while a `batch --continue` pass goes on: when a driver of the pass
/// is about to take its next thread and [`ORPHAN_CHECK`] has passed since
/// the last look, it lists the workflow's `running` threads and keeps the
/// unclaimed ones, which drivers then take before the pass's own list. So a
/// killed runner's threads are taken over within [`ORPHAN_CHECK`] plus the
/// time until one of a survivor's drivers finishes its current thread,
/// however long the pass's queue (it was the whole queue: 25–38 s with a
/// thousand queued calls).
pub(crate) struct Orphans {
    workflow: String,
    labels: Vec<(String, String)>,
    state: std::sync::Mutex<OrphanState>,
}

struct OrphanState {
    looked: Instant,
    queue: std::collections::VecDeque<ThreadId>,
    seen: HashSet<ThreadId>,
}
impl Orphans {
    pub(crate) fn new(workflow: &str, labels: &[(String, String)]) -> Orphans {
        Orphans {
            workflow: workflow.to_owned(),
            labels: labels.to_vec(),
            state: std::sync::Mutex::new(OrphanState {
                looked: Instant::now(),
                queue: std::collections::VecDeque::new(),
                seen: HashSet::new(),
            }),
        }
    }

    /// The next orphan to drive, if any (looking for new ones when it is
    /// time). A failed look finds none: the pass goes on, and the next
    /// pass lists every continuable thread anyway.
    fn next(&self, engine: &Engine) -> Option<ThreadId> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.looked.elapsed() >= ORPHAN_CHECK {
            state.looked = Instant::now();
            if let Ok(found) = engine.orphaned_threads(&self.workflow, &self.labels) {
                for id in found {
                    if state.seen.insert(id) {
                        state.queue.push_back(id);
                    }
                }
            }
        }
        state.queue.pop_front()
    }
}
