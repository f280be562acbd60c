// Workflows: the list, and one workflow's roles, graph and definition.
// The graph is laid out here (a small layered layout, no library): layers by
// breadth-first distance from $START, order within a layer by the mean
// position of the nodes above (two sweeps), forward edges as curves
// downwards, edges back up (loops such as "rejected") as arcs on the right.
import { api, seg } from './api.js';
import { h, loading, replace, shortHash } from './ui.js';

export async function workflowsView(main) {
  const root = h('section', { class: 'page' }, h('h1', { text: 'Workflows' }), loading());
  replace(main, root);
  const r = await api('/api/workflows');
  const list = r.workflows || [];
  const descs = new Map(); // name -> its description cell, filled in below
  replace(root, h('h1', { text: 'Workflows' }),
    list.length
      ? h('table', { class: 'plain-table workflows' },
        h('thead', {}, h('tr', {}, ['Name', 'Description', 'Hash', ''].map((c) => h('th', { scope: 'col', text: c })))),
        h('tbody', {}, list.map((w) => h('tr', { 'data-row': '', tabindex: '0', 'data-href': `#/w/${seg(w.name)}` },
          h('td', {}, h('a', { href: `#/w/${seg(w.name)}`, text: w.name, tabindex: '-1' })),
          (() => { const td = h('td', { class: 'muted desc' }); descs.set(w.name, td); return td; })(),
          h('td', {}, h('code', { title: w.hash, text: shortHash(w.hash) })),
          h('td', { class: 'wf-links' }, h('a', { href: `#/threads?workflow=${seg(w.name)}`, text: 'threads', tabindex: '-1' }), ' · ',
            h('a', { href: `#/start?workflow=${seg(w.name)}`, text: 'start a run', tabindex: '-1' }))))))
      : h('p', { class: 'empty' }, 'No workflows yet: ', h('code', { text: 'uwf-db workflow add FILE.yaml' })));
  root.querySelector('tbody')?.addEventListener('click', (ev) => {
    const tr = ev.target.closest('tr[data-href]');
    if (tr && !ev.target.closest('a')) window.location.hash = tr.dataset.href;
  });
  // Descriptions need one request each: only for a list of reasonable size.
  if (list.length <= 100) {
    for (const w of list) {
      api(`/api/workflows/${seg(w.name)}`).then((d) => {
        descs.get(w.name).textContent = d.definition?.description || '';
      }).catch(() => {});
    }
  }
}

export async function workflowView(main, [name]) {
  const root = h('section', { class: 'page workflow' }, h('h1', { text: name }), loading());
  replace(main, root);
  const w = await api(`/api/workflows/${seg(name)}`);
  const def = w.definition || {};
  const graph = w.graph && w.graph.nodes ? w.graph : deriveGraph(def);

  // Roles in the order the graph reaches them (the definition's map is sorted by name).
  const seenOrder = [];
  for (const e of graph.edges) for (const id of [e.from, e.to]) if (!seenOrder.includes(id)) seenOrder.push(id);
  const rank = (r) => { const i = seenOrder.indexOf(r); return i < 0 ? Infinity : i; };
  const roles = Object.entries(def.roles || {}).sort((x, y) => rank(x[0]) - rank(y[0])).map(([rname, r]) => h('article', { class: 'role-card' },
    h('h3', { class: 'mono', text: rname }),
    r.description && h('p', { text: r.description }),
    h('dl', { class: 'kv-list' },
      [['Goal', r.goal], ['Capabilities', (r.capabilities || []).join(', ')], ['Procedure', r.procedure],
        ['Output', r.output], ['Child workflow', r.workflow]]
        .filter(([, v]) => v)
        .map(([k, v]) => h('div', {}, h('dt', { text: k }), h('dd', { text: v })))),
    r.frontmatter && h('details', {}, h('summary', { text: 'Frontmatter schema' }),
      h('pre', { class: 'code', text: JSON.stringify(r.frontmatter, null, 2) }))));

  // The server may send the YAML it registered; else the parsed definition.
  const source = typeof w.yaml === 'string' ? w.yaml : typeof w.source === 'string' ? w.source : JSON.stringify(def, null, 2);

  replace(root,
    h('div', { class: 'page-head' }, h('h1', { text: w.name || name }),
      h('span', { class: 'muted' }, h('a', { href: `#/threads?workflow=${seg(w.name || name)}`, text: 'threads' }), ' · ',
        h('a', { href: `#/start?workflow=${seg(w.name || name)}`, text: 'start a run' }))),
    def.description && h('p', { class: 'lead', text: def.description }),
    h('p', { class: 'muted' }, `maxRounds ${def.max_rounds ?? '—'} · hash `, h('code', { title: w.hash, text: shortHash(w.hash) }),
      def.compact ? ` · compacts every ${def.compact.every} steps` : ''),
    h('h2', { text: 'Graph' }),
    h('figure', { class: 'graph-box' }, drawGraph(graph),
      h('figcaption', {}, h('details', {}, h('summary', { text: 'Edges as text' }),
        h('ul', { class: 'edge-list' }, graph.edges.map((e) => h('li', { class: 'mono', text: `${e.from} —${e.status}→ ${e.to}` })))))),
    h('h2', { text: 'Roles' }), h('div', { class: 'roles' }, roles),
    h('h2', { text: 'Definition' }), h('pre', { class: 'code definition', text: source }));
}

/** The graph from a definition, when the server does not send one. */
export function deriveGraph(def) {
  const nodes = [{ id: '$START', kind: 'start' }];
  const ids = new Set(['$START']);
  const add = (id, kind) => { if (!ids.has(id)) { ids.add(id); nodes.push({ id, kind }); } };
  for (const [r, role] of Object.entries(def.roles || {})) add(r, role.workflow ? 'workflow' : 'role');
  const edges = [];
  for (const [from, byStatus] of Object.entries(def.graph || {})) {
    for (const [status, edge] of Object.entries(byStatus)) {
      add(edge.role, edge.role === '$END' ? 'end' : edge.role === '$SUSPEND' ? 'suspend' : 'role');
      edges.push({ from, to: edge.role, status });
    }
  }
  return { nodes, edges };
}

// ---------------------------------------------------------------- layout

const FONT = '13px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
const NODE_H = 34;
const LAYER_GAP = 78; // vertical space between layers (edge labels sit in it)
const NODE_GAP = 44;
const MARGIN = 16;

let measureCtx = null;
function textWidth(text, font = FONT) {
  measureCtx = measureCtx || document.createElement('canvas').getContext('2d');
  measureCtx.font = font;
  return measureCtx.measureText(text).width;
}

const kindOf = (n) => n.kind || (n.id === '$START' ? 'start' : n.id === '$END' ? 'end' : n.id === '$SUSPEND' ? 'suspend' : 'role');
const nodeLabel = (n) => ({ start: 'start', end: 'end', suspend: 'wait for human' }[kindOf(n)] || n.id);

/** Lays the graph out: returns positioned nodes and edge groups. Exported for reading, not reuse. */
export function layout(graph) {
  const nodes = new Map(graph.nodes.map((n) => [n.id, { ...n, kind: kindOf(n) }]));
  for (const e of graph.edges) {
    for (const id of [e.from, e.to]) if (!nodes.has(id)) nodes.set(id, { id, kind: kindOf({ id }) });
  }
  const out = new Map([...nodes.keys()].map((id) => [id, []]));
  for (const e of graph.edges) out.get(e.from).push(e.to);

  // Layers: distance from the start; unreachable nodes go last.
  const start = [...nodes.values()].find((n) => n.kind === 'start')?.id ?? [...nodes.keys()][0];
  const layerOf = new Map([[start, 0]]);
  const order = [start];
  for (let i = 0; i < order.length; i += 1) {
    for (const v of out.get(order[i])) {
      if (!layerOf.has(v)) { layerOf.set(v, layerOf.get(order[i]) + 1); order.push(v); }
    }
  }
  let maxLayer = Math.max(...layerOf.values());
  for (const id of nodes.keys()) if (!layerOf.has(id)) { layerOf.set(id, maxLayer + 1); order.push(id); }
  // Ends sit at the bottom, below every role.
  maxLayer = Math.max(...layerOf.values());
  const ends = [...nodes.values()].filter((n) => n.kind === 'end');
  const nonEndMax = Math.max(0, ...[...layerOf].filter(([id]) => nodes.get(id).kind !== 'end').map(([, l]) => l));
  for (const n of ends) layerOf.set(n.id, Math.max(layerOf.get(n.id), nonEndMax + 1));
  maxLayer = Math.max(...layerOf.values());

  const layers = Array.from({ length: maxLayer + 1 }, () => []);
  for (const id of order) layers[layerOf.get(id)].push(id);

  // Barycenter ordering: each node under the mean index of its parents.
  const preds = new Map([...nodes.keys()].map((id) => [id, []]));
  for (const e of graph.edges) if (layerOf.get(e.to) > layerOf.get(e.from)) preds.get(e.to).push(e.from);
  for (let sweep = 0; sweep < 2; sweep += 1) {
    for (let l = 1; l < layers.length; l += 1) {
      const idx = new Map(layers[l - 1].map((id, i) => [id, i]));
      const bary = (id) => {
        const ps = preds.get(id).filter((p) => idx.has(p));
        return ps.length ? ps.reduce((s, p) => s + idx.get(p), 0) / ps.length : Infinity;
      };
      layers[l] = layers[l].map((id, i) => [id, bary(id), i]).sort((a, b) => (a[1] - b[1]) || (a[2] - b[2])).map((x) => x[0]);
    }
  }

  // Sizes and positions: each layer centred.
  for (const n of nodes.values()) n.w = Math.max(64, Math.ceil(textWidth(nodeLabel(n))) + 28);
  const layerW = layers.map((ids) => ids.reduce((s, id) => s + nodes.get(id).w, 0) + NODE_GAP * Math.max(0, ids.length - 1));
  const innerW = Math.max(...layerW, 120);
  layers.forEach((ids, l) => {
    let x = MARGIN + (innerW - layerW[l]) / 2;
    for (const id of ids) {
      const n = nodes.get(id);
      n.x = x; n.y = MARGIN + l * (NODE_H + LAYER_GAP); n.h = NODE_H; n.layer = l;
      x += n.w + NODE_GAP;
    }
  });

  // Edges: one per (from, to), its statuses joined ("_" is unconditional).
  const groups = new Map();
  for (const e of graph.edges) {
    const k = `${e.from}\u0000${e.to}`;
    if (!groups.has(k)) groups.set(k, { from: e.from, to: e.to, statuses: [] });
    if (e.status && e.status !== '_') groups.get(k).statuses.push(e.status);
  }
  return { nodes, layers, groups: [...groups.values()], innerW, height: MARGIN * 2 + layers.length * NODE_H + (layers.length - 1) * LAYER_GAP };
}

/** A cubic Bézier coordinate at t. */
const cubic = (p0, p1, p2, p3, t) => {
  const m = 1 - t;
  return m * m * m * p0 + 3 * m * m * t * p1 + 3 * m * t * t * p2 + t * t * t * p3;
};

/** Draws the graph as an SVG element (classes only: the CSP forbids style attributes). */
export function drawGraph(graph) {
  const L = layout(graph);
  const S = (tag, attrs, ...kids) => h(`svg:${tag}`, attrs, ...kids);
  const edgesG = S('g', { class: 'edges' });
  const labelsG = S('g', { class: 'edge-labels' });
  const nodesG = S('g', { class: 'nodes' });
  let right = MARGIN + L.innerW; // widest x used, grows with back arcs
  let backIndex = 0;

  // Out-edges of a node leave from points spread along its bottom.
  const outDown = new Map();
  for (const g of L.groups) {
    if (L.nodes.get(g.to).layer > L.nodes.get(g.from).layer) {
      if (!outDown.has(g.from)) outDown.set(g.from, []);
      outDown.get(g.from).push(g);
    }
  }
  for (const list of outDown.values()) list.sort((a, b) => L.nodes.get(a.to).x - L.nodes.get(b.to).x);

  const boxes = []; // label boxes drawn so far, which back arcs keep clear of
  const labelW = (text) => (text ? textWidth(text, '12px system-ui, sans-serif') + 10 : 0);
  const label = (text, x, y) => {
    if (!text) return;
    const w = labelW(text);
    right = Math.max(right, x + w / 2);
    boxes.push({ left: x - w / 2, right: x + w / 2, top: y - 9, bottom: y + 9 });
    labelsG.append(S('rect', { class: 'edge-label-bg', x: x - w / 2, y: y - 9, width: w, height: 18, rx: 4 }),
      S('text', { class: 'edge-label', x, y: y + 4, 'text-anchor': 'middle' }, text));
  };

  // Downward edges and loops first, so the back arcs know their labels.
  const isBack = (g) => g.from !== g.to && L.nodes.get(g.to).layer <= L.nodes.get(g.from).layer;
  const ordered = [...L.groups.filter((g) => !isBack(g)), ...L.groups.filter(isBack)];

  for (const g of ordered) {
    const a = L.nodes.get(g.from);
    const b = L.nodes.get(g.to);
    const text = g.statuses.join(', ');
    let d;
    let lx;
    let ly;
    if (a === b) {
      // A loop on itself, on the right.
      const x = a.x + a.w;
      const cy = a.y + a.h / 2;
      d = `M ${x} ${cy - 8} C ${x + 46} ${cy - 34}, ${x + 46} ${cy + 34}, ${x} ${cy + 8}`;
      lx = x + 46; ly = cy;
    } else if (b.layer > a.layer) {
      const siblings = outDown.get(a.id);
      const i = siblings.indexOf(g);
      const x1 = a.x + a.w / 2 + (i - (siblings.length - 1) / 2) * Math.min(24, a.w / (siblings.length + 1));
      const y1 = a.y + a.h;
      const x2 = b.x + b.w / 2;
      const y2 = b.y;
      const dy = (y2 - y1) / 2;
      d = `M ${x1} ${y1} C ${x1} ${y1 + dy}, ${x2} ${y2 - dy}, ${x2} ${y2}`;
      // Label at the middle; on an edge over several layers, near its
      // start, in the gap below the source (clear of the nodes it passes).
      const t = 0.5 / (b.layer - a.layer);
      lx = cubic(x1, x1, x2, x2, t);
      ly = cubic(y1, y1 + dy, y2 - dy, y2, t);
    } else {
      // Back up (or across): an arc out of the right side of both nodes,
      // clear of everything in the layers it passes.
      const lo = Math.min(a.layer, b.layer);
      const hi = Math.max(a.layer, b.layer);
      let clear = 0;
      for (let l = lo; l <= hi; l += 1) for (const id of L.layers[l]) { const n = L.nodes.get(id); clear = Math.max(clear, n.x + n.w); }
      const x1 = a.x + a.w; const y1 = a.y + a.h / 2 + 6;
      const x2 = b.x + b.w; const y2 = b.y + b.h / 2 - 6;
      const top = Math.min(y1, y2); const bottom = Math.max(y1, y2);
      for (const bx of boxes) if (bx.bottom > top && bx.top < bottom) clear = Math.max(clear, bx.right);
      // The arc's label sits on its outermost point (0.125·(x1+x2) + 0.75·xr)
      // and must start right of everything cleared.
      const w = labelW(text);
      const xr = Math.max(clear + 36 + 26 * backIndex, (clear + 8 + w / 2 - 0.125 * (x1 + x2)) / 0.75);
      backIndex += 1;
      d = `M ${x1} ${y1} C ${xr} ${y1}, ${xr} ${y2}, ${x2} ${y2}`;
      lx = 0.125 * (x1 + x2) + 0.75 * xr; ly = (y1 + y2) / 2;
      right = Math.max(right, xr);
    }
    edgesG.append(S('path', { class: 'edge', d, 'marker-end': 'url(#uwf-arrow)' }, S('title', {}, `${g.from} → ${g.to}${text ? `: ${text}` : ''}`)));
    label(text, lx, ly);
  }

  for (const n of L.nodes.values()) {
    const g = S('g', { class: `node node-${n.kind}`, 'data-node': n.id },
      S('title', {}, n.kind === 'role' || n.kind === 'workflow' ? `${n.kind} ${n.id}` : n.id));
    const rx = n.kind === 'start' || n.kind === 'end' ? n.h / 2 : 6;
    g.append(S('rect', { x: n.x, y: n.y, width: n.w, height: n.h, rx }));
    if (n.kind === 'workflow' || n.kind === 'end') {
      g.append(S('rect', { class: 'inner', x: n.x + 3, y: n.y + 3, width: n.w - 6, height: n.h - 6, rx: Math.max(0, rx - 3) }));
    }
    g.append(S('text', { x: n.x + n.w / 2, y: n.y + n.h / 2 + 4.5, 'text-anchor': 'middle' }, nodeLabel(n)));
    nodesG.append(g);
  }

  const width = Math.ceil(right + MARGIN);
  const height = Math.ceil(L.height);
  // Shown a little larger than laid out; CSS shrinks it to fit narrow screens.
  return S('svg', {
    class: 'graph', viewBox: `0 0 ${width} ${height}`, width: Math.round(width * 1.2), height: Math.round(height * 1.2), role: 'img',
    'aria-label': `Workflow graph: ${L.nodes.size} nodes, ${graph.edges.length} edges`,
  },
  S('defs', {}, S('marker', { id: 'uwf-arrow', viewBox: '0 0 10 10', refX: '9', refY: '5', markerWidth: '8', markerHeight: '8', orient: 'auto-start-reverse' },
    S('path', { class: 'arrowhead', d: 'M 0 0 L 10 5 L 0 10 z' }))),
  edgesG, nodesG, labelsG);
}
