// `uwf-db workflow show --format mermaid` drawn by Mermaid itself in
// headless Chromium: every bundled example and a workflow whose role name
// holds Mermaid's special characters must render to an SVG that shows
// each role and status (a syntax error, or a label that broke out of its
// quotes, fails). Run through ./run.sh, like dashboard.test.mjs.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(here, '../..');
const UWF_DB = path.resolve(REPO, process.env.UWF_DB || 'target/debug/uwf-db');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const MERMAID = path.join(here, 'node_modules/mermaid/dist/mermaid.min.js');

let dir;
let browser;
let page;

function uwf(...args) {
  return execFileSync(UWF_DB, ['--store', path.join(dir, 'store'), ...args], { cwd: REPO, encoding: 'utf8' });
}

/** Renders `chart` with Mermaid in the page: the SVG's visible text. */
async function render(chart) {
  return page.evaluate(async (text) => {
    const { svg } = await window.mermaid.render(`g${Math.random().toString(36).slice(2)}`, text);
    const holder = document.createElement('div');
    holder.innerHTML = svg;
    document.body.replaceChildren(holder);
    return holder.textContent.replace(/\s+/g, ' ');
  }, chart);
}

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'uwf-pictures-'));
  for (const wf of ['review', 'planner', 'ship', 'survey']) {
    uwf('workflow', 'add', `examples/${wf}.yaml`);
  }
  const odd = 'a"b|c<d>#e';
  writeFileSync(path.join(dir, 'odd.yaml'),
    `name: odd\nroles:\n  ${JSON.stringify(odd)}: { goal: x }\ngraph:\n` +
    `  $START: { _: { role: ${JSON.stringify(odd)}, prompt: p } }\n` +
    `  ${JSON.stringify(odd)}: { _: { role: $END, prompt: p } }\n`);
  uwf('workflow', 'add', path.join(dir, 'odd.yaml'));
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e));
  await page.setContent('<!doctype html><html><body></body></html>');
  await page.addScriptTag({ path: MERMAID });
  await page.evaluate(() => window.mermaid.initialize({ startOnLoad: false, securityLevel: 'strict' }));
  assert.deepEqual(errors, []);
});

after(async () => {
  await browser?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('review: every role and status drawn', async () => {
  const text = await render(uwf('workflow', 'show', 'review', '--format', 'mermaid'));
  for (const word of ['start', 'developer', 'reviewer', 'end', 'review_needed', 'approved', 'rejected']) {
    assert.ok(text.includes(word), `no '${word}' in ${text}`);
  }
});

test('planner and ship: a human to ask, a child workflow', async () => {
  const planner = await render(uwf('workflow', 'show', 'planner', '--format', 'mermaid'));
  assert.ok(planner.includes('ask a human') && planner.includes('need_info'), planner);
  const ship = await render(uwf('workflow', 'show', 'ship', '--format', 'mermaid'));
  assert.ok(ship.includes('⇢ review'), ship);
});

test('survey: a fan-out role says what it runs', async () => {
  const text = await render(uwf('workflow', 'show', 'survey', '--format', 'mermaid'));
  assert.ok(text.includes('foreach parts ⇢ review (≤ 4 at once)'), text);
});

test('a role name with quotes, pipes and angle brackets stays its label', async () => {
  const text = await render(uwf('workflow', 'show', 'odd', '--format', 'mermaid'));
  assert.ok(text.includes('a"b|c<d>#e'), text);
});
