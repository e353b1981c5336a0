// podgate console: the cluster graph from the Graph API's `/graph` WebSocket
// (subprotocol gitlab-agent-graph-api), opened by the browser through the proxy to
// kas as GitLab's frontend opens it: the `_gitlab_kas` session cookie, with the
// agent id and CSRF token as query parameters (a browser cannot set headers on a
// WebSocket upgrade). Where to connect comes in the page URL's fragment:
//   #graph=ws://host/-/kubernetes-agent/k8s-proxy/graph&agent=1&session=…&csrf=…
// `session` is set as the `_gitlab_kas` cookie (GitLab sets it at sign-in).
//
// Layout: one block per namespace (cluster-scoped objects in their own), blocks
// in rows, vertices in a grid inside each block ordered by kind then name.
// Canvas drawing; wheel zooms at the pointer, drag pans, a click selects a vertex
// and highlights its arcs. Arcs whose destination is missing (`e`) are dashed.
'use strict';

window.podgateConsole = window.podgateConsole || {};

(() => {
  // glab's request without flags (`constructWatchRequest`): core, apps, batch and
  // namespaced RBAC, every namespace but kube-system.
  const REQUEST = {
    queries: [
      "group == '' && version == 'v1' && (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])",
      "group == 'apps' && version == 'v1' && (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])",
      "group == 'batch' && version == 'v1' && (resource in ['jobs', 'cronjobs'])",
      "group == 'rbac.authorization.k8s.io' && version == 'v1' && !(resource in ['clusterrolebindings', 'clusterroles'])",
    ].map((e) => ({ include: { resource_selector_expression: e } })),
    namespaces: { object_selector_expression: "name != 'kube-system'" },
  };
  const CELL = 16;
  const HEADER = 20;
  const GAP = 24;
  const ROW_WIDTH = 1800;
  const RADIUS = 5;
  const ARC_COLOR = { or: '#8a93a6', r: '#3557c4', t: '#8e44ad' };
  const PALETTE = ['#3557c4', '#1a7f37', '#c77700', '#8e44ad', '#00838f', '#c62828', '#5d4037', '#ad1457', '#2e7d32', '#455a64', '#6a1b9a', '#ef6c00'];

  const $ = (id) => document.getElementById(id);
  const G = {
    vertices: new Map(), // key -> {vx, o, x, y}
    arcs: new Map(), // "s|d|t" -> {s, d, t, a}
    deleted: new Map(), // key -> Date.now() of its dvx (the last 1000)
    warnings: [],
    error: null,
    connected: false,
    messages: 0,
    // Sessions that ended, and how the last one did (shown in the stats line).
    closes: 0,
    lastClose: null,
    selected: null,
  };
  window.podgateConsole.graph = G;

  const key = (vx) => `${vx.g || ''}/${vx.v}/${vx.r}/${vx.ns || ''}/${vx.n}`;
  G.key = key;
  const kindOf = (vx) => (vx.g ? `${vx.r}.${vx.g}` : vx.r);
  // Colours by kind, assigned in name order (the same kinds get the same colours
  // whatever order they arrived in).
  let colors = new Map();
  const color = (kind) => colors.get(kind) || '#8a93a6';

  let view = { scale: 0.5, tx: 10, ty: 10 };
  let dirtyLayout = true;
  let dirtyDraw = true;
  let blocks = [];
  // Zoomed or panned by hand: layouts stop refitting the view until `fit`.
  let userMoved = false;

  const canvas = $('graph-canvas');
  const ctx = canvas.getContext('2d');
  const nsSelect = $('graph-ns');
  const kindSelect = $('graph-kind');
  const find = $('graph-find');

  const visible = (v) =>
    (!nsSelect.value || (v.vx.ns || '(cluster)') === nsSelect.value) &&
    (!kindSelect.value || kindOf(v.vx) === kindSelect.value);

  function apply(msg) {
    G.messages += 1;
    for (const a of msg.actions || []) {
      if (a.svx) {
        const k = key(a.svx.vx);
        const old = G.vertices.get(k);
        G.vertices.set(k, { vx: a.svx.vx, o: a.svx.o, j: a.svx.j, x: old ? old.x : 0, y: old ? old.y : 0 });
        if (!old) dirtyLayout = true;
      } else if (a.dvx) {
        const k = key(a.dvx.vx);
        if (G.vertices.delete(k)) {
          G.deleted.set(k, Date.now());
          if (G.deleted.size > 1000) G.deleted.delete(G.deleted.keys().next().value);
          if (G.selected === k) G.selected = null;
          dirtyLayout = true;
        }
      } else if (a.sarc) {
        const s = a.sarc;
        G.arcs.set(`${key(s.s)}|${key(s.d)}|${s.t}`, { s: key(s.s), d: key(s.d), t: s.t, a: s.a || {} });
      } else if (a.darc) {
        const s = a.darc;
        G.arcs.delete(`${key(s.s)}|${key(s.d)}|${s.t}`);
      }
    }
    for (const w of msg.warnings || []) {
      G.warnings.push(w);
      if (G.warnings.length > 50) G.warnings.shift();
      const li = document.createElement('li');
      li.textContent = `${w.t}: ${w.m}`;
      $('graph-warnings').append(li);
      while ($('graph-warnings').children.length > 50) $('graph-warnings').firstChild.remove();
    }
    if (msg.error) {
      G.error = msg.error;
    }
    dirtyDraw = true;
    stats();
  }

  function stats() {
    let shown = 0;
    for (const v of G.vertices.values()) if (visible(v)) shown += 1;
    const parts = [`${G.vertices.size} vertices`, `${G.arcs.size} arcs`];
    if (shown !== G.vertices.size) parts.push(`${shown} shown`);
    if (G.warnings.length) parts.push(`${G.warnings.length} warnings`);
    if (!G.connected) parts.push(G.error ? `closed: ${G.error.code_string || G.error.code} ${G.error.reason}` : 'not connected');
    $('graph-stats').textContent = parts.join(' · ');
  }

  function refreshFilters() {
    const fillSelect = (sel, values) => {
      const cur = sel.value;
      const want = ['', ...values];
      const have = [...sel.options].map((o) => o.value);
      if (want.length === have.length && want.every((v, i) => v === have[i])) return;
      sel.replaceChildren(...want.map((v) => {
        const o = document.createElement('option');
        o.value = v;
        o.textContent = v || 'all';
        return o;
      }));
      sel.value = want.includes(cur) ? cur : '';
    };
    const ns = new Set();
    const kinds = new Set();
    for (const v of G.vertices.values()) {
      ns.add(v.vx.ns || '(cluster)');
      kinds.add(kindOf(v.vx));
    }
    fillSelect(nsSelect, [...ns].sort());
    const sorted = [...kinds].sort();
    fillSelect(kindSelect, sorted);
    const next = new Map(sorted.map((k, i) => [k, PALETTE[i % PALETTE.length]]));
    if (next.size !== colors.size || sorted.some((k) => colors.get(k) !== next.get(k))) {
      colors = next;
      $('graph-kinds').replaceChildren(...sorted.map((k) => {
        const span = document.createElement('span');
        const swatch = document.createElement('i');
        swatch.style.backgroundColor = next.get(k);
        span.append(swatch, k);
        return span;
      }));
    }
  }

  function layout() {
    const byNs = new Map();
    for (const [k, v] of G.vertices) {
      if (!visible(v)) continue;
      const ns = v.vx.ns || '(cluster)';
      if (!byNs.has(ns)) byNs.set(ns, []);
      byNs.get(ns).push([k, v]);
    }
    // Each namespace's block, then rows as wide as makes the whole about the
    // canvas's shape.
    const sized = [...byNs.keys()].sort().map((ns) => {
      const items = byNs.get(ns);
      items.sort(([ka, a], [kb, b]) => {
        const x1 = kindOf(a.vx);
        const x2 = kindOf(b.vx);
        return x1 < x2 ? -1 : x1 > x2 ? 1 : ka < kb ? -1 : ka > kb ? 1 : 0;
      });
      const cols = Math.max(4, Math.ceil(Math.sqrt(items.length * 1.6)));
      return { ns, items, cols, w: cols * CELL, h: HEADER + Math.ceil(items.length / cols) * CELL };
    });
    const area = sized.reduce((a, b) => a + (b.w + GAP) * (b.h + GAP), 0);
    const aspect = canvas.width / Math.max(canvas.height, 1);
    const rowWidth = Math.max(...sized.map((b) => b.w), Math.sqrt(area * aspect) * 1.05);
    blocks = [];
    let x = 0;
    let y = 0;
    let rowHeight = 0;
    for (const { ns, items, cols, w, h } of sized) {
      if (x > 0 && x + w > rowWidth) {
        x = 0;
        y += rowHeight + GAP;
        rowHeight = 0;
      }
      items.forEach(([, v], i) => {
        v.x = x + (i % cols) * CELL + CELL / 2;
        v.y = y + HEADER + Math.floor(i / cols) * CELL + CELL / 2;
      });
      blocks.push({ ns, x, y, w, h, n: items.length });
      x += w + GAP;
      rowHeight = Math.max(rowHeight, h);
    }
    dirtyLayout = false;
    dirtyDraw = true;
  }

  function fit() {
    if (!blocks.length) return;
    let maxX = 0;
    let maxY = 0;
    for (const b of blocks) {
      maxX = Math.max(maxX, b.x + b.w);
      maxY = Math.max(maxY, b.y + b.h);
    }
    const s = Math.min(canvas.width / (maxX + 20), canvas.height / (maxY + 20));
    view = { scale: Math.min(Math.max(s, 0.03), 4), tx: 10, ty: 10 };
    userMoved = false;
    dirtyDraw = true;
  }

  function resize() {
    const r = canvas.getBoundingClientRect();
    const w = Math.max(200, Math.round(r.width));
    const h = Math.max(200, Math.round(r.height));
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
      dirtyLayout = true;
    }
  }

  function draw() {
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.setTransform(view.scale, 0, 0, view.scale, view.tx, view.ty);
    ctx.font = '12px system-ui, sans-serif';
    for (const b of blocks) {
      ctx.strokeStyle = '#dde1e8';
      ctx.lineWidth = 1 / view.scale;
      ctx.strokeRect(b.x - 2, b.y, b.w + 4, b.h + 2);
      if (view.scale > 0.25) {
        ctx.fillStyle = '#6b7385';
        let label = `${b.ns} (${b.n})`;
        while (label.length > 2 && ctx.measureText(label).width > b.w + 4) label = `${label.slice(0, -2)}…`;
        ctx.fillText(label, b.x, b.y + 13);
      }
    }
    const sel = G.selected;
    const needle = find.value.trim();
    for (const arc of G.arcs.values()) {
      const s = G.vertices.get(arc.s);
      const d = G.vertices.get(arc.d);
      if (!s || !visible(s)) continue;
      const mine = sel && (arc.s === sel || arc.d === sel);
      if (sel && !mine) continue;
      // A missing destination (`e`): a short dashed stub from the source.
      const dx = d && visible(d) ? d.x : s.x + CELL * 0.8;
      const dy = d && visible(d) ? d.y : s.y - CELL * 0.8;
      ctx.strokeStyle = arc.a.e ? '#c62828' : ARC_COLOR[arc.t] || '#8a93a6';
      ctx.lineWidth = (mine ? 2.5 : 1) / Math.max(view.scale, 0.3);
      ctx.setLineDash(arc.a.e ? [4 / view.scale, 3 / view.scale] : []);
      ctx.globalAlpha = mine ? 1 : 0.45;
      ctx.beginPath();
      ctx.moveTo(s.x, s.y);
      ctx.lineTo(dx, dy);
      ctx.stroke();
    }
    ctx.setLineDash([]);
    ctx.globalAlpha = 1;
    for (const [k, v] of G.vertices) {
      if (!visible(v)) continue;
      const dim = (sel && k !== sel && !neighbour(k)) || (needle && !v.vx.n.includes(needle));
      ctx.globalAlpha = dim ? 0.2 : 1;
      ctx.fillStyle = color(kindOf(v.vx));
      ctx.beginPath();
      ctx.arc(v.x, v.y, k === sel ? RADIUS * 1.6 : RADIUS, 0, Math.PI * 2);
      ctx.fill();
    }
    ctx.globalAlpha = 1;
    dirtyDraw = false;
  }

  let neighbours = new Set();
  function neighbour(k) {
    return neighbours.has(k);
  }

  function select(k) {
    G.selected = k && G.vertices.has(k) ? k : null;
    neighbours = new Set();
    const info = $('graph-info');
    if (!G.selected) {
      const p = document.createElement('p');
      p.className = 'muted';
      p.textContent = 'Click a vertex to see its arcs.';
      info.replaceChildren(p);
      dirtyDraw = true;
      return;
    }
    const v = G.vertices.get(G.selected);
    const out = [];
    const inc = [];
    for (const arc of G.arcs.values()) {
      if (arc.s === G.selected) {
        out.push(arc);
        neighbours.add(arc.d);
      }
      if (arc.d === G.selected) {
        inc.push(arc);
        neighbours.add(arc.s);
      }
    }
    const h = document.createElement('h3');
    h.textContent = `${kindOf(v.vx)} ${v.vx.ns ? `${v.vx.ns}/` : ''}${v.vx.n}`;
    const list = (title, arcs, end) => {
      const p = document.createElement('p');
      p.textContent = `${title} (${arcs.length})`;
      const ul = document.createElement('ul');
      for (const a of arcs) {
        const li = document.createElement('li');
        const flags = Object.keys(a.a).filter((f) => a.a[f]).join(',');
        li.textContent = `${a.t}${flags ? ` [${flags}]` : ''} ${a[end]}`;
        ul.append(li);
      }
      return [p, ul];
    };
    info.replaceChildren(h, ...list('arcs out', out, 'd'), ...list('arcs in', inc, 's'));
    dirtyDraw = true;
  }
  G.select = select;

  function frame() {
    resize();
    if (dirtyLayout) {
      refreshFilters();
      layout();
      if (!userMoved) fit();
      if (G.selected) select(G.selected);
    }
    if (dirtyDraw) {
      const t0 = performance.now();
      draw();
      G.drawMs = performance.now() - t0;
    }
    requestAnimationFrame(frame);
  }

  // Pointer: wheel zoom at the pointer, drag to pan, click to select.
  let drag = null;
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    const px = e.clientX - r.left;
    const py = e.clientY - r.top;
    const f = Math.exp(-e.deltaY * 0.0015);
    const s = Math.min(Math.max(view.scale * f, 0.03), 8);
    view.tx = px - ((px - view.tx) * s) / view.scale;
    view.ty = py - ((py - view.ty) * s) / view.scale;
    view.scale = s;
    userMoved = true;
    dirtyDraw = true;
  }, { passive: false });
  canvas.addEventListener('mousedown', (e) => {
    drag = { x: e.clientX, y: e.clientY, tx: view.tx, ty: view.ty, moved: false };
  });
  window.addEventListener('mousemove', (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) {
      drag.moved = true;
      userMoved = true;
    }
    view.tx = drag.tx + dx;
    view.ty = drag.ty + dy;
    dirtyDraw = true;
  });
  window.addEventListener('mouseup', (e) => {
    if (drag && !drag.moved) {
      const r = canvas.getBoundingClientRect();
      const wx = (e.clientX - r.left - view.tx) / view.scale;
      const wy = (e.clientY - r.top - view.ty) / view.scale;
      let best = null;
      let bestD = (RADIUS * 2) ** 2;
      for (const [k, v] of G.vertices) {
        if (!visible(v)) continue;
        const d = (v.x - wx) ** 2 + (v.y - wy) ** 2;
        if (d < bestD) {
          best = k;
          bestD = d;
        }
      }
      select(best);
    }
    drag = null;
  });
  for (const el of [nsSelect, kindSelect]) {
    el.addEventListener('change', () => {
      dirtyLayout = true;
      userMoved = false;
      stats();
    });
  }
  find.addEventListener('input', () => { dirtyDraw = true; });
  $('graph-fit').addEventListener('click', fit);

  function connect() {
    const p = new URLSearchParams(location.hash.slice(1));
    const url = p.get('graph');
    if (!url || !p.get('agent')) {
      $('graph-stats').textContent = 'not configured: open the console with #graph=<ws url>&agent=<id>&session=…&csrf=… (podgate up prints it)';
      return;
    }
    if (p.get('session')) {
      document.cookie = `_gitlab_kas=${encodeURIComponent(p.get('session'))}; path=/; SameSite=Strict`;
    }
    const u = new URL(url);
    u.searchParams.set('gitlab-agent-id', p.get('agent'));
    if (p.get('csrf')) u.searchParams.set('gitlab-csrf-token', p.get('csrf'));
    const ws = new WebSocket(u.toString(), ['gitlab-agent-graph-api']);
    ws.onopen = () => {
      // A new session sends the whole graph again.
      G.vertices.clear();
      G.arcs.clear();
      G.error = null;
      G.connected = true;
      dirtyLayout = true;
      ws.send(JSON.stringify(REQUEST));
      stats();
    };
    ws.onmessage = (e) => {
      try {
        apply(JSON.parse(e.data));
      } catch (err) {
        G.error = { code_string: 'bad message', reason: err.message };
      }
    };
    ws.onclose = (e) => {
      G.connected = false;
      G.closes += 1;
      G.lastClose = { code: e.code, reason: e.reason, at: Date.now() };
      if (!G.error && e.code !== 1000) G.error = { code: e.code, reason: e.reason || 'connection closed' };
      stats();
      setTimeout(connect, 2000);
    };
  }

  connect();
  requestAnimationFrame(frame);
})();
