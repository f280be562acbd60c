// The HTTP API: JSON fetches with the bearer token, errors as ApiError, and
// Server-Sent Event streams.
import { h, showError } from './ui.js';

const TOKEN_KEY = 'uwf-db.token';

/** An API failure: the server's `{"error": {kind, message, hint}}` and the HTTP status. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = body?.error || {};
    super(e.message || (status ? `HTTP ${status}` : 'request failed'));
    this.status = status;
    this.kind = e.kind || null;
    this.hint = e.hint || null;
  }
}

// A `?token=` in the page's URL is kept for the tab's session and removed
// from the address bar (so it is not bookmarked or shared by accident).
(function takeTokenFromUrl() {
  const url = new URL(window.location.href);
  const t = url.searchParams.get('token');
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  url.searchParams.delete('token');
  history.replaceState(null, '', url.pathname + url.search + url.hash);
})();

export const token = () => sessionStorage.getItem(TOKEN_KEY);

let tokenPromptShown = false;

/** Asks for a token in the banner after a 401; reloads the view once set. */
function askForToken() {
  if (tokenPromptShown) return;
  tokenPromptShown = true;
  const input = h('input', { type: 'password', autocomplete: 'off', 'aria-label': 'API token', placeholder: 'token' });
  const form = h('form', { class: 'inline-form' }, input, h('button', { type: 'submit', text: 'Use token' }));
  const msg = showError({ message: 'The server wants its token (the --token it was started with): paste it here, or open the page as /?token=TOKEN.', status: 401, kind: 'unauthorized' }, form);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!input.value.trim()) return;
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    tokenPromptShown = false;
    msg.remove();
    window.dispatchEvent(new HashChangeEvent('hashchange'));
  });
  input.focus();
}

/**
 * Fetches `path` (under the same origin) and returns its JSON.
 * `body` (an object) makes it a JSON POST. Throws ApiError.
 */
export async function api(path, { method, body, signal } = {}) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method: method || (body !== undefined ? 'POST' : 'GET'), headers, signal };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw Object.assign(new ApiError(0, { error: { kind: 'unavailable', message: `cannot reach the server (${e.message})` } }), { cause: e });
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = res.ok ? text : { error: { message: text.slice(0, 300) } };
    }
  }
  if (!res.ok) {
    if (res.status === 401) askForToken();
    throw new ApiError(res.status, data);
  }
  return data;
}

/** Builds `path?k=v&...`, skipping empty values; arrays repeat the key. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === '' || v === false) continue;
    for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** Encodes one path segment (ids, names). */
export const seg = encodeURIComponent;

// ------------------------------------------------------------------- events

// Open streams, for the header's live indicator.
const streams = new Set();

function updateLive() {
  const el = document.getElementById('live');
  if (!el) return;
  const open = [...streams].filter((s) => s.readyState === EventSource.OPEN).length;
  const state = streams.size === 0 ? 'idle' : open === streams.size ? 'live' : 'reconnecting';
  el.textContent = state === 'live' ? 'live' : state === 'reconnecting' ? 'reconnecting…' : 'not live';
  el.className = `live live-${state}`;
}

/**
 * Subscribes to an SSE stream. `handlers` maps event names (`thread`,
 * `step`) to functions of the parsed JSON data and the MessageEvent.
 * EventSource cannot send headers, so the token goes in the query. It
 * reconnects by itself and sends Last-Event-ID. Returns a close function.
 */
export function subscribe(path, handlers) {
  const t = token();
  const url = t ? withQuery(path, { token: t }) : path;
  const src = new EventSource(url);
  streams.add(src);
  src.addEventListener('open', updateLive);
  src.addEventListener('error', (ev) => {
    // A lost connection is a plain Event (EventSource reconnects); an
    // `event: error` from the server carries the API error and ends the
    // stream, which would only fail again: show it and stop.
    if (typeof ev.data === 'string') {
      let body = null;
      try { body = JSON.parse(ev.data); } catch { /* not JSON */ }
      showError(new ApiError(0, body || { error: { message: ev.data } }));
      src.close();
      streams.delete(src);
    }
    updateLive();
  });
  for (const [name, fn] of Object.entries(handlers)) {
    src.addEventListener(name, (ev) => {
      let data;
      try {
        data = JSON.parse(ev.data);
      } catch {
        return; // not JSON: a keep-alive or a server bug; nothing to show
      }
      fn(data, ev);
    });
  }
  updateLive();
  return () => {
    src.close();
    streams.delete(src);
    updateLive();
  };
}

// --------------------------------------------------------------- healthz

let health = null;

/** `/api/healthz`, fetched once (agents, read_only, version). */
export async function healthz() {
  if (!health) health = api('/api/healthz').catch((e) => { health = null; throw e; });
  return health;
}
