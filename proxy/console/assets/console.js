// podgate console: traffic, kas and workspaces from the admin listener's
// /console/events (server-sent events, each every source's /metrics samples at one
// instant). Rates are differences between successive events.
'use strict';

window.podgateConsole = window.podgateConsole || {};

(() => {
  // The Pod simulator's endpoints that are not runner traffic (as `podgate up`'s
  // table counts): probes, scrapes, the control API, the current user, the pages
  // of its namespaces, and GitLab's internal API for kas and agents.
  const NOT_RUNNER = new Set(['health', 'metrics', 'control', 'user', 'namespace_page', 'organization_page']);
  const AGENT_PREFIXES = ['k8s_', 'ws_', 'agentw_'];
  // The proxy's outcome labels, grouped as an operator reads them.
  const ROUTED = new Set(['routable', 'session', 'pinned']);
  const TO_DEFAULT = new Set(['default', 'no_token', 'unroutable', 'invalid_to_legacy']);
  // Forwards the path rules decided: the Cell that claimed the namespace or the
  // organization the path names.
  const BY_PATH = new Set(['path_route', 'path_organization']);
  const HISTORY = 120;

  const C = window.podgateConsole;
  C.events = 0;
  // Times the event stream broke (EventSource then reconnects by itself).
  C.disconnects = 0;
  C.traffic = { pods: {}, sources: {}, outcomes: {} };
  let prev = null;
  const history = [];

  const $ = (id) => document.getElementById(id);

  function sum(src, metric, pred) {
    let t = 0;
    if (!src) return t;
    for (const [n, l, v] of src.samples) {
      if (n === metric && (!pred || pred(l))) t += v ?? 0;
    }
    return t;
  }

  function group(src, metric, key, pred) {
    const out = new Map();
    if (!src) return out;
    for (const [n, l, v] of src.samples) {
      if (n !== metric || (pred && !pred(l))) continue;
      const k = typeof key === 'function' ? key(l) : l[key];
      if (k === undefined || k === null) continue;
      out.set(k, (out.get(k) ?? 0) + (v ?? 0));
    }
    return out;
  }

  function has(src, metric) {
    return !!src && src.samples.some(([n]) => n === metric);
  }

  // Per second between two counter readings (a reset counts from 0).
  function rate(now, before, dt) {
    if (before === undefined || dt <= 0) return null;
    return (now >= before ? now - before : now) / dt;
  }

  const fmt = (n) => (n === null || n === undefined ? '–' : Math.round(n).toLocaleString('en-US'));
  const fmtRate = (n) => (n === null || n === undefined ? '–' : n < 10 ? n.toFixed(1) : Math.round(n).toLocaleString('en-US'));

  function cell(text, attrs) {
    const td = document.createElement('td');
    td.textContent = text;
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') td.className = v;
      else td.dataset[k] = v;
    }
    return td;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows.map(({ cells, data }) => {
      const tr = document.createElement('tr');
      for (const [k, v] of Object.entries(data || {})) tr.dataset[k] = v;
      tr.append(...cells);
      return tr;
    }));
  }

  function isRunnerTraffic(l) {
    const e = l.endpoint;
    return e !== undefined && !NOT_RUNNER.has(e) && !AGENT_PREFIXES.some((p) => e.startsWith(p));
  }

  function traffic(by, dt) {
    const proxy = by.get('proxy');
    const pods = new Map(); // pod id -> row
    const row = (id) => {
      if (!pods.has(id)) pods.set(id, { id, proxied: 0, byPath: 0, answered: null, edge: 0, inPod: null, misroutes: null });
      return pods.get(id);
    };
    for (const [pod, n] of group(proxy, 'podgate_proxy_requests_total', 'pod')) {
      if (pod !== '0') row(pod).proxied = n;
    }
    for (const [pod, n] of group(proxy, 'podgate_proxy_requests_total', 'pod', (l) => BY_PATH.has(l.outcome))) {
      if (pod !== '0') row(pod).byPath = n;
    }
    for (const [pod, n] of group(proxy, 'podgate_proxy_edge_polls_held', 'pod')) row(pod).edge = n;
    for (const src of by.values()) {
      if (!has(src, 'podsim_requests_total')) continue;
      const pod = src.samples.find(([n]) => n === 'podsim_requests_total')[1].pod;
      if (pod === undefined) continue;
      const r = row(pod);
      r.answered = sum(src, 'podsim_requests_total', isRunnerTraffic);
      r.inPod = sum(src, 'podsim_workhorse_register_open', (l) => l.state === 'watching');
      r.misroutes = sum(src, 'misrouted_requests_total');
    }
    const before = prev && prev.traffic;
    const ids = [...pods.keys()].sort((a, b) => Number(a) - Number(b));
    const out = { pods: {}, sources: {}, outcomes: {}, total: 0, totalRate: null };
    fill($('pods').tBodies[0], ids.map((id) => {
      const r = pods.get(id);
      r.rate = rate(r.proxied, before && before.pods[id] && before.pods[id].proxied, dt);
      out.pods[id] = r;
      return {
        data: { pod: id },
        cells: [
          cell(id),
          cell(fmtRate(r.rate), { k: 'rate' }),
          cell(fmt(r.proxied), { k: 'proxied' }),
          cell(fmt(r.byPath), { k: 'by_path' }),
          cell(fmt(r.answered), { k: 'answered' }),
          cell(fmt(r.edge), { k: 'edge' }),
          cell(fmt(r.inPod), { k: 'in_pod' }),
          cell(fmt(r.misroutes), { k: 'misroutes', class: r.misroutes > 0 ? 'bad' : '' }),
        ],
      };
    }));
    const table = (id, counts, kind) => {
      const keys = [...counts.keys()].sort();
      fill($(id).tBodies[0], keys.map((k) => {
        const n = counts.get(k);
        const r = rate(n, before && before[kind][k], dt);
        out[kind][k] = n;
        return {
          data: { key: k },
          cells: [cell(k), cell(fmtRate(r), { k: 'rate' }), cell(fmt(n), { k: 'count' })],
        };
      }));
    };
    table('sources', group(proxy, 'podgate_proxy_requests_total', 'source'), 'sources');
    const outcomes = group(proxy, 'podgate_proxy_requests_total', (l) => {
      if (l.status === '401') return '401 unauthorized';
      if (l.status === '503') return '503 unavailable';
      if (ROUTED.has(l.outcome)) return 'routed by token';
      if (BY_PATH.has(l.outcome)) return 'routed by path';
      if (TO_DEFAULT.has(l.outcome)) return 'default Pod';
      return `other (${l.outcome})`;
    });
    let misroutes = 0;
    for (const r of pods.values()) misroutes += r.misroutes ?? 0;
    outcomes.set('misroutes (the Pods counted)', misroutes);
    table('outcomes', outcomes, 'outcomes');
    out.total = sum(proxy, 'podgate_proxy_requests_total');
    out.totalRate = rate(out.total, before && before.total, dt);
    $('total-rate').textContent = fmtRate(out.totalRate);
    if (out.totalRate !== null) {
      history.push(out.totalRate);
      if (history.length > HISTORY) history.shift();
      spark();
    }
    return out;
  }

  function spark() {
    const c = $('spark');
    const g = c.getContext('2d');
    g.clearRect(0, 0, c.width, c.height);
    const max = Math.max(1, ...history);
    g.strokeStyle = '#3557c4';
    g.lineWidth = 1.5;
    g.beginPath();
    history.forEach((v, i) => {
      const x = (i / (HISTORY - 1)) * (c.width - 2) + 1;
      const y = c.height - 2 - (v / max) * (c.height - 6);
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
  }

  function kas(by, dt) {
    const src = [...by.values()].find((s) => has(s, 'podgate_kas_connected_agents'));
    const out = { routed: {} };
    const set = (id, v) => { $(id).textContent = fmt(v); };
    if (!src) {
      for (const id of ['kas-agents', 'kas-idle', 'kas-busy', 'kas-waiting', 'kas-timeouts']) $(id).textContent = '–';
      fill($('routed').tBodies[0], []);
      return out;
    }
    out.agents = sum(src, 'podgate_kas_connected_agents');
    out.idle = sum(src, 'podgate_kas_tunnels', (l) => l.state === 'idle');
    out.busy = sum(src, 'podgate_kas_tunnels', (l) => l.state === 'busy');
    out.waiting = sum(src, 'podgate_kas_routing_waiting');
    out.timeouts = sum(src, 'podgate_kas_routing_timeouts_total');
    set('kas-agents', out.agents);
    set('kas-idle', out.idle);
    set('kas-busy', out.busy);
    set('kas-waiting', out.waiting);
    set('kas-timeouts', out.timeouts);
    const before = prev && prev.kas;
    const routed = group(src, 'podgate_kas_routed_total', 'outcome');
    fill($('routed').tBodies[0], [...routed.keys()].sort().map((k) => {
      const n = routed.get(k);
      out.routed[k] = n;
      return {
        data: { key: k },
        cells: [cell(k), cell(fmtRate(rate(n, before && before.routed[k], dt))), cell(fmt(n), { k: 'count' })],
      };
    }));
    return out;
  }

  // Per Pod: its kas's Job Router (a source labelled `pod`), the proxy's runner
  // requests open to that kas, and the runners' fallbacks to REST (gitlab-runner's
  // `gitlab_runner_job_router_fallbacks_total`, here with a `pod` label).
  function jobRouter(by, dt) {
    const pods = new Map();
    const row = (id) => {
      if (!pods.has(id)) pods.set(id, { id, calls: null, held: null, woken: null, empty: null, jobs: null, open: 0, fallbacks: null });
      return pods.get(id);
    };
    for (const src of by.values()) {
      if (!has(src, 'podgate_kas_job_router_calls_total')) continue;
      const pod = src.samples.find(([n]) => n === 'podgate_kas_job_router_calls_total')[1].pod;
      if (pod === undefined) continue;
      const r = row(pod);
      r.calls = sum(src, 'podgate_kas_job_router_calls_total');
      r.empty = sum(src, 'podgate_kas_job_router_calls_total', (l) => l.result === 'empty');
      r.jobs = sum(src, 'podgate_kas_job_router_calls_total', (l) => l.result === 'job');
      r.held = sum(src, 'podgate_kas_job_router_held');
      r.woken = sum(src, 'podgate_kas_job_router_holds_total', (l) => l.outcome === 'changed');
    }
    const proxy = by.get('proxy');
    for (const [pod, n] of group(proxy, 'podgate_proxy_kas_open', 'pod', (l) => l.client === 'runner')) {
      if (pods.has(pod)) row(pod).open = n;
    }
    for (const src of by.values()) {
      for (const [pod, n] of group(src, 'gitlab_runner_job_router_fallbacks_total', 'pod')) {
        const r = row(pod);
        r.fallbacks = (r.fallbacks ?? 0) + n;
      }
    }
    const before = prev && prev.jobRouter;
    const ids = [...pods.keys()].sort((a, b) => Number(a) - Number(b));
    const out = {};
    fill($('jr').tBodies[0], ids.map((id) => {
      const r = pods.get(id);
      r.rate = r.calls === null ? null : rate(r.calls, before && before[id] && before[id].calls, dt);
      out[id] = r;
      return {
        data: { pod: id },
        cells: [
          cell(id),
          cell(fmtRate(r.rate), { k: 'rate' }),
          cell(fmt(r.calls), { k: 'calls' }),
          cell(fmt(r.held), { k: 'held' }),
          cell(fmt(r.woken), { k: 'woken' }),
          cell(fmt(r.empty), { k: 'empty' }),
          cell(fmt(r.jobs), { k: 'jobs' }),
          cell(fmt(r.open), { k: 'open' }),
          cell(fmt(r.fallbacks), { k: 'fallbacks' }),
        ],
      };
    }));
    $('jr-empty').hidden = ids.length > 0;
    return out;
  }

  function workspaces(by) {
    const rows = [];
    for (const src of by.values()) {
      for (const [n, l, v] of src.samples) {
        if (n === 'podsim_workspace_info' && v === 1) rows.push(l);
      }
    }
    rows.sort((a, b) => (a.workspace < b.workspace ? -1 : a.workspace > b.workspace ? 1 : 0));
    fill($('ws').tBodies[0], rows.map((l) => ({
      data: { workspace: l.workspace },
      cells: [
        cell(l.workspace),
        cell(l.namespace),
        cell(l.desired_state, { k: 'desired' }),
        cell(l.actual_state, { k: 'actual', class: l.actual_state === l.desired_state ? 'up' : '' }),
      ],
    })));
    $('ws-empty').hidden = rows.length > 0;
    return rows;
  }

  function sources(snapshot) {
    fill($('source-table').tBodies[0], snapshot.sources.map((s) => ({
      data: { source: s.name },
      cells: [
        cell(s.name),
        cell(s.up ? 'up' : `down: ${s.error}`, { class: s.up ? 'up' : 'down' }),
        cell(fmt(s.samples.length)),
      ],
    })));
  }

  function onEvent(snapshot) {
    const by = new Map(snapshot.sources.map((s) => [s.name, s]));
    const dt = prev ? (snapshot.t - prev.t) / 1000 : 0;
    const now = { t: snapshot.t };
    now.traffic = traffic(by, dt);
    now.kas = kas(by, dt);
    now.jobRouter = jobRouter(by, dt);
    C.workspaces = workspaces(by);
    sources(snapshot);
    C.traffic = now.traffic;
    C.kas = now.kas;
    C.jobRouter = now.jobRouter;
    C.events += 1;
    C.lastEvent = snapshot.t;
    prev = now;
    $('updated').textContent = `updated ${new Date(snapshot.t).toLocaleTimeString()}`;
  }

  function connect() {
    const status = $('status');
    const es = new EventSource('events');
    es.onopen = () => {
      status.textContent = 'live';
      status.className = 'status live';
    };
    es.onmessage = (e) => {
      let snapshot;
      try {
        snapshot = JSON.parse(e.data);
      } catch (err) {
        status.textContent = `bad event: ${err.message}`;
        status.className = 'status down';
        return;
      }
      onEvent(snapshot);
    };
    // EventSource reconnects by itself (the stream's `retry:`).
    es.onerror = () => {
      C.disconnects += 1;
      status.textContent = 'disconnected, reconnecting…';
      status.className = 'status down';
    };
  }

  connect();
})();
