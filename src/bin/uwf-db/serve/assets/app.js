// The dashboard's entry point: hash routing, the nav, keyboard navigation.
// Each view is `render(main, params, query) -> cleanup?`; the cleanup closes
// its event streams and timers when the route changes.
import { clearErrors, h, refreshTimes, replace, showError } from './js/ui.js';
import { threadsView } from './js/threads.js';
import { threadView } from './js/thread.js';
import { diffView } from './js/diff.js';
import { workflowsView, workflowView } from './js/workflows.js';
import { usageView } from './js/usage.js';
import { startView } from './js/start.js';

const routes = [
  [/^\/threads$/, 'threads', threadsView],
  [/^\/t\/([^/]+)$/, 'threads', threadView],
  [/^\/diff\/([^/]+)\/([^/]+)$/, 'threads', diffView],
  [/^\/workflows$/, 'workflows', workflowsView],
  [/^\/w\/([^/]+)$/, 'workflows', workflowView],
  [/^\/usage$/, 'usage', usageView],
  [/^\/start$/, 'start', startView],
];

const main = document.getElementById('main');
let cleanup = null;
let lastPath = null;

/** Parses `#/path?query` into [path, URLSearchParams]. */
function parseHash() {
  const raw = window.location.hash.replace(/^#/, '') || '/threads';
  const i = raw.indexOf('?');
  return i < 0 ? [raw, new URLSearchParams()] : [raw.slice(0, i), new URLSearchParams(raw.slice(i + 1))];
}

async function route() {
  const [path, query] = parseHash();
  if (!window.location.hash) history.replaceState(null, '', '#/threads');
  if (cleanup) {
    try { cleanup(); } catch (e) { console.error(e); }
    cleanup = null;
  }
  if (path !== lastPath) clearErrors();
  const samePage = path === lastPath;
  lastPath = path;
  let found = null;
  for (const [re, nav, view] of routes) {
    const m = path.match(re);
    if (m) {
      // A malformed %-escape in a typed URL is taken as it is.
      const decode = (x) => { try { return decodeURIComponent(x); } catch { return x; } };
      found = [nav, view, m.slice(1).map(decode)];
      break;
    }
  }
  for (const a of document.querySelectorAll('nav a[data-nav]')) {
    if (found && a.dataset.nav === found[0]) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!found) {
    replace(main, h('h1', { text: 'Not found' }), h('p', {}, 'No page at ', h('code', { text: path }), '. ', h('a', { href: '#/threads', text: 'Threads' })));
    return;
  }
  const [, view, params] = found;
  const token = {};
  routeToken = token;
  try {
    const c = await view(main, params, query, () => routeToken === token);
    // A view that finished after the route changed cleans up at once.
    if (routeToken === token) cleanup = c || null;
    else if (c) c();
  } catch (e) {
    if (e.name !== 'AbortError') showError(e);
  }
  if (!samePage) main.focus({ preventScroll: true });
}
let routeToken = null;

window.addEventListener('hashchange', route);
route();

// Relative times ("3m ago") stay right while the page is open.
setInterval(() => refreshTimes(main), 15000);

// j/k move between rows (`[data-row]`), Enter opens the focused row's link,
// `/` focuses the page's first filter or search box.
document.addEventListener('keydown', (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const t = ev.target;
  if (t.closest('input, textarea, select, [contenteditable]')) return;
  const rows = [...main.querySelectorAll('[data-row]')].filter((r) => r.offsetParent !== null);
  if (ev.key === 'j' || ev.key === 'k') {
    if (!rows.length) return;
    const cur = rows.indexOf(t.closest('[data-row]'));
    const next = cur < 0 ? 0 : Math.max(0, Math.min(rows.length - 1, cur + (ev.key === 'j' ? 1 : -1)));
    rows[next].focus();
    rows[next].scrollIntoView({ block: 'nearest' });
    ev.preventDefault();
  } else if (ev.key === 'Enter' && t.matches('[data-row][data-href]')) {
    window.location.hash = t.dataset.href;
    ev.preventDefault();
  } else if (ev.key === '/') {
    const f = main.querySelector('[data-search]');
    if (f) { f.focus(); ev.preventDefault(); }
  }
});
