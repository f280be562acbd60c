// DOM helpers, formatting, the banner and the one place agent text becomes
// HTML (renderMarkdown). Everything else is inserted as text: `h()` turns
// string children into text nodes, never markup.

/**
 * Creates an element. `attrs`: `class`, `text`, `dataset` (object),
 * `on` (object of event handlers), `hidden`/`disabled`/... booleans, and any
 * other attribute as a string. Children: nodes, strings (as text), arrays,
 * null/undefined/false (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith('svg:')
    ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.setAttribute('class', Array.isArray(v) ? v.filter(Boolean).join(' ') : v);
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

/** Appends children as `h` does (strings become text nodes). */
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces all children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// ---------------------------------------------------------------- formatting

/** A Date from an RFC 3339 string or ms since the epoch; null if neither. */
export function toDate(v) {
  if (v === null || v === undefined || v === '') return null;
  const d = new Date(typeof v === 'number' ? v : String(v));
  return Number.isNaN(d.getTime()) ? null : d;
}

/** "2026-11-22 03:03:02" in local time. */
export function fmtTime(v) {
  const d = toDate(v);
  if (!d) return '—';
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** "5s ago", "3m ago", "2h ago", "4d ago", or the date past 30 days. */
export function fmtAgo(v, now = Date.now()) {
  const d = toDate(v);
  if (!d) return '—';
  const s = Math.round((now - d.getTime()) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  if (s < 30 * 86400) return `${Math.floor(s / 86400)}d ago`;
  return fmtTime(d).slice(0, 10);
}

/** A <time> that shows a relative time, refreshed by `refreshTimes()`. */
export function timeEl(v) {
  const d = toDate(v);
  if (!d) return h('span', { class: 'muted', text: '—' });
  return h('time', { class: 'rel', datetime: d.toISOString(), title: fmtTime(d), text: fmtAgo(d) });
}

/** Re-renders every relative time under `root`. */
export function refreshTimes(root = document) {
  const now = Date.now();
  for (const t of root.querySelectorAll('time.rel')) t.textContent = fmtAgo(t.dateTime, now);
}

/** 950 → "950", 12345 → "12.3k", 4_200_000 → "4.2M". */
export function fmtCount(n) {
  if (n === null || n === undefined) return '—';
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1e3).toFixed(n < 1e4 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(n < 1e7 ? 1 : 0)}M`;
}

export function fmtCost(usd) {
  if (usd === null || usd === undefined) return '—';
  if (usd === 0) return '$0';
  return usd < 0.01 ? `$${usd.toFixed(4)}` : `$${usd.toFixed(2)}`;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.round(s % 60)).padStart(2, '0')}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, '0')}m`;
}

/** Tokens as "1.2k in · 300 out", or null when nothing was reported. */
export function fmtTokens(u) {
  if (!u || (u.input_tokens == null && u.output_tokens == null)) return null;
  if (!u.input_tokens && !u.output_tokens) return null;
  return `${fmtCount(u.input_tokens ?? 0)} in · ${fmtCount(u.output_tokens ?? 0)} out`;
}

/** The first 12 characters of a ULID: its time and a little randomness. */
export const shortId = (id) => (id ? String(id).slice(0, 12) : '—');
export const shortHash = (hash) => (hash ? String(hash).slice(0, 12) : '—');

/** A status badge; the status is also the CSS class (`st-completed`). */
export function statusBadge(status) {
  const s = String(status ?? 'unknown');
  return h('span', { class: `badge st-${s.replace(/[^a-z_]/g, '')}`, text: s });
}

/** Label chips "k=v". */
export function labelChips(labels, onRemove) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return h('span', { class: 'muted', text: '—' });
  return h('span', { class: 'chips' }, entries.map(([k, v]) =>
    h('span', { class: 'chip' }, h('span', { text: `${k}=${v}` }),
      onRemove && h('button', {
        class: 'chip-x', type: 'button', title: `Remove label ${k}`, 'aria-label': `Remove label ${k}`,
        text: '×', on: { click: () => onRemove(k) },
      }))));
}

/** Parses "a=1, b=2" or "a=1 b=2" into {a: "1", b: "2"}; throws on a bad pair. */
export function parseLabels(text) {
  const out = {};
  for (const part of String(text || '').split(/[\s,]+/).filter(Boolean)) {
    const i = part.indexOf('=');
    if (i <= 0) throw new Error(`label "${part}" is not KEY=VALUE`);
    out[part.slice(0, i)] = part.slice(i + 1);
  }
  return out;
}

// ------------------------------------------------------------------ markdown

let purifyReady = false;

function setupPurify() {
  const P = window.DOMPurify;
  // Links from agent output open in a new tab without access to this page.
  P.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A' && node.hasAttribute('href')) {
      node.setAttribute('rel', 'noopener noreferrer nofollow');
      node.setAttribute('target', '_blank');
    }
  });
  // Images other than inline data: URIs would load from wherever the agent
  // pointed (tracking, or a 404 here). Their src is dropped before the
  // fragment is imported into this document (which would start the load);
  // renderMarkdown then shows them as text.
  P.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName !== 'IMG') return;
    const src = node.getAttribute('src') || '';
    if (/^data:image\/(png|gif|jpe?g|webp);/i.test(src)) return;
    node.removeAttribute('src');
    node.setAttribute('data-blocked-src', src);
  });
  purifyReady = true;
}

/**
 * Renders untrusted markdown into a sanitized fragment inside
 * `<div class="md">`. Raw HTML in the text is parsed by marked and then
 * cleaned by DOMPurify (no scripts, event handlers, `javascript:` URLs,
 * styles or forms). Falls back to plain text if the libraries are missing.
 */
export function renderMarkdown(text) {
  const box = h('div', { class: 'md' });
  const src = String(text ?? '');
  if (!window.marked || !window.DOMPurify) {
    box.append(h('pre', { class: 'plain', text: src }));
    return box;
  }
  if (!purifyReady) setupPurify();
  const html = window.marked.parse(src, { gfm: true, breaks: true, async: false });
  const frag = window.DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'option', 'dialog', 'svg', 'math'],
    FORBID_ATTR: ['style', 'srcset', 'action', 'formaction'],
    SANITIZE_NAMED_PROPS: true,
    // No data-* from agents: the page's own code reads data-* attributes
    // (rows, keyboard navigation).
    ALLOW_DATA_ATTR: false,
  });
  for (const img of frag.querySelectorAll('img[data-blocked-src]')) {
    const src = img.getAttribute('data-blocked-src');
    img.replaceWith(h('span', { class: 'blocked-img', title: 'Remote image not loaded',
      text: `[${img.getAttribute('alt') || 'image'}${src ? `: ${src}` : ''}]` }));
  }
  box.append(frag);
  return box;
}

// -------------------------------------------------------------------- banner

const bannerEl = () => document.getElementById('banner');

/**
 * Shows a message in the banner at the top. `kind` is 'error' or 'info';
 * `err` may be an ApiError (kind, message, hint, status) or any Error.
 * The same text is shown once. Info messages go away after 8 s.
 */
export function showMessage(err, kind = 'error', extra = null) {
  const box = bannerEl();
  const message = err?.message || String(err);
  const key = `${kind}:${message}`;
  for (const old of box.children) if (old.dataset.key === key) old.remove();
  const parts = [];
  if (err?.status) parts.push(h('span', { class: 'muted', text: `HTTP ${err.status}` }));
  if (err?.kind) parts.push(h('code', { text: err.kind }));
  const msg = h('div', { class: `msg msg-${kind}`, role: kind === 'error' ? 'alert' : 'status', dataset: { key, at: String(Date.now()) } },
    h('div', { class: 'msg-body' },
      h('div', {}, h('strong', { text: kind === 'error' ? 'Error: ' : '' }), message, ' ', parts),
      err?.hint && h('div', { class: 'hint' }, 'Hint: ', h('code', { text: err.hint })),
      extra),
    h('button', { type: 'button', class: 'msg-x', 'aria-label': 'Dismiss', text: '×', on: { click: () => msg.remove() } }));
  box.append(msg);
  if (kind === 'info') setTimeout(() => msg.remove(), 8000);
  return msg;
}

export const showError = (err, extra) => showMessage(err, 'error', extra);
export const showInfo = (text, extra) => showMessage({ message: text }, 'info', extra);

/**
 * On navigation: removes the messages about the page left (errors, and
 * notes older than a moment; a note just made is about the page opening,
 * such as "Forked into ...").
 */
export function clearErrors() {
  const now = Date.now();
  for (const m of [...bannerEl().querySelectorAll('.msg')]) {
    if (m.classList.contains('msg-error') || now - Number(m.dataset.at) > 1500) m.remove();
  }
}

/** A "Loading…" paragraph. */
export const loading = (what = 'Loading…') => h('p', { class: 'muted loading', text: what });

/** Runs `fn` with `button` disabled, so a double click does not post twice. */
export async function busy(button, fn) {
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    return await fn();
  } finally {
    button.disabled = false;
    button.removeAttribute('aria-busy');
  }
}
