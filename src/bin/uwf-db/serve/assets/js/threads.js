// The thread list: filters, cursor paging, and live rows from /api/events.
//
// It never loads everything: one page (PAGE rows) at a time, by cursor,
// when the "Older" button is clicked or scrolled into view. Live activity
// updates rows in place and moves them to the top (the list is newest
// activity first); events are batched per animation frame, so a busy batch
// run costs one DOM pass per frame, and the list keeps at most MAX_ROWS rows.
import { api, subscribe, withQuery } from './api.js';
import {
  fmtCost, fmtCount, h, labelChips, loading, parseLabels, replace, shortId, showError, statusBadge, timeEl,
} from './ui.js';

const PAGE = 50;
const MAX_ROWS = 2000;
const STATUSES = ['idle', 'running', 'suspended', 'completed', 'failed', 'cancelled'];

/** The filters as the hash query holds them. */
function readFilters(query) {
  return {
    status: query.get('status') || '',
    workflow: query.get('workflow') || '',
    labels: query.getAll('label'),
    failed: query.get('failed') === 'true',
  };
}

/** Whether a thread (summary or activity) passes the filters, as the server would decide. */
function matches(t, f) {
  if (f.status && t.status !== f.status) return false;
  if (f.workflow && t.workflow !== f.workflow) return false;
  if (f.failed && !t.last_error) return false;
  for (const kv of f.labels) {
    const i = kv.indexOf('=');
    if ((t.labels || {})[kv.slice(0, i)] !== kv.slice(i + 1)) return false;
  }
  return true;
}

const lastActivity = (t) => t.last_activity || t.completed_at || t.updated_at || t.created_at;

export async function threadsView(main, _params, query) {
  let filters = readFilters(query);
  const rows = new Map(); // thread id -> { tr, data }
  let nextCursor = null;
  let loadingPage = false;
  let generation = 0; // bumps when filters change, so stale pages are dropped

  // ---- filters form
  const statusSel = h('select', { name: 'status', 'aria-label': 'Status' },
    h('option', { value: '', text: 'any status' }),
    STATUSES.map((s) => h('option', { value: s, text: s })));
  statusSel.value = filters.status;
  const wfInput = h('input', { name: 'workflow', type: 'search', placeholder: 'workflow', 'aria-label': 'Workflow', value: filters.workflow, list: 'wf-names', 'data-search': '' });
  const wfList = h('datalist', { id: 'wf-names' });
  const labelInput = h('input', { name: 'label', type: 'search', placeholder: 'label k=v', 'aria-label': 'Labels (k=v, space separated)', value: filters.labels.join(' ') });
  const failedBox = h('input', { type: 'checkbox', name: 'failed', checked: filters.failed });
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter threads' },
    statusSel, wfInput, wfList, labelInput,
    h('label', { class: 'check' }, failedBox, ' with errors only'),
    h('button', { type: 'submit', text: 'Filter' }));

  const tbody = h('tbody');
  const table = h('table', { class: 'threads' },
    h('thead', {}, h('tr', {},
      ['Thread', 'Workflow', 'Status', 'Labels', 'Seq', 'Last activity', 'Tokens', 'Cost'].map((c) =>
        h('th', { scope: 'col', text: c })))),
    tbody);
  const count = h('span', { class: 'muted count', 'aria-live': 'polite' });
  const empty = h('p', { class: 'empty', hidden: true }, 'No threads match. ', h('a', { href: '#/start', text: 'Start a run' }), '.');
  const more = h('button', { type: 'button', class: 'more', hidden: true, text: 'Older threads' });
  const status = loading();

  const root = h('section', { class: 'page' },
    h('div', { class: 'page-head' }, h('h1', { text: 'Threads' }), count),
    form, status, table, empty, h('div', { class: 'more-wrap' }, more));
  replace(main, root);

  api('/api/workflows').then((r) => {
    replace(wfList, (r.workflows || []).map((w) => h('option', { value: w.name })));
  }).catch(() => {});

  // ---- rows
  function cellsFor(t) {
    const u = t.usage;
    const tokens = u && (u.input_tokens || u.output_tokens) ? fmtCount((u.input_tokens || 0) + (u.output_tokens || 0)) : '—';
    return [
      h('td', { 'data-label': 'Thread' }, h('a', { href: `#/t/${t.thread}`, class: 'mono', title: t.thread, text: shortId(t.thread), tabindex: '-1' }),
        t.last_error && h('span', { class: 'err-dot', title: `Last error: ${t.last_error}`, 'aria-label': 'has an error', text: '!' })),
      h('td', { 'data-label': 'Workflow' }, h('a', { href: `#/w/${encodeURIComponent(t.workflow)}`, text: t.workflow, tabindex: '-1' })),
      h('td', { 'data-label': 'Status' }, statusBadge(t.status)),
      h('td', { 'data-label': 'Labels' }, labelChips(t.labels)),
      h('td', { 'data-label': 'Seq', class: 'num', text: t.seq ?? '—' }),
      h('td', { 'data-label': 'Activity' }, timeEl(lastActivity(t))),
      h('td', { 'data-label': 'Tokens', class: 'num', text: tokens }),
      h('td', { 'data-label': 'Cost', class: 'num', text: u && u.cost_usd ? fmtCost(u.cost_usd) : '—' }),
    ];
  }

  function makeRow(t) {
    const tr = h('tr', {
      tabindex: '0', 'data-row': '', 'data-href': `#/t/${t.thread}`, 'data-thread': t.thread,
      'aria-label': `Thread ${t.thread}, ${t.workflow}, ${t.status}`,
    }, cellsFor(t));
    return tr;
  }

  // A click anywhere on a row opens it (links inside keep their own target).
  tbody.addEventListener('click', (ev) => {
    const tr = ev.target.closest('tr[data-href]');
    if (!tr || ev.target.closest('a, button')) return;
    if (window.getSelection()?.toString()) return; // selecting text, not opening
    window.location.hash = tr.dataset.href;
  });

  function updateCount() {
    const n = rows.size;
    count.textContent = `${n} shown${nextCursor ? ', more below' : ''}`;
    empty.hidden = n > 0 || loadingPage;
    table.hidden = n === 0;
  }

  async function loadPage(first) {
    if (loadingPage) return;
    loadingPage = true;
    const gen = generation;
    more.disabled = true;
    try {
      const r = await api(withQuery('/api/threads', {
        status: filters.status, workflow: filters.workflow, label: filters.labels,
        failed: filters.failed ? 'true' : '', limit: PAGE, cursor: first ? '' : nextCursor,
      }));
      if (gen !== generation) return;
      for (const t of r.threads || []) {
        if (rows.has(t.thread)) continue; // already shown (it moved up live)
        const tr = makeRow(t);
        rows.set(t.thread, { tr, data: t });
        tbody.append(tr);
      }
      nextCursor = r.next_cursor || null;
    } catch (e) {
      if (gen === generation) showError(e);
    } finally {
      if (gen === generation) {
        loadingPage = false;
        status.remove();
        more.disabled = false;
        more.hidden = !nextCursor;
        updateCount();
      }
    }
  }

  function reload() {
    generation += 1;
    loadingPage = false;
    rows.clear();
    tbody.replaceChildren();
    nextCursor = null;
    more.hidden = true;
    loadPage(true);
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    let labels;
    try {
      labels = Object.entries(parseLabels(labelInput.value)).map(([k, v]) => `${k}=${v}`);
    } catch (e) {
      showError(e);
      labelInput.focus();
      return;
    }
    filters = { status: statusSel.value, workflow: wfInput.value.trim(), labels, failed: failedBox.checked };
    // Keep the filters in the URL (shareable, survives reload) without a
    // hashchange, which would rebuild the page and lose focus.
    const q = withQuery('', { status: filters.status, workflow: filters.workflow, label: filters.labels, failed: filters.failed ? 'true' : '' });
    history.replaceState(null, '', `#/threads${q}`);
    reload();
  });
  statusSel.addEventListener('change', () => form.requestSubmit());
  failedBox.addEventListener('change', () => form.requestSubmit());

  more.addEventListener('click', () => loadPage(false));
  // Infinite scroll: the "Older" button loads itself when it comes into view.
  const io = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && nextCursor && !loadingPage) loadPage(false);
  }, { rootMargin: '400px' });
  io.observe(more);

  // ---- live
  let queue = new Map();
  let frame = 0;

  function flush() {
    frame = 0;
    const batch = queue;
    queue = new Map();
    // Oldest first, so that the newest ends on top.
    const acts = [...batch.values()].sort((a, b) => String(lastActivity(a)).localeCompare(String(lastActivity(b))));
    for (const act of acts) {
      const known = rows.get(act.thread);
      if (!matches(act, filters)) {
        if (known) { known.tr.remove(); rows.delete(act.thread); }
        continue;
      }
      // The activity lacks some summary fields (usage): keep the known ones.
      const data = { ...(known?.data || {}), ...act };
      const focused = known && known.tr.contains(document.activeElement);
      const tr = known ? known.tr : makeRow(data);
      if (known) tr.replaceChildren(...cellsFor(data));
      tr.setAttribute('aria-label', `Thread ${data.thread}, ${data.workflow}, ${data.status}`);
      tr.classList.remove('flash');
      void tr.offsetWidth; // restart the highlight animation
      tr.classList.add('flash');
      tbody.prepend(tr);
      if (focused) tr.focus({ preventScroll: true });
      rows.set(act.thread, { tr, data });
    }
    // Bound the DOM: drop the oldest rows; paging from there would skip
    // threads, so offer a reload instead.
    if (rows.size > MAX_ROWS) {
      while (rows.size > MAX_ROWS && tbody.lastElementChild) {
        rows.delete(tbody.lastElementChild.dataset.thread);
        tbody.lastElementChild.remove();
      }
      nextCursor = null;
      more.hidden = true;
      if (!root.querySelector('.trimmed')) {
        root.append(h('p', { class: 'trimmed muted' }, `Showing the ${MAX_ROWS} most recent. `,
          h('button', { type: 'button', text: 'Reload the list', on: { click: (e) => { e.target.parentElement.remove(); reload(); } } })));
      }
    }
    updateCount();
  }

  const close = subscribe('/api/events', {
    thread: (act) => {
      if (!act || !act.thread) return;
      queue.set(act.thread, act);
      if (!frame) frame = requestAnimationFrame(flush);
    },
    // More changed while the stream was away than it replays: what is
    // shown may be stale, so load it again.
    reset: () => reload(),
  });

  await loadPage(true);

  return () => {
    close();
    io.disconnect();
    if (frame) cancelAnimationFrame(frame);
  };
}
