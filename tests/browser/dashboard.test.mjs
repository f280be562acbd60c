// The dashboard in real headless Chromium against a real `uwf-db serve`.
//
// Run through ./run.sh (it finds the binary and Chromium and installs
// playwright-core). Environment: UWF_DB (the binary, absolute), CHROMIUM
// (default /usr/bin/chromium), SCREENSHOTS (default docs/screenshots).
//
// One store and one server for the whole file; the tests run in order and
// some build on what earlier ones made (noted where they do). Every
// uncaught page error, and every console error a test did not expect,
// fails the test it happened in.
import { after, afterEach, before, beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(here, '../..');
const UWF_DB = path.resolve(REPO, process.env.UWF_DB || 'target/debug/uwf-db');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.resolve(REPO, process.env.SCREENSHOTS || 'docs/screenshots');
const TIMEOUT = 15000;

const REVIEW_AGENT = 'script:examples/review.scenario.yaml';
const PLANNER_AGENT = 'script:examples/planner.scenario.yaml';
const XSS_AGENT = 'script:tests/browser/fixtures/xss.scenario.yaml';
const ALT_AGENT = 'script:tests/browser/fixtures/review-alt.scenario.yaml';
const SLOW_AGENT = 'cmd:sh tests/browser/fixtures/slow-agent.sh';

let store;
let server; // { proc, base, log }
let browser;
const ids = {}; // threads made in `before`

// ------------------------------------------------------------------ helpers

/** Runs the CLI on the test store with --json; returns its parsed output. */
function cli(...args) {
  const out = execFileSync(UWF_DB, ['--store', store, '--json', ...args], { cwd: REPO, encoding: 'utf8' });
  return out.trim() ? JSON.parse(out) : null;
}

/** The CLI in the background (for runs the page should see live). */
function cliAsync(...args) {
  return promisify(execFile)(UWF_DB, ['--store', store, '--json', ...args], { cwd: REPO, encoding: 'utf8' });
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Starts `uwf-db serve` and waits until /api/healthz answers. */
async function startServer(extra = []) {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const proc = spawn(UWF_DB, ['--store', store, 'serve', '--bind', `127.0.0.1:${port}`,
    '--agent', `default=${PLANNER_AGENT}`, '--agent', `review=${REVIEW_AGENT}`, '--agent', `slow=${SLOW_AGENT}`,
    ...extra], { cwd: REPO });
  const s = { proc, base, log: '' };
  proc.stdout.on('data', (d) => { s.log += d; });
  proc.stderr.on('data', (d) => { s.log += d; });
  const deadline = Date.now() + 30000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`uwf-db serve exited with ${proc.exitCode}:\n${s.log}`);
    try {
      const headers = extra.includes('--token') ? { Authorization: `Bearer ${extra[extra.indexOf('--token') + 1]}` } : {};
      const r = await fetch(`${base}/api/healthz`, { headers });
      if (r.ok) return s;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) throw new Error(`uwf-db serve did not answer within 30 s:\n${s.log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function stopServer(s) {
  if (s && s.proc.exitCode === null) s.proc.kill('SIGTERM');
}

async function apiGet(p, base = server.base) {
  const r = await fetch(base + p);
  assert.equal(r.status, 200, `GET ${p}`);
  return r.json();
}

// Console errors a test expects (a 404 it provokes...), reset before each.
let expected = [];
const unexpected = [];
let current = '';

/**
 * The sanitizer parses hostile HTML in an inert document that shares the
 * page's CSP, so Chromium reports the handlers and styles it sees there as
 * blocked, though nothing would run; those reports come from purify.min.js.
 */
const SANITIZER_NOISE = (m) => /purify\.min\.js/.test(m.location().url || '')
  && /^(Executing inline event handler|Applying inline style)/.test(m.text());

async function newPage({ width = 1280, height = 800, scheme = 'light' } = {}) {
  const context = await browser.newContext({ viewport: { width, height }, colorScheme: scheme, reducedMotion: 'reduce' });
  const page = await context.newPage();
  page.dialogs = [];
  page.on('dialog', (d) => {
    page.dialogs.push(`${d.type()}: ${d.message()}`);
    // confirm() is how the dashboard asks before cancelling; anything else
    // (an alert a payload raised) is refused and recorded.
    if (d.type() === 'confirm') d.accept(); else d.dismiss();
  });
  page.on('pageerror', (e) => unexpected.push(`${current}: uncaught ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error' || SANITIZER_NOISE(m)) return;
    const text = `${m.text()} (${m.location().url || '?'})`;
    if (!expected.some((re) => re.test(text))) unexpected.push(`${current}: console: ${text}`);
  });
  return page;
}

async function shot(page, name, fullPage = true) {
  await page.mouse.move(0, 0);
  await page.evaluate(() => { document.activeElement?.blur(); window.scrollTo(0, 0); });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage });
}

/** Waits until `fn(arg)` is truthy in the page; fails with `what`. */
async function until(page, what, fn, arg) {
  try {
    return await page.waitForFunction(fn, arg, { timeout: TIMEOUT, polling: 100 });
  } catch (e) {
    throw new Error(`timed out waiting for: ${what}\n${e.message.split('\n')[0]}`);
  }
}

const rowIds = (page) => page.$$eval('tbody tr[data-thread]', (trs) => trs.map((tr) => tr.dataset.thread));
const titleStatus = (page) => page.textContent('.title-row .badge');
const stepSeqs = (page) => page.$$eval('.timeline details.step', (ds) => ds.map((d) => Number(d.dataset.seq)));

async function openStep(page, seq) {
  const step = page.locator(`details.step[data-seq="${seq}"]`).first();
  await step.locator('summary').click();
  await step.locator('.step-body .reply').waitFor({ timeout: TIMEOUT });
  return step;
}

// ------------------------------------------------------------------ set-up

before(async () => {
  store = mkdtempSync(path.join(tmpdir(), 'uwf-browser-'));
  mkdirSync(SHOTS, { recursive: true });
  for (const f of ['examples/review.yaml', 'examples/planner.yaml', 'tests/browser/fixtures/xss.yaml']) cli('workflow', 'add', f);
  ids.review = cli('run', 'review', '-p', 'Add a --json flag', '--agent', REVIEW_AGENT, '--label', 'team=cli').thread;
  ids.planner = cli('run', 'planner', '-p', 'Export the data', '--agent', PLANNER_AGENT).thread;
  ids.idle = cli('thread', 'start', 'review', '-p', 'A run to cancel', '--agent', REVIEW_AGENT, '--label', 'team=ops').thread;
  ids.xss = cli('run', 'xss', '-p', 'Task <img src=x onerror="window.__xss=1"> **bold task**', '--agent', XSS_AGENT,
    '--label', 'note=<b onmouseover=window.__xss=1>x</b>').thread;
  server = await startServer();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // Chromium's sandbox cannot start as root (containers, CI).
    args: process.getuid && process.getuid() === 0 ? ['--no-sandbox'] : [],
  });
});

after(async () => {
  await browser?.close();
  stopServer(server);
  if (store) rmSync(store, { recursive: true, force: true });
});

beforeEach((t) => {
  current = t.name;
  expected = [];
});

afterEach(() => {
  const mine = unexpected.splice(0);
  assert.deepEqual(mine, [], 'page errors or unexpected console errors');
});

// ------------------------------------------------------------------- tests

test('the thread list shows every thread, newest first; j, k and Enter open one', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/threads`);
  await page.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
  const api = await apiGet('/api/threads?limit=50');
  assert.deepEqual(await rowIds(page), api.threads.map((t) => t.thread));
  assert.equal((await rowIds(page)).length, 4);
  // The xss thread's label is shown as text.
  const chip = await page.textContent(`tr[data-thread="${ids.xss}"] .chip`);
  assert.equal(chip.trim(), 'note=<b onmouseover=window.__xss=1>x</b>');

  await page.keyboard.press('j');
  await page.keyboard.press('j');
  await page.keyboard.press('k');
  const focused = await page.evaluate(() => document.activeElement.dataset.thread);
  assert.equal(focused, api.threads[0].thread);
  await page.keyboard.press('Enter');
  await until(page, 'the first thread to open', (id) => location.hash === `#/t/${id}` && document.querySelector('h1')?.textContent.includes(id), focused);
  await page.context().close();
});

test('filters: by status, kept in the URL; by label', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/threads`);
  await page.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
  await page.selectOption('select[name="status"]', 'suspended');
  await until(page, 'only the suspended thread', (id) => {
    const rows = [...document.querySelectorAll('tbody tr[data-thread]')];
    return rows.length === 1 && rows[0].dataset.thread === id;
  }, ids.planner);
  assert.match(page.url(), /#\/threads\?status=suspended$/);
  await page.reload();
  await until(page, 'the filter to survive a reload', (id) => {
    const rows = [...document.querySelectorAll('tbody tr[data-thread]')];
    return document.querySelector('select[name="status"]').value === 'suspended' && rows.length === 1 && rows[0].dataset.thread === id;
  }, ids.planner);

  await page.goto(`${server.base}/#/threads?label=team=ops`);
  await until(page, 'only the thread labelled team=ops', (id) => {
    const rows = [...document.querySelectorAll('tbody tr[data-thread]')];
    return rows.length === 1 && rows[0].dataset.thread === id;
  }, ids.idle);
  await page.fill('input[name="label"]', 'team=nobody');
  await page.press('input[name="label"]', 'Enter');
  await until(page, 'the empty state', () => !document.querySelector('.empty').hidden && !document.querySelector('tbody tr'));
  await page.context().close();
});

test('threads that another process starts appear in the list live, without a reload', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/threads`);
  await page.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
  await until(page, 'the event stream to be open', () => document.querySelector('#live')?.classList.contains('live-live'));
  const before = new Set(await rowIds(page));
  await page.evaluate(() => { window.__noReload = 42; });

  await cliAsync('batch', 'review', '--agent', REVIEW_AGENT, '-n', '3', '-p', 'Live batch', '--label', 'src=batch', '--jobs', '3');
  const made = cli('thread', 'list', '--label', 'src=batch').map((t) => t.thread);
  assert.equal(made.length, 3);

  await until(page, 'the three new threads on top, completed', (want) => {
    const rows = [...document.querySelectorAll('tbody tr[data-thread]')];
    const top = rows.slice(0, 3);
    return top.length === 3 && top.every((r) => want.includes(r.dataset.thread) && r.querySelector('.badge').textContent === 'completed');
  }, made);
  assert.equal(await page.evaluate(() => window.__noReload), 42, 'the page was reloaded');
  const after = await rowIds(page);
  assert.equal(after.length, before.size + 3);
  for (const id of before) assert.ok(after.includes(id));
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, 'threads');

  const dark = await newPage({ scheme: 'dark' });
  await dark.goto(`${server.base}/#/threads`);
  await dark.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
  await shot(dark, 'threads-dark');
  await dark.context().close();
  await page.context().close();
});

test('a thread page shows the record and the steps; a step opens to its prompt and reply', async () => {
  const page = await newPage();
  // A unique prefix of the id works as in the CLI.
  await page.goto(`${server.base}/#/t/${ids.review.slice(0, 16)}`);
  await until(page, 'the full id in the title', (id) => document.querySelector('h1')?.textContent.includes(id), ids.review);
  assert.equal(await titleStatus(page), 'completed');
  // Its head is the end node: no fork there (the API would refuse it).
  assert.equal(await page.locator('button', { hasText: 'Fork at head' }).isDisabled(), true);
  assert.equal(await page.getAttribute('.facts-grid a[href^="#/w/"]', 'href'), '#/w/review');
  assert.equal((await page.textContent('.facts-grid .chip > span')).trim(), 'team=cli');
  await until(page, 'the task', () => document.querySelector('.task .md')?.textContent.includes('Add a --json flag'));
  await until(page, 'five steps', () => document.querySelectorAll('details.step').length === 5);
  assert.deepEqual(await stepSeqs(page), [5, 4, 3, 2, 1]);
  assert.equal(await page.textContent('details.step[data-seq="2"] .edge-status'), 'rejected');

  const step = await openStep(page, 2);
  assert.match(await step.locator('.prompt').textContent(), /Review the change/);
  assert.match(await step.locator('.reply').textContent(), /users will not find the flag/);
  const meta = await step.locator('table.kv').textContent();
  assert.match(meta, /reason/);
  assert.match(meta, /the README does not mention --json/);
  // The exact prompt its agent was sent, fetched when asked, as text.
  await step.locator('button.kept-show').click();
  const sent = step.locator('pre.sent-prompt');
  await sent.waitFor({ timeout: TIMEOUT });
  const text = await sent.textContent();
  assert.match(text, /Add a --json flag/, 'the task');
  assert.match(text, /Review the change/, 'the instruction');
  assert.match(text, /\$status/, 'the output format');
  await shot(page, 'thread');
  await page.context().close();

  // A phone: nothing wider than the screen.
  const phone = await newPage({ width: 390, height: 844 });
  await phone.goto(`${server.base}/#/t/${ids.review}`);
  await until(phone, 'five steps', () => document.querySelectorAll('details.step').length === 5);
  await openStep(phone, 2);
  assert.ok(await phone.evaluate(() => document.documentElement.scrollWidth <= 390), 'the thread page scrolls sideways at 390 px');
  await shot(phone, 'thread-phone');
  await phone.goto(`${server.base}/#/threads`);
  await phone.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
  assert.ok(await phone.evaluate(() => document.documentElement.scrollWidth <= 390), 'the thread list scrolls sideways at 390 px');
  await phone.context().close();
});

test('start a run from the form; it waits for a human; the resume form answers it', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/start`);
  await page.locator('#start-workflow option[value="planner"]').waitFor({ state: 'attached', timeout: TIMEOUT });
  await page.selectOption('#start-workflow', 'planner');
  await page.fill('#start-prompt', 'Export the **orders**');
  await page.fill('#start-labels', 'src=ui');
  await page.selectOption('#start-agent', 'default');
  assert.ok(await page.isChecked('#start-drive'));
  await shot(page, 'start');
  await page.click('.start-form button[type="submit"]');

  await until(page, 'the new thread page', () => /^#\/t\/[0-9A-Z]{26}$/.test(location.hash));
  const id = page.url().split('#/t/')[1];
  assert.ok(!Object.values(ids).includes(id));
  // The server drives it in the background; the page follows its events.
  await until(page, 'the thread to wait for a human', () => document.querySelector('.title-row .badge')?.textContent === 'suspended'
    && document.querySelector('.suspend-message')?.textContent.includes('Which database'));
  assert.equal((await page.textContent('.facts-grid .chip > span')).trim(), 'src=ui');
  await shot(page, 'thread-suspended');

  await page.evaluate(() => { window.__noReload = 7; });
  await page.fill('form.resume textarea', 'Use PostgreSQL');
  await page.click('form.resume button[type="submit"]');
  await until(page, 'the thread to complete', () => document.querySelector('.title-row .badge')?.textContent === 'completed');
  await until(page, 'its four steps, live', () => document.querySelectorAll('details.step').length === 4);
  assert.deepEqual(await stepSeqs(page), [4, 3, 2, 1]);
  assert.equal(await page.textContent('details.step[data-seq="3"] .role'), 'developer');
  const dev = await openStep(page, 3);
  assert.match(await dev.locator('.reply').textContent(), /Export implemented with a test/);
  const planned = await openStep(page, 2);
  assert.match(await planned.locator('.prompt').textContent(), /Use PostgreSQL/);
  assert.equal(await page.evaluate(() => window.__noReload), 7, 'the page was reloaded');
  assert.equal(cli('thread', 'show', id).status, 'completed');
  await page.context().close();
});

test('fork at a step, follow the fork live, and diff it with its origin', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/t/${ids.review}`);
  await until(page, 'five steps', () => document.querySelectorAll('details.step').length === 5);
  const step = await openStep(page, 2);
  await step.locator('button.fork-here').click();
  await until(page, 'the fork to open', (orig) => /^#\/t\/[0-9A-Z]{26}$/.test(location.hash) && !location.hash.endsWith(orig)
    && document.querySelector('h1')?.textContent.includes(location.hash.slice(4)), ids.review);
  const fork = page.url().split('#/t/')[1];
  await until(page, 'its two steps', () => document.querySelectorAll('details.step').length === 2);
  const origin = await page.getAttribute('.facts-grid a[href^="#/diff/"]', 'href');
  assert.equal(origin, `#/diff/${ids.review}/${fork}`);
  const shown = cli('thread', 'show', fork);
  assert.equal(shown.forked_from.thread, ids.review);
  assert.equal(shown.seq, 2);

  // Another process drives the fork on another branch; the page follows.
  await page.evaluate(() => { window.__noReload = 9; });
  await cliAsync('thread', 'step', fork, '--count', '10', '--agent', ALT_AGENT);
  await until(page, 'the fork to complete with five steps', () => document.querySelector('.title-row .badge')?.textContent === 'completed'
    && document.querySelectorAll('details.step').length === 5);
  assert.deepEqual(await stepSeqs(page), [5, 4, 3, 2, 1]);
  const alt = await openStep(page, 3);
  assert.match(await alt.locator('.reply').textContent(), /ALT-BRANCH/);
  assert.equal(await page.evaluate(() => window.__noReload), 9, 'the page was reloaded');

  // Compare, from the fork's page, with the original.
  await page.fill('form.compare input', ids.review);
  await page.press('form.compare input', 'Enter');
  await until(page, 'the diff', () => document.querySelector('.shared-count'));
  assert.equal(page.url().split('#')[1], `/diff/${fork}/${ids.review}`);
  assert.equal(await page.textContent('.shared-count'), '2');
  const sides = page.locator('.diff-side');
  assert.equal(await sides.count(), 2);
  assert.deepEqual(await sides.nth(0).locator('details.step').evaluateAll((ds) => ds.map((d) => Number(d.dataset.seq))), [3, 4, 5]);
  assert.deepEqual(await sides.nth(1).locator('details.step').evaluateAll((ds) => ds.map((d) => Number(d.dataset.seq))), [3, 4, 5]);
  await sides.nth(0).locator('details.step[data-seq="3"] summary').click();
  await sides.nth(1).locator('details.step[data-seq="3"] summary').click();
  assert.match(await sides.nth(0).locator('details.step[data-seq="3"] .reply').textContent(), /ALT-BRANCH/);
  assert.match(await sides.nth(1).locator('details.step[data-seq="3"] .reply').textContent(), /Documented --json in the README/);
  await shot(page, 'diff');
  await page.context().close();
});

test('hostile agent output is shown as text and runs nothing', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/t/${ids.xss}`);
  await until(page, 'three steps', () => document.querySelectorAll('details.step').length === 3);
  for (const seq of [1, 2, 3]) await openStep(page, seq);
  // The kept prompts too: the hostile task is in each, shown as text.
  for (const seq of [1, 2]) {
    const step = page.locator(`details.step[data-seq="${seq}"]`);
    await step.locator('button.kept-show').click();
    await step.locator('pre.sent-prompt').waitFor({ timeout: TIMEOUT });
    assert.match(await step.locator('pre.sent-prompt').textContent(), /<img src=x onerror="window.__xss=1">/);
  }
  await until(page, 'the task', () => document.querySelector('.task .md'));
  await until(page, 'the safe part of the reply', () => document.querySelector('details.step[data-seq="1"] .reply')?.textContent.includes('SAFE-MARKER'));

  // What should still render, renders.
  const reply = page.locator('details.step[data-seq="1"] .reply .md');
  assert.equal(await reply.locator('strong').first().textContent(), 'bold');
  assert.equal(await reply.locator('h1').textContent(), 'Hostile reply');
  assert.equal(await page.textContent('.task .md strong'), 'bold task');
  // The frontmatter value and the label are shown as the text they are.
  assert.match(await page.textContent('details.step[data-seq="1"] table.kv'), /<img src=x onerror="window.__xss=1"><script>window.__xss=1<\/script>/);
  assert.equal((await page.textContent('.facts-grid .chip > span')).trim(), 'note=<b onmouseover=window.__xss=1>x</b>');
  // The checker's prompt had the payload through {{{note}}}.
  assert.match(await page.textContent('details.step[data-seq="2"] .prompt'), /Check this note:/);

  // Nothing dangerous reached the document.
  const found = await page.evaluate(() => {
    const bad = [];
    const md = [...document.querySelectorAll('.md')];
    for (const box of md) {
      for (const el of box.querySelectorAll('*')) {
        if (['SCRIPT', 'IFRAME', 'OBJECT', 'EMBED', 'FORM', 'BUTTON', 'INPUT', 'SVG', 'STYLE', 'IMG'].includes(el.tagName.toUpperCase())) bad.push(`<${el.tagName}>`);
        for (const a of el.attributes) {
          if (/^on/i.test(a.name) || a.name === 'style' || a.name === 'srcdoc') bad.push(`${el.tagName}[${a.name}]`);
          if (/^\s*(javascript|vbscript|data):/i.test(a.value) && ['href', 'src', 'action', 'formaction', 'xlink:href'].includes(a.name)) bad.push(`${el.tagName}[${a.name}=${a.value}]`);
        }
      }
    }
    for (const el of document.querySelectorAll('*')) {
      for (const a of el.attributes) if (/^on/i.test(a.name)) bad.push(`page ${el.tagName}[${a.name}]`);
    }
    return { bad, boxes: md.length };
  });
  assert.ok(found.boxes >= 7, `expected the rendered markdown boxes, got ${found.boxes}`);
  assert.deepEqual(found.bad, []);

  // Poke at what is left: hover and click everything in the replies.
  const hrefBefore = page.url();
  for (const loc of await page.locator('.md a, .md div, .md b').all()) {
    await loc.hover();
    await loc.click({ modifiers: [], noWaitAfter: true }).catch(() => {});
  }
  await page.waitForTimeout(300);
  assert.equal(await page.evaluate(() => window.__xss), undefined, 'a payload ran');
  assert.equal(page.url(), hrefBefore);
  assert.deepEqual(page.dialogs, []);
  await page.context().close();
});

test('workflows: the list, and each graph laid out without overlaps', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/workflows`);
  await until(page, 'three workflows', () => document.querySelectorAll('tbody tr[data-href]').length === 3);
  assert.deepEqual(await page.$$eval('tbody tr td:first-child', (tds) => tds.map((td) => td.textContent)), ['planner', 'review', 'xss']);
  await until(page, 'the descriptions', () => [...document.querySelectorAll('td.desc')].every((td) => td.textContent));
  await shot(page, 'workflows');

  for (const [name, nodes, labels] of [
    ['review', ['$START', 'developer', 'reviewer', '$END'], ['approved', 'rejected', 'review_needed']],
    ['planner', ['$START', 'planner', 'developer', '$SUSPEND', '$END'], ['done', 'need_info', 'planned']],
  ]) {
    await page.goto(`${server.base}/#/w/${name}`);
    await until(page, `the ${name} graph`, () => document.querySelector('svg.graph'));
    const g = await page.evaluate(() => {
      const svg = document.querySelector('svg.graph');
      const box = (el) => { const b = el.getBBox(); return { x: b.x, y: b.y, w: b.width, h: b.height }; };
      const nodes = [...svg.querySelectorAll('.node')].map((n) => ({ id: n.dataset.node, ...box(n.querySelector('rect')) }));
      const labels = [...svg.querySelectorAll('.edge-label')].map((t) => t.textContent).sort();
      const boxes = [...nodes, ...[...svg.querySelectorAll('.edge-label-bg')].map((r) => ({ id: 'label', ...box(r) }))];
      const overlaps = [];
      for (let i = 0; i < boxes.length; i += 1) {
        for (let j = i + 1; j < boxes.length; j += 1) {
          const a = boxes[i]; const b = boxes[j];
          if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h) overlaps.push(`${a.id}/${b.id}`);
        }
      }
      const vb = svg.viewBox.baseVal;
      const outside = boxes.filter((b) => b.x < 0 || b.y < 0 || b.x + b.w > vb.width || b.y + b.h > vb.height).map((b) => b.id);
      return { nodes: nodes.map((n) => n.id), labels, overlaps, outside, fits: svg.getBoundingClientRect().width <= svg.parentElement.clientWidth };
    });
    assert.deepEqual([...g.nodes].sort(), [...nodes].sort(), name);
    assert.deepEqual(g.labels, labels, name);
    assert.deepEqual(g.overlaps, [], `${name}: boxes overlap`);
    assert.deepEqual(g.outside, [], `${name}: drawn outside the picture`);
    assert.ok(g.fits, `${name}: wider than its box`);
    assert.match(await page.textContent('pre.definition'), name === 'review' ? /Fix this: \{\{\{reason\}\}\}/ : /The planner asks/);
    await shot(page, name === 'review' ? 'workflow' : 'workflow-planner');
  }
  await page.context().close();
});

test('usage shows the store totals', async () => {
  const page = await newPage();
  const u = await apiGet('/api/usage');
  assert.ok(u.calls > 0 && u.input_tokens >= 1200, JSON.stringify(u));
  await page.goto(`${server.base}/#/usage`);
  await until(page, 'the totals', () => document.querySelectorAll('.stat').length === 5);
  const stats = Object.fromEntries(await page.$$eval('.stat', (els) => els.map((e) => [e.querySelector('.stat-label').textContent, e.querySelector('.stat-value').textContent])));
  assert.equal(stats['Agent calls'], u.calls.toLocaleString('en-US'));
  assert.equal(stats['Input tokens'], u.input_tokens.toLocaleString('en-US'));
  assert.equal(stats['Output tokens'], u.output_tokens.toLocaleString('en-US'));
  assert.equal(stats.Cost, '$0.01');
  await shot(page, 'usage');
  await page.context().close();
});

test('stop a running drive from its page', async () => {
  const page = await newPage();
  await page.goto(`${server.base}/#/start?workflow=review`);
  await page.locator('#start-agent option[value="slow"]').waitFor({ state: 'attached', timeout: TIMEOUT });
  assert.equal(await page.inputValue('#start-workflow'), 'review');
  await page.fill('#start-prompt', 'A run to stop');
  await page.selectOption('#start-agent', 'slow');
  await page.click('.start-form button[type="submit"]');
  await until(page, 'the new thread page', () => /^#\/t\/[0-9A-Z]{26}$/.test(location.hash));
  const id = page.url().split('#/t/')[1];
  await until(page, 'the thread to run', () => document.querySelector('.title-row .badge')?.textContent === 'running'
    && !document.querySelector('.actions button:first-child').disabled);
  await until(page, 'a first step', () => document.querySelectorAll('details.step').length >= 1);
  await page.click('.actions button:has-text("Stop")');
  await until(page, 'the drive to stop, the thread idle', () => document.querySelector('.title-row .badge')?.textContent === 'idle');
  const shown = cli('thread', 'show', id);
  assert.equal(shown.status, 'idle');
  assert.ok(shown.seq >= 1 && shown.seq < 10, `it ran on: ${shown.seq} steps`);
  await until(page, 'every step shown', (n) => document.querySelectorAll('details.step').length === n, shown.seq);
  await page.context().close();
});

test('labels: add and remove from the thread page; cancel it (after a confirm)', async () => {
  const page = await newPage();
  // The record is fetched on load, again when the event stream opens (its
  // first `thread` event), and after each action. That second answer is
  // held back until the label change's own answer has been shown: an older
  // answer arriving last must not put the old labels back (it did, once,
  // on a busy CI machine).
  const record = `${server.base}/api/threads/${ids.idle}`;
  let gets = 0;
  let heldFetched;
  const held = new Promise((r) => { heldFetched = r; });
  let release;
  const released = new Promise((r) => { release = r; });
  let heldShown;
  const heldDone = new Promise((r) => { heldShown = r; });
  await page.route((url) => url.href === record, async (route) => {
    gets += 1;
    if (gets === 2) {
      const old = await route.fetch();
      heldFetched();
      await released;
      await route.fulfill({ response: old });
      heldShown();
      return;
    }
    await route.continue();
  });
  await page.goto(`${server.base}/#/t/${ids.idle}`);
  await until(page, 'the idle thread', () => document.querySelector('.title-row .badge')?.textContent === 'idle');
  const chips = () => page.$$eval('.facts-grid .chip > span', (els) => els.map((e) => e.textContent).sort());
  assert.deepEqual(await chips(), ['team=ops']);
  await held;
  await page.fill('.labels-edit input', 'ticket=42 prio=high');
  await page.press('.labels-edit input', 'Enter');
  await until(page, 'the new labels', () => document.querySelectorAll('.facts-grid .chip').length === 3);
  release();
  await heldDone;
  await page.waitForTimeout(300);
  assert.deepEqual(await chips(), ['prio=high', 'team=ops', 'ticket=42'], 'the older answer, arriving last, was ignored');
  await page.unroute((url) => url.href === record);
  await page.click('.chip-x[aria-label="Remove label team"]');
  await until(page, 'the label removed', () => document.querySelectorAll('.facts-grid .chip').length === 2);
  assert.deepEqual(cli('thread', 'show', ids.idle).labels, { prio: 'high', ticket: '42' });

  assert.ok(await page.isDisabled('.actions button:has-text("Stop")'), 'Stop is offered with no driver');
  await page.click('.actions button.danger');
  await until(page, 'the thread to be cancelled', () => document.querySelector('.title-row .badge')?.textContent === 'cancelled');
  assert.equal(page.dialogs.length, 1);
  assert.match(page.dialogs[0], /^confirm: Cancel thread/);
  assert.equal(cli('thread', 'show', ids.idle).status, 'cancelled');
  await page.context().close();
});

test('API errors show in the banner', async () => {
  expected = [/status of 404/];
  const page = await newPage();
  await page.goto(`${server.base}/#/t/7ZZZZZZZZZZZZZZZZZZZZZZZZZ`);
  await until(page, 'the error banner', () => document.querySelector('#banner .msg-error'));
  const text = await page.textContent('#banner .msg-error');
  assert.match(text, /not_found/);
  assert.match(text, /HTTP 404/);
  // Leaving the page clears it.
  await page.goto(`${server.base}/#/start`);
  await until(page, 'the start form', () => document.querySelector('#start-labels'));
  assert.equal(await page.locator('#banner .msg-error').count(), 0);
  await page.fill('#start-prompt', 'x');
  await page.fill('#start-labels', 'not-a-pair');
  await page.click('.start-form button[type="submit"]');
  await until(page, 'the label error', () => document.querySelector('#banner .msg-error')?.textContent.includes('is not KEY=VALUE'));
  assert.match(page.url(), /#\/start$/);
  await page.context().close();
});

test('with --token: ?token= is kept for the session and sent on every request', async () => {
  expected = [/status of 401/];
  const secret = 's3cret-token-0123456789';
  const guarded = await startServer(['--token', secret]);
  try {
    const page = await newPage();
    await page.goto(`${guarded.base}/?token=${secret}#/threads`);
    await page.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
    assert.ok(!page.url().includes(secret), 'the token stays in the address bar');
    await until(page, 'the event stream (token in its URL) to be open', () => document.querySelector('#live')?.classList.contains('live-live'));
    await page.context().close();

    // Without it: the 401 asks for the token, which then works.
    const bare = await newPage();
    await bare.goto(`${guarded.base}/#/threads`);
    await until(bare, 'the token prompt', () => document.querySelector('#banner input[type="password"]'));
    await bare.fill('#banner input[type="password"]', secret);
    await bare.press('#banner input[type="password"]', 'Enter');
    await bare.locator(`tr[data-thread="${ids.review}"]`).waitFor({ timeout: TIMEOUT });
    await bare.context().close();
  } finally {
    stopServer(guarded);
  }
});
