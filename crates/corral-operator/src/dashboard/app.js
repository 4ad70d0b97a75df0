// The corral operator's dashboard: polls the operator's read-only API (/v1/status, /v1/nodes,
// /v1/history) every 2 s and draws it. Plain JavaScript, no library, served from the binary.
//
// The token: the TCP listener needs `Authorization: Bearer`. The page takes it from the
// address's fragment (`/dashboard#token=...`), which a browser never sends to a server, keeps
// it in this tab's sessionStorage and removes the fragment from the address bar; without one
// it asks for it. Counts are decimal strings in the API (IPv6 passes 2^53): they are read
// with BigInt and printed as given.
'use strict';

(() => {
  const POLL_MS = 2000;
  const HISTORY_LIMIT = 50;
  const TOKEN_KEY = 'corral-operator-token';
  const SVG = 'http://www.w3.org/2000/svg';

  // ---- DOM helpers (text only: nothing the API says is parsed as HTML) ----

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    return fill(node, attrs, children);
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    return fill(node, attrs, children);
  }

  function fill(node, attrs, children) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      node.setAttribute(name, value);
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(typeof child === 'string' ? document.createTextNode(child) : child);
    }
    return node;
  }

  function section(id) {
    return document.querySelector(`#${id} .body`);
  }

  // ---- numbers ----

  function big(text) {
    try {
      return /^[0-9]+$/.test(String(text)) ? BigInt(text) : 0n;
    } catch (_) {
      return 0n;
    }
  }

  // `part` of `whole` as a fraction in [0, 1], exact enough for drawing whatever the sizes.
  function share(part, whole) {
    if (whole <= 0n) return 0;
    return Number((part * 1000000n) / whole) / 1000000;
  }

  function percent(part, whole) {
    if (whole <= 0n) return '0%';
    const tenths = (part * 1000n) / whole;
    return `${tenths / 10n}.${tenths % 10n}%`;
  }

  // A decimal string with thousands separators, exact for any length.
  function count(text) {
    return String(text).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }

  function when(ms) {
    const date = new Date(Number(ms));
    if (ms === undefined || ms === null || Number.isNaN(date.getTime())) return '';
    return date.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  function ago(ms) {
    if (!Number.isFinite(Number(ms))) return 'at an unknown time';
    const seconds = Math.max(0, Math.round((Date.now() - Number(ms)) / 1000));
    if (seconds < 120) return `${seconds} s ago`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
    return `${Math.round(seconds / 3600)} h ago`;
  }

  // One colour per node: its place among the registered nodes (by name), hues a golden angle
  // apart, so neighbours differ.
  let places = new Map();

  function colour(name) {
    const place = places.has(name) ? places.get(name) : places.size;
    return `hsl(${Math.round((place * 137.508 + 190) % 360)}, 60%, 45%)`;
  }

  // ---- the token ----

  function takeToken() {
    const match = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
    if (match) {
      const token = decodeURIComponent(match[1]);
      try {
        sessionStorage.setItem(TOKEN_KEY, token);
      } catch (_) {
        // Storage refused: the token lives in this page only.
      }
      history.replaceState(null, '', location.pathname + location.search);
      return token;
    }
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (_) {
      return '';
    }
  }

  let token = takeToken();

  function askToken(why) {
    const form = document.getElementById('login');
    form.hidden = false;
    banner(why);
  }

  document.getElementById('login').addEventListener('submit', (event) => {
    event.preventDefault();
    token = document.getElementById('token').value.trim();
    try {
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch (_) {
      // As above.
    }
    document.getElementById('login').hidden = true;
    banner('');
    poll();
  });

  // ---- the API ----

  async function get(path) {
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    let response;
    try {
      response = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
    } catch (error) {
      return { status: 0, body: null, error: String(error) };
    }
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    return { status: response.status, body };
  }

  function message(answer) {
    if (answer.status === 0) return `the operator does not answer (${answer.error})`;
    const text = answer.body && answer.body.error && answer.body.error.message;
    return `HTTP ${answer.status}${text ? `: ${text}` : ''}`;
  }

  function banner(text) {
    const node = document.getElementById('banner');
    node.textContent = text;
    node.hidden = !text;
  }

  // ---- drawing ----

  function poolKey(pool, family) {
    return `${pool} ${family}`;
  }

  // A horizontal bar of segments [{value: BigInt, colour, label, class}] over `whole`.
  function bar(segments, whole, label) {
    const node = svg('svg', {
      class: 'bar',
      viewBox: '0 0 1000 20',
      preserveAspectRatio: 'none',
      role: 'img',
      'aria-label': label,
    });
    node.append(svg('rect', { x: 0, y: 0, width: 1000, height: 20, class: 'empty' }));
    let x = 0;
    for (const segment of segments) {
      if (segment.value <= 0n) continue;
      const width = share(segment.value, whole) * 1000;
      // Anything present stays visible, however small its share.
      const drawn = Math.max(width, 2);
      node.append(
        svg(
          'rect',
          { x, y: 0, width: drawn, height: 20, fill: segment.colour, class: segment.class },
          svg('title', {}, segment.label),
        ),
      );
      x += width;
    }
    return node;
  }

  // A node's bar of addresses used of those it holds (node CIDRs, from its agent's record).
  function used(name, allocated, size) {
    return [
      bar([{ value: allocated, colour: colour(name), label: `used ${allocated}` }], size, `${name}: ${allocated} of ${size} addresses used`),
      el('span', {}, `${count(allocated)} of ${count(size)} addresses used`),
    ];
  }

  function drawPools(status, nodes) {
    const body = section('pools');
    const pools = status && status.cluster ? status.cluster.pools : null;
    if (!pools) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'Known to the leader only.'));
      return;
    }
    if (pools.length === 0) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'No pool is configured.'));
      return;
    }
    const cards = pools.map((pool) => {
      const key = poolKey(pool.pool, pool.family);
      const capacity = big(pool.capacity);
      const holders = (nodes || [])
        .map((node) => ({
          node,
          grants: node.grants.filter((g) => g.pool === pool.pool && g.family === pool.family),
          blocks: (node.blocks || []).find((b) => b.pool === pool.pool && b.family === pool.family),
          held: (node.holdings || []).filter((h) => h.pool === pool.pool && h.family === pool.family),
          waits: (node.waiting || []).filter((w) => w.what === key),
        }))
        .filter((h) => h.grants.length || h.blocks || h.held.length || h.waits.length);
      const segments = holders
        .filter((h) => h.grants.length)
        .map((h) => ({
          value: BigInt(h.grants.length),
          colour: colour(h.node.name),
          label: `${h.node.name}: ${h.grants.length} (${h.grants.map((g) => g.cidr).join(', ')})`,
        }));
      const listed = segments.reduce((sum, s) => sum + s.value, 0n);
      const granted = big(pool.granted);
      if (granted > listed) {
        segments.push({ value: granted - listed, class: 'other', label: `granted to other nodes: ${granted - listed}` });
      }
      for (const [field, name] of [
        ['quarantined', 'quarantined'],
        ['reserved', 'reserved'],
        ['blocked', 'blocked'],
      ]) {
        segments.push({ value: big(pool[field]), class: name, label: `${name}: ${count(pool[field])}` });
      }
      const rows = holders.map((h) => {
        const usage = h.blocks
          ? [
              bar(
                [{ value: big(h.blocks.used), colour: colour(h.node.name), label: `used ${h.blocks.used}` }],
                big(h.blocks.available),
                `${h.node.name}: ${h.blocks.used} of ${h.blocks.available} addresses used`,
              ),
              el(
                'span',
                {},
                `${count(h.blocks.used)} of ${count(h.blocks.available)} addresses used`,
                big(h.blocks.needed) > 0n ? `, needs ${count(h.blocks.needed)} more` : '',
              ),
            ]
          : h.held.length
            ? used(
                h.node.name,
                h.held.reduce((sum, r) => sum + big(r.allocated), 0n),
                h.held.reduce((sum, r) => sum + big(r.size), 0n),
              )
            : [el('span', {}), el('span', {})];
        return el(
          'div',
          { class: 'holder', 'data-node': h.node.name },
          el('span', { class: 'swatch' }),
          el('span', { class: 'name' }, h.node.name),
          el('span', { class: 'units' }, `${h.grants.length} × /${pool.node_prefix_len}`),
          ...usage,
          h.waits.length
            ? el('span', { class: 'wait' }, h.waits.map((w) => `waiting: ${w.reason}`).join('; '))
            : el('span', { class: 'cidrs' }, h.grants.map((g) => g.cidr).join(' ')),
        );
      });
      for (const row of rows) {
        row.firstChild.style.background = colour(row.dataset.node);
      }
      return el(
        'article',
        { class: 'pool', 'data-pool': key },
        el(
          'h3',
          {},
          `${pool.pool} `,
          el('span', { class: 'family' }, pool.family),
          el(
            'span',
            { class: 'quiet' },
            ` /${pool.node_prefix_len}: ${count(pool.granted)} of ${count(pool.capacity)} granted (${percent(granted, capacity)}), ${count(pool.free)} free`,
          ),
        ),
        bar(segments, capacity, `${key}: ${pool.granted} of ${pool.capacity} granted`),
        el(
          'p',
          { class: 'legend quiet' },
          `quarantined ${count(pool.quarantined)} · reserved ${count(pool.reserved)} · blocked ${count(pool.blocked)} · free ${count(pool.free)}`,
        ),
        rows.length ? el('div', { class: 'holders' }, rows) : el('p', { class: 'quiet' }, 'No node holds or waits for space here.'),
      );
    });
    body.replaceChildren(...cards);
  }

  function drawWaiting(nodes) {
    const body = section('waiting');
    if (!nodes) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'Known to the leader only.'));
      return;
    }
    const rows = [];
    for (const node of nodes) {
      const waits = node.waiting && node.waiting.length
        ? node.waiting
        : node.waiting_for.map((what) => ({ what, unit: '', reason: '', starving: false }));
      for (const wait of waits) {
        rows.push(
          el(
            'tr',
            { 'data-node': node.name },
            el('td', {}, node.name),
            el('td', {}, wait.what),
            el('td', {}, wait.unit),
            el('td', { class: wait.starving ? 'wait' : '' }, wait.reason || 'not said'),
            el('td', {}, wait.starving ? 'starving' : ''),
          ),
        );
      }
    }
    document.body.dataset.waiting = String(rows.length);
    body.replaceChildren(
      rows.length
        ? el(
            'table',
            {},
            el('thead', {}, el('tr', {}, ['node', 'for', 'unit', 'why', ''].map((h) => el('th', {}, h)))),
            el('tbody', {}, rows),
          )
        : el('p', { class: 'ok' }, 'No node is waiting.'),
    );
  }

  function drawProblems(status) {
    const body = section('problems');
    const current = (status && status.current) || [];
    const view = (status && status.cluster && status.cluster.problems) || [];
    // Pools with starving nodes (`full`: "pool/family" → who starves and why).
    const full = Object.entries((status && status.full) || {});
    const items = [
      ...full.map(([pool, text]) =>
        el('li', { class: 'wait' }, el('strong', {}, `${pool} is full: `), text),
      ),
      ...current.map((p) =>
        el(
          'li',
          {},
          el('strong', {}, `${p.kind}${p.subject ? ` ${p.subject}` : ''}: `),
          p.message,
          el('span', { class: 'quiet' }, ` since ${when(p.since_ms)} (${ago(p.since_ms)}), last seen ${ago(p.last_seen_ms)}`),
        ),
      ),
      ...view.map((text) => el('li', {}, text)),
    ];
    body.replaceChildren(items.length ? el('ul', {}, items) : el('p', { class: 'ok' }, 'No current problem.'));
  }

  function nodeState(node) {
    if (node.removal_requested) return ['removing', 'removal requested'];
    const waits = node.waiting && node.waiting.length ? node.waiting : null;
    if (waits) return ['waiting', `waiting: ${waits.map((w) => `${w.what} (${w.reason})`).join('; ')}`];
    if (node.waiting_for.length) return ['waiting', `waiting for ${node.waiting_for.join(', ')}`];
    return ['served', 'served'];
  }

  function drawNodes(nodes) {
    const body = section('nodes');
    if (!nodes) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'Known to the leader only.'));
      return;
    }
    if (nodes.length === 0) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'No node is registered.'));
      return;
    }
    const rows = nodes.map((node) => {
      const [state, text] = nodeState(node);
      return el(
        'tr',
        { 'data-node': node.name, 'data-state': state },
        el('td', {}, node.name),
        el('td', { class: state === 'served' ? 'ok' : 'wait' }, text),
        el('td', {}, node.grants.map((g) => `${g.pool} ${g.cidr}`).join(', ')),
        el('td', {}, node.node_id === null || node.node_id === undefined ? '' : String(node.node_id)),
        el('td', { class: 'quiet' }, (node.held || []).join(', ')),
      );
    });
    body.replaceChildren(
      el(
        'table',
        {},
        el('thead', {}, el('tr', {}, ['node', 'state', 'grants', 'node ID', 'its agent holds'].map((h) => el('th', {}, h)))),
        el('tbody', {}, rows),
      ),
    );
  }

  function drawHistory(answer) {
    const body = section('history');
    if (answer.status === 404) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'History not available: this operator serves no /v1/history.'));
      return;
    }
    if (answer.status !== 200 || !answer.body || !Array.isArray(answer.body.events)) {
      body.replaceChildren(el('p', { class: 'quiet' }, `History not available (${message(answer)}).`));
      return;
    }
    const events = answer.body.events.slice().sort(
      (a, b) => Math.max(b.from_ms, b.to_ms || 0) - Math.max(a.from_ms, a.to_ms || 0),
    );
    if (events.length === 0) {
      body.replaceChildren(el('p', { class: 'quiet' }, 'Nothing granted yet.'));
      return;
    }
    body.replaceChildren(
      el(
        'table',
        {},
        el('thead', {}, el('tr', {}, ['granted', 'released', 'node', 'pool', 'CIDR', 'why it ended'].map((h) => el('th', {}, h)))),
        el(
          'tbody',
          {},
          events.map((e) =>
            el(
              'tr',
              {},
              el('td', {}, when(e.from_ms)),
              el('td', {}, e.to_ms === null || e.to_ms === undefined ? 'held' : when(e.to_ms)),
              el('td', {}, e.node),
              el('td', {}, `${e.pool} ${e.family}`),
              el('td', {}, e.cidr),
              el('td', {}, e.why || ''),
            ),
          ),
        ),
      ),
    );
  }

  function drawSummary(status, nodesAnswer) {
    const replica = status
      ? `${status.replica} (${status.leading ? 'leading' : 'standby'})`
      : 'unknown';
    document.getElementById('replica').textContent = replica;
    let leader = status && status.cluster && status.cluster.leader;
    if (!leader && nodesAnswer.status === 503) {
      const match = /ask the leader, ([^ ]+) /.exec(message(nodesAnswer));
      leader = match ? match[1] : 'none now';
    }
    document.getElementById('leader').textContent = leader || 'unknown';
    const cluster = status && status.cluster;
    document.getElementById('counts').textContent = cluster
      ? `${cluster.nodes} (${cluster.nodes_served} served, ${cluster.nodes_waiting} waiting)`
      : 'known to the leader only';
    document.getElementById('updated').textContent = new Date().toLocaleTimeString();
  }

  // ---- polling ----

  let timer = null;
  let polls = 0;

  function draw(status, nodes, history) {
    if (status.status !== 200 || !status.body) {
      banner(`Status: ${message(status)}; showing the last answer.`);
      return;
    }
    const nodeList = nodes.status === 200 && nodes.body ? nodes.body.nodes : null;
    if (nodeList) {
      places = new Map(nodeList.map((n) => n.name).sort().map((name, i) => [name, i]));
    }
    banner(nodes.status === 200 ? '' : `This replica does not serve the cluster's view: ${message(nodes)}`);
    drawSummary(status.body, nodes);
    drawPools(status.body, nodeList);
    drawWaiting(nodeList);
    drawProblems(status.body);
    drawNodes(nodeList);
    drawHistory(history);
    polls += 1;
    document.body.dataset.polls = String(polls);
  }

  async function poll() {
    clearTimeout(timer);
    const [status, nodes, history] = await Promise.all([
      get('/v1/status'),
      get('/v1/nodes'),
      get(`/v1/history?limit=${HISTORY_LIMIT}`),
    ]);
    if (status.status === 401) {
      askToken(token ? 'The operator refused this token.' : 'This page needs the operator\'s bearer token.');
      return;
    }
    try {
      draw(status, nodes, history);
    } catch (error) {
      // One odd answer must not stop the polling: say so, keep the rest, ask again.
      banner(`The page could not draw the operator's answer: ${error}`);
      console.error(error);
    }
    timer = setTimeout(poll, POLL_MS);
  }

  poll();
})();
