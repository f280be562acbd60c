// One thread: its record, actions (stop, cancel, fork, resume, labels,
// compare) and its steps newest first, live from /api/threads/{id}/events.
import { api, healthz, seg, subscribe, withQuery } from './api.js';
import { stepCard } from './steps.js';
import {
  busy, fmtCost, fmtCount, fmtDuration, h, labelChips, loading, parseLabels, renderMarkdown, replace, shortHash, shortId,
  showError, showInfo, statusBadge, timeEl, toDate,
} from './ui.js';

const PAGE = 30;
const RESUMABLE = new Set(['suspended', 'completed', 'failed']);
const WIDE = new Set(['Agent', 'Forked from', 'Children']); // facts given two columns

/** "4 calls · 1.2k in · 340 out · $0.01 · 3.2 s", leaving out what no agent reported. */
function usageLine(u) {
  const parts = [`${u.calls} call${u.calls === 1 ? '' : 's'}`];
  if (u.input_tokens || u.output_tokens) parts.push(`${fmtCount(u.input_tokens)} in`, `${fmtCount(u.output_tokens)} out`);
  if (u.cost_usd) parts.push(fmtCost(u.cost_usd));
  parts.push(fmtDuration(u.wall_ms));
  return parts.join(' · ');
}

export async function threadView(main, [idParam]) {
  const root = h('section', { class: 'page thread' }, loading());
  replace(main, root);

  const [health, first] = await Promise.all([healthz().catch(() => ({})), api(`/api/threads/${seg(idParam)}`)]);
  let detail = first;
  const id = detail.thread; // the full id, when the URL had a prefix
  const readOnly = !!health.read_only;
  const agents = health.agents || [];

  const head = h('header', { class: 'thread-head' });
  const task = h('div', { class: 'task', hidden: true });
  const timeline = h('ol', { class: 'timeline', 'aria-label': 'Steps, newest first' });
  const more = h('button', { type: 'button', class: 'more', hidden: true, text: 'Older steps' });
  const stepsTitle = h('h2', { text: 'Steps' });
  replace(root, head, h('section', { class: 'steps' }, stepsTitle, timeline, h('div', { class: 'more-wrap' }, more)));

  // ---------------------------------------------------------------- header
  // Refreshes overlap (a live event's and an action's) and their answers
  // may come back in any order: only the latest one asked renders, as it
  // was asked after whatever made the others (an older answer arriving
  // last would otherwise put back what an action just changed).
  let refreshes = 0;
  async function refresh() {
    const mine = ++refreshes;
    try {
      const d = await api(`/api/threads/${seg(id)}`);
      if (mine !== refreshes) return;
      detail = d;
      renderHead();
      stepsTitle.textContent = `Steps (${detail.seq})`;
    } catch (e) {
      if (mine === refreshes) showError(e);
    }
  }

  async function post(action, body, button) {
    return busy(button, async () => {
      try {
        return await api(`/api/threads/${seg(id)}/${action}`, { body });
      } catch (e) {
        showError(e);
        return null;
      }
    });
  }

  function link(tid, text) {
    return h('a', { href: `#/t/${tid}`, class: 'mono', title: tid, text: text || shortId(tid) });
  }

  const info = h('div');
  const controls = h('div');
  const compare = h('div');
  head.append(info, controls, compare);
  let controlsKey = null;
  let pendingHead = false;
  const labelForm = readOnly ? null : makeLabelForm();

  function makeLabelForm() {
    const input = h('input', { type: 'text', placeholder: 'k=v', 'aria-label': 'Add labels (k=v)', size: '12' });
    const form = h('form', { class: 'inline-form' }, input, h('button', { type: 'submit', text: 'Add label' }));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      let set;
      try { set = parseLabels(input.value); } catch (e) { showError(e); return; }
      if (!Object.keys(set).length) return;
      if (await post('labels', { set, remove: [] }, form.querySelector('button'))) {
        input.value = '';
        input.blur();
        await refresh();
      }
    });
    form.addEventListener('focusout', () => {
      setTimeout(() => { if (pendingHead && !form.contains(document.activeElement)) { pendingHead = false; renderHead(); } }, 0);
    });
    return form;
  }

  function renderHead() {
    const d = detail;
    const u = d.usage;
    const facts = [
      ['Workflow', h('a', { href: `#/w/${seg(d.workflow)}`, text: d.workflow })],
      ['Driver', d.driver_alive || d.claimed_status
        ? `${d.driver_alive ? 'alive' : 'dead (the next driver takes over)'}${d.claimed_status ? `, ${d.claimed_status} under the claim` : ''}` : null],
      ['Next role', d.next_role ? h('span', { class: 'mono', text: d.next_role }) : null],
      ['Steps', `${d.seq}${d.rounds != null ? ` (${d.rounds} round${d.rounds === 1 ? '' : 's'} since the last end)` : ''}`],
      ['Started', timeEl(d.created_at)],
      ['Last activity', timeEl(d.completed_at || d.updated_at)],
      ['Usage', u ? usageLine(u) : null],
      ['Agent', d.agent ? h('code', { text: d.agent }) : null],
      ['Parent', d.parent_thread ? link(d.parent_thread) : null],
      ['Waiting for', d.active_child ? link(d.active_child) : null],
      ['Children', d.children && d.children.length ? h('span', { class: 'links' }, d.children.map((c) => link(c))) : null],
      ['Forked from', d.forked_from ? [link(d.forked_from.thread), ' at node ', h('code', { title: d.forked_from.node, text: shortHash(d.forked_from.node) }), ' · ',
        h('a', { href: `#/diff/${d.forked_from.thread}/${id}`, text: 'diff with origin' })] : null],
    ].filter(([, v]) => v !== null && v !== undefined);

    const labelsBox = h('div', { class: 'labels-edit' }, labelChips(d.labels, readOnly ? null : removeLabel), labelForm);
    facts.splice(3, 0, ['Labels', labelsBox]);

    const alerts = [];
    if (d.status === 'suspended') {
      alerts.push(h('div', { class: 'callout callout-wait', role: 'note' },
        h('strong', { text: `Waiting for a human${d.suspended_role ? ` (role ${d.suspended_role})` : ''}: ` }),
        h('span', { class: 'suspend-message', text: d.suspend_message || '(no message)' })));
    }
    if (d.last_error) {
      alerts.push(h('div', { class: 'callout callout-error', role: 'note' },
        h('strong', { text: 'Last error: ' }), h('span', { class: 'pre-line', text: d.last_error })));
    }

    // Typing in a form of the header survives a live refresh: the forms
    // are kept (the label form is moved, not rebuilt; actions and resume
    // are rebuilt only when what they offer changes), and a refresh while
    // the label form has focus waits until it loses it.
    if (labelForm && labelForm.contains(document.activeElement)) {
      pendingHead = true;
      return;
    }
    replace(info,
      h('div', { class: 'title-row' },
        h('h1', {}, 'Thread ', h('span', { class: 'mono thread-id', text: id })),
        statusBadge(d.status)),
      alerts,
      task,
      h('dl', { class: 'facts-grid' }, facts.map(([k, v]) => h('div', { class: WIDE.has(k) ? 'wide' : null }, h('dt', { text: k }), h('dd', {}, v)))));
    const key = `${d.status}/${d.driver_alive}/${d.done}`;
    if (key !== controlsKey) {
      controlsKey = key;
      replace(controls,
        readOnly ? h('p', { class: 'muted', text: 'The server is read-only: no actions.' }) : actions(d),
        !readOnly && RESUMABLE.has(d.status) ? resumeForm(d) : null);
    }
    if (!compare.firstChild) compare.append(compareForm(d));
  }

  async function removeLabel(k) {
    try {
      await api(`/api/threads/${seg(id)}/labels`, { body: { set: {}, remove: [k] } });
      await refresh();
    } catch (e) {
      showError(e);
    }
  }

  function actions(d) {
    const live = d.status === 'running' || d.driver_alive;
    const stop = h('button', { type: 'button', text: 'Stop', disabled: !live, title: 'Ask the driver to stop after the step in flight' });
    const cancel = h('button', { type: 'button', class: 'danger', text: 'Cancel', disabled: !!d.done, title: 'End the thread (return code 2)' });
    // An ended thread's head is its end node, which cannot be forked:
    // fork at one of its steps (below) or resume it instead.
    const fork = h('button', {
      type: 'button', text: 'Fork at head', disabled: !!d.done,
      title: d.done ? 'An ended thread forks at one of its steps ("Fork here" below), or resumes' : 'A new thread sharing this history',
    });
    stop.addEventListener('click', async () => {
      if (await post('stop', {}, stop)) { showInfo('Stop requested: the driver stops after the step in flight.'); refresh(); }
    });
    cancel.addEventListener('click', async () => {
      if (!window.confirm(`Cancel thread ${id}? It ends with return code 2.`)) return;
      if (await post('cancel', { force: false }, cancel)) { showInfo('Cancelled.'); refresh(); }
    });
    fork.addEventListener('click', () => forkAt(null, fork));
    return h('div', { class: 'actions' }, stop, cancel, fork);
  }

  async function forkAt(seq, button) {
    const r = await post('fork', seq == null ? {} : { seq }, button);
    if (!r) return;
    const nid = r.thread;
    showInfo(`Forked${seq == null ? '' : ` at step #${seq}`} into ${nid}.`, h('a', { href: `#/diff/${id}/${nid}`, text: 'Diff with this thread' }));
    window.location.hash = `#/t/${nid}`;
  }

  function resumeForm(d) {
    const text = h('textarea', { name: 'text', rows: '3', required: d.status === 'suspended', placeholder: d.status === 'suspended' ? 'Your answer' : 'What to do next (optional)', 'aria-label': 'Resume text' });
    // The server drives with one of its named agents (none named: `default`).
    const agentSel = h('select', { name: 'agent', 'aria-label': 'Agent' },
      agents.map((a) => h('option', { value: a, text: a, selected: a === 'default' })));
    const submit = h('button', { type: 'submit', class: 'primary', text: 'Resume' });
    const form = h('form', { class: 'resume', 'aria-label': 'Resume the thread' },
      h('label', { class: 'block' }, d.status === 'suspended' ? 'Answer and resume' : 'What to do next', text),
      h('div', { class: 'row' }, h('label', {}, 'Agent ', agentSel), submit));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const r = await post('resume', { text: text.value || null, agent: agentSel.value || null }, submit);
      if (r) { text.value = ''; showInfo('Resumed.'); refresh(); }
    });
    if (d.status === 'suspended') return form;
    // An ended thread can go on, but that is rarely wanted: folded away.
    return h('details', { class: 'resume-more' }, h('summary', { text: `Resume this ${d.status} thread…` }), form);
  }

  function compareForm(d) {
    const input = h('input', { type: 'text', list: 'compare-opts', placeholder: 'thread id or prefix', 'aria-label': 'Thread to compare with', class: 'mono' });
    const opts = h('datalist', { id: 'compare-opts' });
    const known = new Map();
    const add = (tid, why) => { if (tid && tid !== id && !known.has(tid)) known.set(tid, why); };
    if (d.forked_from) add(d.forked_from.thread, 'fork origin');
    for (const c of d.children || []) add(c, 'child');
    const fill = () => replace(opts, [...known].map(([tid, why]) => h('option', { value: tid, label: `${tid} (${why})` })));
    fill();
    // Recent threads of the same workflow (forks among them) as suggestions.
    api(withQuery('/api/threads', { workflow: d.workflow, limit: 20 })).then((r) => {
      for (const t of r.threads || []) add(t.thread, `${t.status}, ${t.seq} steps`);
      fill();
    }).catch(() => {});
    const form = h('form', { class: 'inline-form compare', 'aria-label': 'Compare with another thread' },
      h('label', {}, 'Compare with ', input), opts, h('button', { type: 'submit', text: 'Diff' }));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const other = input.value.trim();
      if (other) window.location.hash = `#/diff/${id}/${encodeURIComponent(other)}`;
    });
    return form;
  }

  renderHead();
  stepsTitle.textContent = `Steps (${detail.seq})`;
  loadTask();

  /** The task prompt: the start node's `prompt` blob (best effort; it may be large). */
  async function loadTask() {
    try {
      const start = await api(withQuery(`/api/nodes/${seg(detail.start)}`, { max_bytes: 65536 }));
      const ref = start?.payload?.prompt;
      if (!ref) return;
      let content;
      try {
        const blob = await api(withQuery(`/api/nodes/${seg(ref)}`, { max_bytes: 262144 }));
        content = typeof blob?.payload === 'string' ? renderMarkdown(blob.payload) : null;
      } catch (e) {
        if (e.kind !== 'too_large') throw e;
        content = h('p', { class: 'muted' }, 'Too large to show here: ', h('code', { text: ref }));
      }
      if (!content) return;
      replace(task, h('h4', { text: 'Task' }), content);
      task.hidden = false;
    } catch {
      // No task shown: the record and the steps are what matter.
    }
  }

  // -------------------------------------------------------------- timeline
  let nextBefore = null;
  const seen = new Set(); // hashes shown: the stream may replay steps after a reconnect
  const startedAt = toDate(detail.created_at)?.getTime() ?? null;
  const onFork = readOnly ? null : (entry, button) => forkAt(entry.seq, button);
  const cardOf = (li) => li?.firstElementChild || null;

  /**
   * Puts a step in its place (newest first, by seq) and fixes the
   * durations around it: a step's duration runs from the step before it
   * (the first step's from the thread's start) when the agent did not
   * report one.
   */
  function insertStep(entry, flash) {
    if (!entry || !entry.hash || seen.has(entry.hash)) return;
    seen.add(entry.hash);
    timeline.querySelector('.empty-steps')?.remove();
    const card = stepCard(entry, { onFork });
    const li = h('li', { class: flash ? 'flash' : null, 'data-seq': entry.seq }, card);
    const last = timeline.lastElementChild;
    if (!last || Number(last.dataset.seq) > entry.seq) {
      timeline.append(li); // paging older steps: the common case
    } else {
      let at = timeline.firstElementChild;
      while (at && Number(at.dataset.seq) > entry.seq) at = at.nextElementSibling;
      timeline.insertBefore(li, at);
    }
    const older = cardOf(li.nextElementSibling);
    card.setOlderTimestamp(older ? Number(older.dataset.ts) : entry.seq === 1 ? startedAt : null);
    const newer = cardOf(li.previousElementSibling);
    if (newer) newer.setOlderTimestamp(entry.timestamp);
  }

  async function loadSteps(first) {
    more.disabled = true;
    try {
      const r = await api(withQuery(`/api/threads/${seg(id)}/log`, { limit: PAGE, before: first ? '' : nextBefore }));
      for (const e of r.entries || []) insertStep(e, false);
      nextBefore = r.next_before || null;
      more.hidden = !nextBefore;
      if (!timeline.children.length) timeline.append(h('li', { class: 'muted empty-steps', text: 'No steps yet.' }));
    } catch (e) {
      showError(e);
    } finally {
      more.disabled = false;
    }
  }
  more.addEventListener('click', () => loadSteps(false));

  // Live: steps appear on top as they commit; a status change refetches the
  // record (several events in a burst cause one refetch).
  let refreshTimer = 0;
  const scheduleRefresh = () => {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, 150);
  };
  // Subscribed after the first page, from its newest step on (`after`);
  // a reconnect resumes from the last event id by itself.
  await loadSteps(true);
  const newestSeq = Number(timeline.firstElementChild?.dataset.seq) || 0;
  const close = subscribe(withQuery(`/api/threads/${seg(id)}/events`, { after: newestSeq }), {
    step: (entry) => { insertStep(entry, true); scheduleRefresh(); },
    thread: scheduleRefresh,
  });

  return () => { close(); clearTimeout(refreshTimer); };
}
