// Usage totals of the whole store, and what the server says about itself.
import { api, healthz } from './api.js';
import { fmtCost, fmtDuration, h, loading, replace } from './ui.js';

export async function usageView(main) {
  const root = h('section', { class: 'page' }, h('h1', { text: 'Usage' }), loading());
  replace(main, root);
  const [u, health] = await Promise.all([api('/api/usage'), healthz().catch(() => null)]);
  const n = (x) => (x === null || x === undefined ? '—' : Number(x).toLocaleString('en-US'));
  const card = (label, value, sub) => h('div', { class: 'stat' },
    h('div', { class: 'stat-label', text: label }), h('div', { class: 'stat-value', text: value }), sub && h('div', { class: 'muted', text: sub }));
  replace(root,
    h('h1', { text: 'Usage' }),
    h('p', { class: 'muted', text: 'Totals over every agent call recorded in this store (summarising and re-ask calls included). Tokens and cost add up what the agents reported.' }),
    h('div', { class: 'stats' },
      card('Agent calls', n(u.calls)),
      card('Wall time', fmtDuration(u.wall_ms), u.wall_ms >= 1000 ? `${n(u.wall_ms)} ms` : null),
      card('Input tokens', n(u.input_tokens)),
      card('Output tokens', n(u.output_tokens)),
      card('Cost', fmtCost(u.cost_usd), u.cost_usd ? `$${Number(u.cost_usd).toFixed(6)}` : null)),
    health && h('section', {},
      h('h2', { text: 'Server' }),
      h('dl', { class: 'facts-grid' },
        [['Version', health.version], ['API version', health.api_version], ['Backend', health.backend], ['Store', health.store],
          ['Agents', (health.agents || []).join(', ') || '—'], ['Read-only', health.read_only ? 'yes' : 'no']]
          .filter(([, v]) => v !== undefined && v !== null)
          .map(([k, v]) => h('div', {}, h('dt', { text: k }), h('dd', { class: k === 'Store' ? 'mono' : null, text: v ?? '—' }))))));
}
