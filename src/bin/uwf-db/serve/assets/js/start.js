// Start a run: POST /api/threads, then open the new thread.
import { api, healthz } from './api.js';
import { busy, h, loading, parseLabels, replace, showError } from './ui.js';

export async function startView(main, _params, query) {
  const root = h('section', { class: 'page' }, h('h1', { text: 'Start a run' }), loading());
  replace(main, root);
  const [wf, health] = await Promise.all([api('/api/workflows'), healthz().catch(() => ({}))]);
  const workflows = wf.workflows || [];

  const wfSel = h('select', { name: 'workflow', id: 'start-workflow', required: true },
    workflows.map((w) => h('option', { value: w.name, text: w.name })));
  if (query.get('workflow')) wfSel.value = query.get('workflow');
  const prompt = h('textarea', { name: 'prompt', id: 'start-prompt', rows: '5', required: true, placeholder: 'The task' });
  const labels = h('input', { name: 'labels', id: 'start-labels', type: 'text', placeholder: 'team=cli ticket=42', autocomplete: 'off' });
  // No choice sent means the server's `default` agent.
  const agentSel = h('select', { name: 'agent', id: 'start-agent' },
    (health.agents || []).map((a) => h('option', { value: a, text: a, selected: a === 'default' })));
  const drive = h('input', { type: 'checkbox', name: 'drive', id: 'start-drive', checked: true });
  const submit = h('button', { type: 'submit', class: 'primary', text: 'Start', disabled: !!health.read_only || !workflows.length });

  const field = (label, forId, input, help) => h('div', { class: 'field' },
    h('label', { for: forId, text: label }), input, help && h('p', { class: 'help', text: help }));
  const form = h('form', { class: 'start-form' },
    field('Workflow', 'start-workflow', wfSel),
    field('Prompt', 'start-prompt', prompt),
    field('Labels', 'start-labels', labels, 'KEY=VALUE pairs, separated by spaces or commas (optional)'),
    field('Agent', 'start-agent', agentSel, 'One of the agents the server was started with'),
    h('div', { class: 'field check' }, drive, h('label', { for: 'start-drive', text: ' Drive it now (the server runs its steps until it ends or waits for a human)' })),
    h('div', { class: 'row' }, submit));

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    let parsed;
    try {
      parsed = parseLabels(labels.value);
    } catch (e) {
      showError(e);
      labels.focus();
      return;
    }
    await busy(submit, async () => {
      try {
        const r = await api('/api/threads', {
          body: { workflow: wfSel.value, prompt: prompt.value, labels: parsed, agent: agentSel.value || null, drive: drive.checked },
        });
        // Started and driven: {agent, thread: ThreadSummary}; only started: {thread: ID, ...}.
        const id = typeof r.thread === 'string' ? r.thread : r.thread?.thread;
        window.location.hash = `#/t/${id}`;
      } catch (e) {
        showError(e);
      }
    });
  });

  replace(root, h('h1', { text: 'Start a run' }),
    health.read_only && h('p', { class: 'callout callout-error', text: 'The server is read-only: it cannot start runs.' }),
    !workflows.length && h('p', { class: 'callout' }, 'No workflows registered: ', h('code', { text: 'uwf-db workflow add FILE.yaml' })),
    form);
  prompt.focus();
}
