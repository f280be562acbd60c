// One step of a thread's log (a LogEntry) as a collapsible card; used by the
// thread timeline and the diff. The body (markdown of the prompt and the
// reply) is built when the card is first opened, so long timelines stay fast.
import { api, seg } from './api.js';
import { fmtCost, fmtDuration, fmtTime, fmtTokens, h, renderMarkdown, shortHash, showError, timeEl } from './ui.js';

/** End nodes are `__end__` in the log (`$end` in older drafts of the API). */
export const isEnd = (e) => e.role === '__end__' || e.role === '$end';

/** The wall time of a step: what the agent reported, else the time since the step before. */
export function stepDuration(entry, olderTimestamp) {
  if (entry.usage && entry.usage.wall_ms != null && entry.usage.wall_ms > 0) return entry.usage.wall_ms;
  if (olderTimestamp != null && entry.timestamp != null) return Math.max(0, entry.timestamp - olderTimestamp);
  return null;
}

/** A key/value table of the frontmatter; values that are not strings as JSON. */
function metaTable(meta) {
  const entries = Object.entries(meta || {});
  if (!entries.length) return h('p', { class: 'muted', text: 'No frontmatter.' });
  return h('table', { class: 'kv' }, h('tbody', {}, entries.map(([k, v]) =>
    h('tr', {}, h('th', { scope: 'row', class: 'mono', text: k }),
      h('td', {}, typeof v === 'string' ? v : h('code', { text: JSON.stringify(v) }))))));
}

/**
 * What was kept with the step (`prompt_kept`, `stderr`): a button that
 * fetches the exact prompt the agent was sent and its stderr
 * (GET /api/steps/{hash}); shown as plain text, never as markdown.
 */
function keptSection(entry) {
  const box = h('div', { class: 'kept' });
  const what = [entry.prompt_kept && 'the exact prompt sent', entry.stderr && "the agent's stderr"].filter(Boolean).join(' and ');
  const b = h('button', { type: 'button', class: 'kept-show', text: `Show ${what}` });
  b.addEventListener('click', async () => {
    b.disabled = true;
    try {
      const s = await api(`/api/steps/${seg(entry.hash)}`);
      const parts = [];
      if (s.sent_prompt != null) parts.push(h('h4', { text: 'Exact prompt sent' }), h('pre', { class: 'plain sent-prompt', text: s.sent_prompt }));
      if (s.stderr_text != null) parts.push(h('h4', { text: 'Agent stderr' }), h('pre', { class: 'plain agent-stderr', text: s.stderr_text }));
      box.replaceChildren(...parts);
    } catch (err) {
      b.disabled = false;
      showError(err);
    }
  });
  box.append(b);
  return box;
}

/**
 * A step card. `opts.olderTimestamp`: the previous step's time (for the
 * duration); `opts.onFork(entry, button)`: shows a "Fork here" button;
 * `opts.open`: start expanded.
 */
export function stepCard(entry, opts = {}) {
  const end = isEnd(entry);
  const u = entry.usage || {};
  const dur = h('span', { class: 'dur', title: 'Duration' });
  const tokens = fmtTokens(u);
  const summary = h('summary', { 'data-row': '' },
    h('span', { class: 'seq mono', text: `#${entry.seq}` }),
    h('span', { class: ['role', end && 'role-end'], text: end ? 'end' : entry.role }),
    entry.status != null && h('span', { class: 'edge' }, h('span', { 'aria-hidden': 'true', text: '→ ' }), h('span', { class: 'edge-status', text: String(entry.status) })),
    end && entry.meta && entry.meta.return_code != null && h('span', { class: 'edge', text: `return code ${entry.meta.return_code}` }),
    h('span', { class: 'facts' },
      !end && dur,
      tokens && h('span', { title: 'Tokens', text: tokens }),
      u.cost_usd != null && h('span', { title: 'Cost', text: fmtCost(u.cost_usd) }),
      u.model && h('span', { class: 'model', title: 'Model', text: u.model }),
      timeEl(entry.timestamp)));
  const body = h('div', { class: 'step-body' });
  const card = h('details', {
    class: ['step', end && 'step-end'], 'data-seq': entry.seq, 'data-hash': entry.hash, 'data-ts': entry.timestamp,
  }, summary, body);

  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    const parts = [];
    if (!end) parts.push(h('h4', { text: 'Frontmatter' }), metaTable(entry.meta));
    parts.push(h('h4', { text: end ? 'Instruction' : 'Prompt' }), h('div', { class: 'prompt' }, renderMarkdown(entry.input)));
    parts.push(h('h4', { text: end ? 'Summary' : 'Reply' }), h('div', { class: 'reply' }, renderMarkdown(entry.content)));
    if (!end && (entry.prompt_kept || entry.stderr)) parts.push(keptSection(entry));
    if (end) parts.push(h('h4', { text: 'End' }), metaTable(entry.meta));
    const foot = h('div', { class: 'step-foot' },
      h('span', { class: 'muted' }, 'node ', h('code', { title: entry.hash, text: shortHash(entry.hash) })),
      h('span', { class: 'muted', text: fmtTime(entry.timestamp) }),
      entry.child_thread && h('span', { class: 'muted' }, 'child end ', h('code', { title: entry.child_thread, text: shortHash(entry.child_thread) })),
      u.calls > 1 && h('span', { class: 'muted', text: `${u.calls} calls` }));
    if (opts.onFork && !end) {
      const b = h('button', { type: 'button', class: 'fork-here', text: 'Fork here', title: `New thread whose head is step #${entry.seq}; the steps after it are not copied` });
      b.addEventListener('click', () => opts.onFork(entry, b));
      foot.append(b);
    }
    parts.push(foot);
    body.append(...parts);
  };
  card.addEventListener('toggle', () => { if (card.open) build(); });
  if (opts.open) { card.open = true; build(); }
  // Lets the caller fill the duration once the step before is known.
  card.setOlderTimestamp = (ts) => {
    const ms = stepDuration(entry, ts);
    dur.textContent = ms == null ? '' : fmtDuration(ms);
  };
  card.setOlderTimestamp(opts.olderTimestamp);
  return card;
}
