// Two threads side by side from their shared prefix on (a fork and its
// origin, typically): /api/diff gives the count of shared steps and each
// side's steps after it, oldest first.
import { api, seg, withQuery } from './api.js';
import { stepCard } from './steps.js';
import { h, labelChips, loading, replace, shortId, statusBadge } from './ui.js';

export async function diffView(main, [a, b]) {
  const root = h('section', { class: 'page diff' }, h('h1', { text: 'Diff' }), loading());
  replace(main, root);
  const d = await api(withQuery('/api/diff', { a, b }));

  function side(label, t, steps) {
    const list = h('ol', { class: 'timeline oldest-first' });
    let prevTs = null;
    for (const e of steps || []) {
      list.append(h('li', {}, stepCard(e, { olderTimestamp: prevTs })));
      prevTs = e.timestamp;
    }
    if (!list.children.length) list.append(h('li', { class: 'muted', text: 'No steps after the shared ones.' }));
    return h('section', { class: 'diff-side', 'aria-label': `Thread ${label}` },
      h('header', {},
        h('h2', {}, `${label}: `, h('a', { href: `#/t/${t.thread}`, class: 'mono', title: t.thread, text: shortId(t.thread) }), ' ', statusBadge(t.status)),
        h('p', { class: 'muted' }, `${t.workflow} · ${t.seq} steps · `, labelChips(t.labels)),
        h('p', { class: 'muted', text: `${(steps || []).length} step${(steps || []).length === 1 ? '' : 's'} of its own` })),
      list);
  }

  replace(root,
    h('div', { class: 'page-head' },
      h('h1', { text: 'Diff' }),
      h('a', { href: `#/diff/${seg(d.b.thread)}/${seg(d.a.thread)}`, text: 'swap sides' })),
    h('p', { class: 'shared' },
      h('strong', { class: 'shared-count', text: String(d.shared) }),
      ` shared step${d.shared === 1 ? '' : 's'} (the same nodes), then they diverge. Steps are oldest first.`),
    h('div', { class: 'diff-cols' }, side('A', d.a, d.a_steps), side('B', d.b, d.b_steps)));
}
