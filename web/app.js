// withruntime dashboard. Every datum comes from the /v1 API with the key the user typed
// (kept in sessionStorage, sent as Authorization: Bearer). Everything a sandbox or the API
// returns is shown as text (textContent), never parsed as HTML.
"use strict";

(function () {
  const KEY = "withruntime.key";
  const POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);

  // ---- small helpers ----
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids) if (kid !== null && kid !== undefined)
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    return e;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  function usd(micros) {
    if (micros === null || micros === undefined) return "–";
    const d = micros / 1e6;
    // Nothing spent reads $0.00, not $0.0000 beside a neighbour's $0.000050.
    if (d === 0) return "$0.00";
    return d < 0.01 && d > 0 ? "$" + d.toFixed(6) : "$" + d.toFixed(d < 1 ? 4 : 2);
  }
  function mib(bytes) {
    if (bytes === null || bytes === undefined) return "–";
    return bytes >= 1 << 30 ? (bytes / (1 << 30)).toFixed(2) + " GiB" : (bytes / (1 << 20)).toFixed(1) + " MiB";
  }
  function human(secs) {
    if (secs === null || isNaN(secs)) return "–";
    const neg = secs < 0; secs = Math.abs(Math.round(secs));
    const d = Math.floor(secs / 86400), h = Math.floor(secs % 86400 / 3600),
      m = Math.floor(secs % 3600 / 60), s = secs % 60;
    const t = d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
    return neg ? "-" + t : t;
  }
  const since = (iso) => iso ? (Date.now() - Date.parse(iso)) / 1000 : null;
  const until = (iso) => iso ? (Date.parse(iso) - Date.now()) / 1000 : null;
  function setText(node, text) { if (node.textContent !== text) node.textContent = text; }
  function status(msg, bad) {
    const s = $("status");
    setText(s, msg || "");
    s.classList.toggle("bad", !!bad);
  }

  // ---- the API, with ETags: a poll whose answer has not changed costs a 304 ----
  const cache = new Map(); // path -> {etag, body}
  class ApiError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }
  async function api(path, opts) {
    opts = opts || {};
    const key = sessionStorage.getItem(KEY);
    const headers = { "Authorization": "Bearer " + key };
    const method = opts.method || "GET";
    // noCache: an answer read once (a command's output from an offset) is not kept, or the
    // cache would grow by one entry a poll
    const hit = method === "GET" && !opts.noCache ? cache.get(path) : null;
    if (hit) headers["If-None-Match"] = hit.etag;
    let body;
    if (opts.json !== undefined) { headers["Content-Type"] = "application/json"; body = JSON.stringify(opts.json); }
    const r = await fetch(path, { method, headers, body, cache: "no-store", credentials: "omit", redirect: "error" });
    if (r.status === 304 && hit) { window.wrNotModified = (window.wrNotModified || 0) + 1; return { data: hit.body, changed: false }; }
    if (opts.raw && r.ok) return r;
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const err = data && data.error ? data.error : { code: "http_" + r.status, message: r.statusText };
      if (r.status === 401 && !opts.signin) signOut("The key is no longer accepted; sign in again.");
      throw new ApiError(r.status, err.code, err.message);
    }
    const etag = r.headers.get("ETag");
    if (method === "GET" && etag && !opts.noCache) cache.set(path, { etag, body: data });
    return { data, changed: true };
  }

  // ---- who is signed in ----
  let me = null; // the /v1/whoami answer
  const readOnly = () => !me || (me.key && me.key.read_only);
  const auditor = () => !!(me && me.auditor);
  // Which nav links this key has use for: an auditor key has no sandboxes but reads keys and
  // the audit trail; every other key the reverse.
  function navFor() {
    for (const a of document.querySelectorAll("#nav a[data-for]"))
      a.hidden = a.dataset.for === "auditor" ? !auditor() : auditor();
  }

  async function signIn(key) {
    sessionStorage.setItem(KEY, key);
    try {
      me = (await api("/v1/whoami", { signin: true })).data;
    } catch (e) {
      sessionStorage.removeItem(KEY);
      me = null;
      if (e.status === 401) throw new Error("That key was not accepted: it is unknown, revoked or mistyped.");
      if (e.status === 429) throw new Error("Too many wrong keys from here: " + e.message);
      throw new Error(e.message || "cannot reach the daemon");
    }
    const k = me.key;
    setText($("who"), k ? `${k.name} (${k.id})${me.auditor ? " · auditor" : k.read_only ? " · read-only" : ""}` : "admin");
    navFor();
    $("nav").hidden = false;
    $("signout").hidden = false;
  }
  function signOut(msg) {
    sessionStorage.removeItem(KEY);
    cache.clear();
    me = null;
    navFor();
    $("nav").hidden = true;
    $("signout").hidden = true;
    setText($("who"), "");
    location.hash = "#/signin";
    route();
    if (msg) setText($("signin-error"), msg);
  }

  // ---- views and routing (#/sandboxes, #/sandbox/ID, #/usage, #/keys, #/audit) ----
  let timer = null, ticks = 0;
  let view = null; // {name, poll(), leave()}
  function show(name) {
    for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== "view-" + name;
    for (const a of document.querySelectorAll("#nav a"))
      if (a.getAttribute("href") === "#/" + name) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  // A poll now (a button's refresh, or the timer's): the newest tick alone schedules the next,
  // so refreshes never add a second chain of polls.
  async function tick() {
    const v = view, mine = ++ticks;
    clearTimeout(timer);
    if (!v) return;
    try {
      await v.poll();
      if (v === view) status("");
    } catch (e) {
      if (v === view && e.status === 404 && v.gone) { status(v.gone, true); return; } // no more polls
      if (v === view && e.status !== 401) status("Could not refresh: " + e.message, true);
    }
    if (v === view && mine === ticks) timer = setTimeout(tick, POLL_MS);
  }
  function route() {
    clearTimeout(timer);
    if (view && view.leave) view.leave();
    view = null;
    status("");
    const h = location.hash || (auditor() ? "#/keys" : "#/sandboxes");
    if (!sessionStorage.getItem(KEY) || !me) {
      show("signin");
      document.title = "Sign in · withruntime";
      $("key").focus();
      return;
    }
    let m;
    if ((m = h.match(/^#\/sandbox\/(sb-[a-z2-7]{21})$/))) view = sandboxView(m[1]);
    else if (h === "#/usage") view = usageView();
    else if (h === "#/keys") view = keysView();
    else if (h === "#/audit") view = auditView();
    else if (h === "#/sandboxes" || !auditor()) view = listView(); // an auditor's: the daemon says no
    else view = keysView();
    tick();
  }

  // ---- stop / start / delete ----
  function actionButtons(id, state, onDone) {
    const ro = readOnly();
    const why = ro ? "This key is read-only" : null;
    const mk = (action, label, cls, enabled) => el("button", {
      type: "button", class: cls, "data-action": action, "data-id": id, title: why,
      disabled: ro || !enabled, "aria-label": `${label} ${id}`,
      onclick: async (ev) => {
        if (action === "delete" && !confirm(`Delete ${id}? Its files are lost.`)) return;
        ev.target.disabled = true;
        status(`${label} ${id}…`);
        try {
          await api(`/v1/sandboxes/${id}${action === "delete" ? "" : "/" + action}`,
            { method: action === "delete" ? "DELETE" : "POST" });
          status(`${label}: done for ${id}`);
        } catch (e) { status(`${label} ${id} failed: ${e.message}`, true); }
        if (onDone) onDone();
      },
    }, label);
    return [
      mk("stop", "Stop", "secondary", state === "running"),
      mk("start", "Start", "secondary", state === "stopped" || state === "failed"),
      mk("delete", "Delete", "danger", state !== "deleting"),
    ];
  }
  function updateButtons(container, state) {
    if (readOnly()) return;
    for (const b of container.querySelectorAll("button[data-action]")) {
      const a = b.dataset.action;
      b.disabled = a === "stop" ? state !== "running" : a === "start" ? !(state === "stopped" || state === "failed") : state === "deleting";
    }
  }
  function stateText(sb) {
    return sb.state + (sb.frozen ? " (frozen)" : "") + (sb.state_reason ? ` · ${sb.state_reason}` : "");
  }

  // ---- the sandboxes page ----
  function listView() {
    show("sandboxes");
    document.title = "Sandboxes · withruntime";
    const rows = new Map(); // id -> {tr, cells, cpu: {usec, at}}
    const tbody = $("sb-rows");
    tbody.replaceChildren();
    let list = [];
    newForm();
    async function stats(sb, row) {
      if (sb.state !== "running") { setText(row.cells.cpu, "–"); setText(row.cells.mem, "–"); row.cpu = null; return; }
      const st = (await api(`/v1/sandboxes/${sb.id}/stats`)).data;
      const now = performance.now();
      if (row.cpu && st.cpu_usec >= row.cpu.usec && now > row.cpu.at)
        setText(row.cells.cpu, ((st.cpu_usec - row.cpu.usec) / 1000 / (now - row.cpu.at) * 100).toFixed(1) + " %");
      row.cpu = { usec: st.cpu_usec, at: now };
      setText(row.cells.mem, mib(st.memory_bytes));
    }
    return {
      async poll() {
        const r = await api("/v1/sandboxes");
        list = r.data.sandboxes || [];
        const seen = new Set();
        for (const sb of list) {
          seen.add(sb.id);
          let row = rows.get(sb.id);
          if (!row) {
            const cells = {};
            const td = (name, cls) => (cells[name] = el("td", { class: cls }));
            const tr = el("tr", { "data-id": sb.id },
              el("td", { class: "id" }, el("a", { href: `#/sandbox/${sb.id}`, text: sb.id })),
              td("state"), td("image", "wrap"), td("size"), td("age", "num"), td("lease", "num"),
              td("cost", "num"), td("cpu", "num"), td("mem", "num"), td("actions"));
            cells.actions.append(el("div", { class: "actions" }, ...actionButtons(sb.id, sb.state, () => tick())));
            row = { tr, cells, cpu: null };
            rows.set(sb.id, row);
            tbody.append(tr);
          }
          const c = row.cells;
          setText(c.state, stateText(sb));
          c.state.className = "state-" + sb.state + " wrap";
          setText(c.image, sb.image);
          setText(c.size, `${sb.cpus} vCPU · ${sb.memory_mib} MiB`);
          setText(c.age, human(since(sb.created_at)));
          setText(c.lease, sb.state === "running" ? human(until(sb.lease_ends_at)) : "–");
          setText(c.cost, usd(sb.cost_micros));
          updateButtons(c.actions, sb.state);
        }
        for (const [id, row] of rows) if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
        $("sb-empty").hidden = list.length > 0;
        await Promise.all(list.slice(0, 50).map((sb) => stats(sb, rows.get(sb.id)).catch(() => {})));
      },
    };
  }

  // ---- the create form (on the sandboxes page) ----
  // A number field: undefined when empty (the daemon's default), an error in words when not a
  // number; `scale` turns minutes into the API's seconds.
  function numberField(input, what, scale) {
    if (input.validity.badInput) throw new Error(`${what}: not a number`);
    const v = input.value.trim();
    if (v === "") return undefined;
    const n = Number(v);
    if (!Number.isFinite(n)) throw new Error(`${what}: not a number`);
    return scale ? Math.round(n * scale) : n;
  }
  function newRequest() {
    const body = { image: $("new-image").value.trim() || "default" };
    const set = (k, v) => { if (v !== undefined) body[k] = v; };
    set("cpus", numberField($("new-cpus"), "CPUs"));
    set("memory_mib", numberField($("new-mem"), "Memory"));
    set("disk_mib", numberField($("new-disk"), "Disk"));
    set("timeout_seconds", numberField($("new-timeout"), "Lease", 60));
    const allow = $("new-allow").value.split(/[\s,]+/).filter(Boolean);
    // an allow list without Internet is sent as typed: the daemon says in words why not
    body.network = { internet: $("new-inet").checked };
    if (allow.length) body.network.allow = allow;
    return body;
  }
  function newForm() {
    const ro = readOnly();
    $("new-fields").disabled = ro;
    $("new-submit").disabled = ro;
    $("new-submit").title = ro ? "This key is read-only" : "";
    $("new-ro").hidden = !ro;
    setText($("new-error"), "");
    setText($("new-note"), "");
    api("/v1/images").then(({ data }) => {
      $("new-images").replaceChildren(...(data.images || []).map((i) => el("option", { value: i.name })));
    }).catch(() => {}); // the list is a convenience; the field takes any name
    $("new-form").onsubmit = async (ev) => {
      ev.preventDefault();
      if (readOnly()) return;
      setText($("new-error"), "");
      setText($("new-note"), "");
      let body;
      try { body = newRequest(); } catch (e) { setText($("new-error"), e.message); return; }
      $("new-submit").disabled = true;
      status("Creating a sandbox…");
      try {
        const sb = (await api("/v1/sandboxes", { method: "POST", json: body })).data;
        status("");
        $("new-note").replaceChildren(`Created `, el("a", { href: `#/sandbox/${sb.id}`, text: sb.id }), ".");
        tick();
      } catch (e) {
        status("");
        setText($("new-error"), `Not created: ${e.message}` + (e.status === 403 ? " (this key may not create sandboxes)" : ""));
      }
      $("new-submit").disabled = readOnly();
    };
  }

  // ---- charts (SVG) ----
  // A bar chart of money. Beside a limit far above it a spend of cents would draw nothing: then
  // the scale is the spend's own and the limit is a dotted line along the top that says it is
  // off the scale. Any spend at all gets a bar at least MIN_BAR high; the page says the numbers
  // in words beside the chart too.
  function barChart(box, values, labels, opts) {
    const W = 600, H = 200, L = 56, B = 24, T = 26, MIN_BAR = 3;
    const peak = Math.max(0, ...values);
    const off = !!opts.limit && peak > 0 && opts.limit > 4 * peak;
    const max = (off ? peak : Math.max(peak, opts.limit || 0)) * 1.15 || 1;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.label });
    const y = (v) => T + (H - T - B) * (1 - v / max);
    const bw = (W - L - 8) / Math.max(1, values.length);
    s.append(svg("line", { x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#767676" }));
    const top = svg("text", { x: 4, y: T + 10 }); top.textContent = opts.fmt(max); s.append(top);
    values.forEach((v, i) => {
      let h = (H - T - B) * v / max;
      if (v > 0 && h < MIN_BAR) h = MIN_BAR;
      const r = svg("rect", { class: "bar", x: L + i * bw + 2, y: H - B - h, width: Math.max(1, bw - 4), height: h, "data-label": labels[i], "data-value": v });
      const t = svg("title", {}); t.textContent = `${labels[i]}: ${opts.fmt(v)}`; r.append(t);
      s.append(r);
      if (values.length <= 16 || i % Math.ceil(values.length / 8) === 0) {
        const lt = svg("text", { x: L + i * bw + 2, y: H - 8 }); lt.textContent = labels[i]; s.append(lt);
      }
    });
    if (opts.limit) {
      const ly = off ? 16 : y(opts.limit);
      s.append(svg("line", { class: off ? "limit off" : "limit", x1: L, x2: W, y1: ly, y2: ly, "data-limit": opts.limit, "data-off-scale": off }));
      const lt = svg("text", { x: L + 4, y: ly - 4 });
      lt.textContent = "daily limit " + opts.fmt(opts.limit) + (off ? " \u2191 far above, off this scale" : "");
      s.append(lt);
    }
    box.replaceChildren(s);
  }
  const percent = (part, whole) => {
    const p = part / whole * 100;
    return p > 0 && p < 0.01 ? "under 0.01 %" : p.toFixed(p < 10 ? 2 : 0) + " %";
  };
  function liveChart(box, samples, memMax) {
    const W = 600, H = 200, T = 10, B = 10;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "CPU and memory over time" });
    if (samples.length > 1) {
      const x = (i) => (W * i) / (samples.length - 1);
      const yc = (p) => T + (H - T - B) * (1 - Math.min(1, p / 100));
      const ym = (b) => T + (H - T - B) * (1 - Math.min(1, b / memMax));
      let area = `M0 ${H - B}`;
      samples.forEach((p, i) => { area += ` L${x(i)} ${ym(p.mem)}`; });
      s.append(svg("path", { class: "area", d: area + ` L${W} ${H - B} Z` }));
      s.append(svg("path", { class: "line", d: samples.map((p, i) => `${i ? "L" : "M"}${x(i)} ${yc(p.cpu)}`).join(" ") }));
      const last = samples[samples.length - 1];
      const t = svg("text", { x: 6, y: 20 }); t.textContent = `CPU ${last.cpu.toFixed(1)} % · memory ${mib(last.mem)}`; s.append(t);
    } else {
      const t = svg("text", { x: 6, y: 20 }); t.textContent = "collecting…"; s.append(t);
    }
    box.replaceChildren(s);
  }
  const iso = (ms) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");

  // ---- one sandbox ----
  function sandboxView(id) {
    show("sandbox");
    document.title = `${id} · withruntime`;
    setText($("d-title"), id);
    $("d-facts").replaceChildren();
    $("d-actions").replaceChildren(...actionButtons(id, "", () => tick()));
    for (const t of ["f-rows", "c-rows", "e-rows", "n-rows", "d-net", "d-env-rows", "d-meta-rows"]) $(t).replaceChildren();
    $("f-view").hidden = true;
    $("o-panel").hidden = true;
    setText($("d-cost-text"), "");
    $("d-chart-cost").replaceChildren();
    $("d-chart-live").replaceChildren();
    const samples = [];
    let prev = null, sb = null;
    const term = window.wrTerminal ? window.wrTerminal.mount($("term-panel"), id, readOnly(), api) : null;
    $("term-h").hidden = !term;
    $("term-panel").hidden = !term;

    function fact(k, v) { return [el("dt", { text: k }), el("dd", { text: v })]; }
    // What the sandbox was made with: its network policy, env and metadata. Env and metadata
    // values are whatever a client stored (hostile): text only, each shown up to CLIP characters.
    const CLIP = 1024;
    const clip = (v) => v.length > CLIP ? v.slice(0, CLIP) + ` … (${v.length - CLIP} more characters)` : v;
    function pairs(name, obj) {
      const ents = Object.entries(obj || {});
      $(`d-${name}-none`).hidden = ents.length > 0;
      $(`d-${name}`).hidden = !ents.length;
      $(`d-${name}-rows`).replaceChildren(...ents.map(([k, v]) =>
        el("tr", { "data-name": k }, el("td", { text: clip(k) }), el("td", { text: clip(String(v)) }))));
    }
    function settings() {
      const n = sb.network || { internet: false };
      const f = fact("Internet", n.internet ? "on" : "off (reaches nothing)");
      if (n.internet)
        f.push(...fact("Allowed hosts", !n.allow ? "any public host" : n.allow.length ? n.allow.join(", ") : "none (an empty allow list)"));
      if (n.deny && n.deny.length) f.push(...fact("Denied hosts", n.deny.join(", ")));
      f.push(...fact("Secrets", (sb.secrets || []).length ? sb.secrets.join(", ") : "none"));
      f.push(...fact("At lease end", sb.on_lease_end === "delete" ? "deleted" : "stopped (files kept)"));
      $("d-net").replaceChildren(...f);
      pairs("env", sb.env);
      pairs("meta", sb.metadata);
    }

    // "Extend lease": POST .../timeout sets the lease to end N seconds from now.
    const ro = readOnly();
    $("lease-min").disabled = ro;
    $("lease-set").disabled = ro;
    $("lease-set").title = ro ? "This key is read-only" : "";
    setText($("lease-error"), "");
    setText($("lease-note"), "");
    $("lease-min").value = "60";
    $("lease-form").onsubmit = async (ev) => {
      ev.preventDefault();
      if (readOnly()) return;
      setText($("lease-error"), "");
      setText($("lease-note"), "");
      let secs;
      try { secs = numberField($("lease-min"), "Minutes", 60); } catch (e) { setText($("lease-error"), e.message); return; }
      if (secs === undefined) { setText($("lease-error"), "Minutes: say in how many minutes from now the lease should end (1 to 1440)."); return; }
      $("lease-set").disabled = true;
      try {
        const r = (await api(`/v1/sandboxes/${id}/timeout`, { method: "POST", json: { timeout_seconds: secs } })).data;
        setText($("lease-note"), `The lease now ends at ${r.lease_ends_at} (in ${human(until(r.lease_ends_at))}).`);
        tick();
      } catch (e) { setText($("lease-error"), `Lease not changed: ${e.message}`); }
      $("lease-set").disabled = readOnly();
    };

    // A background command's output, followed while it runs. Bytes come from the offsets the
    // last answer gave, so none is read twice; each stream keeps its last KEEP characters here.
    // Sandbox bytes: decoded as UTF-8 (a bad sequence shows as U+FFFD) and set as text only.
    const KEEP = 1 << 20;
    const utf8 = new TextEncoder();
    let out = null; // {cid, busy, done, s: {stdout: {off, text, dec, lost, cut}, stderr: ...}}
    function bytesOf(r, n) {
      if (r[n + "_encoding"] !== "base64") return utf8.encode(r[n] || "");
      const bin = atob(r[n] || ""), a = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) a[i] = bin.charCodeAt(i);
      return a;
    }
    function openOutput(cid) {
      out = { cid, busy: false, done: false, s: {} };
      for (const n of ["stdout", "stderr"]) {
        out.s[n] = { off: 0, text: "", dec: new TextDecoder("utf-8"), lost: 0, cut: 0 };
        $("o-" + n).textContent = "";
        setText($("o-" + n + "-note"), "");
      }
      setText($("o-title"), `Output of ${cid}`);
      setText($("o-state"), "Reading…");
      $("o-panel").hidden = false;
      for (const b of document.querySelectorAll("#c-rows button[data-cmd-output]"))
        b.setAttribute("aria-pressed", String(b.dataset.cmdOutput === cid));
      return follow();
    }
    async function follow() {
      const o = out;
      if (!o || o.done || o.busy) return;
      o.busy = true;
      try {
        const q = `stdout_offset=${o.s.stdout.off}&stderr_offset=${o.s.stderr.off}`;
        const r = (await api(`/v1/sandboxes/${id}/commands/${encodeURIComponent(o.cid)}/output?${q}`, { noCache: true })).data;
        if (o !== out) return;
        let fresh = 0;
        for (const n of ["stdout", "stderr"]) {
          const st = o.s[n], from = r[n + "_offset"];
          if (from > st.off) { // fell behind the daemon's kept tail: start over from what it has
            st.lost += from - st.off;
            st.text += st.dec.decode();
            st.dec = new TextDecoder("utf-8");
          }
          const bytes = bytesOf(r, n);
          fresh += bytes.length;
          st.text += st.dec.decode(bytes, { stream: true });
          st.off = r[n + "_next_offset"];
        }
        if (r.state !== "running" && !fresh) { // ended, and nothing more to read
          o.done = true;
          for (const n of ["stdout", "stderr"]) o.s[n].text += o.s[n].dec.decode();
        }
        for (const n of ["stdout", "stderr"]) {
          const st = o.s[n];
          if (st.text.length > KEEP) { st.cut += st.text.length - KEEP; st.text = st.text.slice(-KEEP); }
        }
        showOutput(o, r);
      } catch (e) {
        if (o === out) setText($("o-state"), `Could not read the output: ${e.message}`);
      } finally { o.busy = false; }
    }
    function showOutput(o, r) {
      setText($("o-state"), r.state === "running" ? "Running: its output is followed as it comes." :
        r.state === "exited" ? (r.signal ? `Ended by signal ${r.signal}.` : `Exited with code ${r.exit_code}.`) :
        `Failed: ${r.error || "no reason given"}.`);
      for (const n of ["stdout", "stderr"]) {
        const st = o.s[n], pre = $("o-" + n);
        const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        if (pre.textContent !== st.text) pre.textContent = st.text;
        if (atEnd) pre.scrollTop = pre.scrollHeight;
        const notes = [st.off ? `${st.off} bytes written` : "nothing written"];
        if (st.lost) notes.push(`the first ${st.lost} are no longer kept by the daemon`);
        if (st.cut) notes.push(`this page keeps the last 1 MiB: ${st.cut} earlier characters dropped`);
        setText($("o-" + n + "-note"), notes.join("; ") + ".");
      }
    }
    $("o-close").onclick = () => {
      out = null;
      $("o-panel").hidden = true;
      for (const b of document.querySelectorAll("#c-rows button[data-cmd-output]")) b.setAttribute("aria-pressed", "false");
    };
    async function costChart() {
      // 12 five-minute windows of the last hour, from one /v1/usage call: this sandbox, by minute
      const end = Math.ceil(Date.now() / 300000) * 300000, start = end - 12 * 300000;
      const r = (await api(`/v1/usage?group_by=minute&sandbox=${id}&from=${iso(start)}&to=${iso(end)}`)).data;
      const vals = new Array(12).fill(0);
      for (const row of r.rows || []) {
        const i = Math.floor((Date.parse(row.minute) - start) / 300000);
        if (i >= 0 && i < 12) vals[i] += row.cost_micros;
      }
      const labels = vals.map((_, i) => new Date(start + i * 300000).toISOString().slice(11, 16));
      barChart($("d-chart-cost"), vals, labels, { label: "cost per five minutes over the last hour", fmt: usd });
      const hour = vals.reduce((a, b) => a + b, 0), most = Math.max(...vals);
      setText($("d-cost-text"), hour ? `Last hour: ${usd(hour)}; the most in five minutes: ${usd(most)}, from ${labels[vals.indexOf(most)]} UTC.`
        : "Last hour: nothing spent.");
    }
    async function files(path) {
      const r = (await api(`/v1/sandboxes/${id}/files/list?path=${encodeURIComponent(path)}`)).data;
      $("f-path").value = r.path;
      $("f-rows").replaceChildren(...r.entries.map((e) => el("tr", { "data-name": e.name },
        el("td", {}, e.type === "directory"
          ? el("button", { type: "button", class: "linkish", onclick: () => files(e.path).catch(fail) }, e.name + "/")
          : e.name),
        el("td", { text: e.type }), el("td", { class: "num", text: e.type === "file" ? String(e.size) : "" }),
        el("td", { text: e.mtime || "" }),
        el("td", {}, e.type === "file" ? el("div", { class: "actions" },
          el("button", { type: "button", class: "secondary", "data-file-action": "view", "aria-label": `View ${e.name}`, onclick: () => viewFile(e).catch(fail) }, "View"),
          el("button", { type: "button", class: "secondary", "data-file-action": "download", "aria-label": `Download ${e.name}`, onclick: () => download(e).catch(fail) }, "Download")) : null))));
    }
    const fail = (e) => status(e.message, true);
    async function viewFile(e) {
      const r = await api(`/v1/sandboxes/${id}/files/content?path=${encodeURIComponent(e.path)}&length=65536`, { raw: true });
      const text = await r.text();
      setText($("f-view-name"), e.path + (e.size > 65536 ? " (first 64 KiB)" : ""));
      $("f-view-text").textContent = text;
      $("f-view").hidden = false;
    }
    async function download(e) {
      const r = await api(`/v1/sandboxes/${id}/files/content?path=${encodeURIComponent(e.path)}`, { raw: true });
      const blob = await r.blob();
      const url = URL.createObjectURL(blob);
      const a = el("a", { href: url, download: e.name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      status(`Downloaded ${e.path} (${blob.size} bytes)`);
    }
    $("f-form").onsubmit = (ev) => { ev.preventDefault(); files($("f-path").value).catch(fail); };
    $("f-up").onclick = () => {
      const p = $("f-path").value.replace(/\/+$/, "");
      files(p.slice(0, p.lastIndexOf("/")) || "/").catch(fail);
    };
    let n = 0, filesListed = false;
    return {
      gone: `${id} does not exist (any more): it was deleted, or belongs to another key.`,
      async poll() {
        const r = await api(`/v1/sandboxes/${id}`);
        sb = r.data;
        if (r.changed) {
          const f = $("d-facts");
          f.replaceChildren(
            ...fact("State", stateText(sb)), ...fact("Image", sb.image),
            ...fact("Size", `${sb.cpus} vCPU · ${sb.memory_mib} MiB memory · ${sb.disk_mib} MiB disk`),
            ...fact("Created", sb.created_at), ...fact("Lease ends", sb.lease_ends_at || "–"),
            ...fact("Cost so far", usd(sb.cost_micros) + (sb.max_cost_micros ? ` of ${usd(sb.max_cost_micros)}` : "")),
            ...(sb.state_detail ? fact("Detail", sb.state_detail) : []));
          f.querySelector("dd").id = "d-state";
          settings();
        }
        updateButtons($("d-actions"), sb.state);
        if (term) term.state(sb.state);
        const jobs = [];
        if (sb.state === "running") {
          jobs.push(api(`/v1/sandboxes/${id}/stats`).then(({ data }) => {
            const now = performance.now();
            const cpu = prev && data.cpu_usec >= prev.usec ? (data.cpu_usec - prev.usec) / 1000 / (now - prev.at) * 100 : 0;
            prev = { usec: data.cpu_usec, at: now };
            samples.push({ cpu, mem: data.memory_bytes });
            if (samples.length > 150) samples.shift();
            liveChart($("d-chart-live"), samples, sb.memory_mib * 1048576);
          }));
          if (!filesListed) { filesListed = true; jobs.push(files($("f-path").value).catch(fail)); }
        }
        jobs.push(api(`/v1/sandboxes/${id}/events`).then(({ data, changed }) => {
          if (!changed && $("e-rows").childElementCount) return;
          $("e-rows").replaceChildren(...data.events.slice().reverse().slice(0, 200).map((e) =>
            el("tr", {}, el("td", { text: e.at }), el("td", { text: e.type }), el("td", { text: e.state || "" }), el("td", { text: e.reason || "" }))));
        }));
        jobs.push(api(`/v1/sandboxes/${id}/commands`).then(({ data, changed }) => {
          if (!changed && $("c-rows").childElementCount) return;
          $("c-rows").replaceChildren(...(data.commands || []).slice().reverse().map((c) =>
            el("tr", { "data-cmd": c.id }, el("td", { class: "nowrap", text: c.id }), el("td", {}, el("code", { text: (c.argv || []).join(" ") })),
              el("td", { text: c.state + (c.error ? ` (${c.error})` : "") }),
              el("td", { class: "num", text: c.exit_code === null || c.exit_code === undefined ? (c.signal ? "signal " + c.signal : "–") : String(c.exit_code) }),
              el("td", { class: "nowrap", text: c.started_at || "" }),
              el("td", {}, el("button", {
                type: "button", class: "secondary", "data-cmd-output": c.id, "aria-label": `Output of ${c.id}`,
                "aria-pressed": String(!!out && out.cid === c.id), onclick: () => openOutput(c.id),
              }, "Output")))));
        }));
        if (out && !out.done) jobs.push(follow());
        jobs.push(api(`/v1/sandboxes/${id}/network/log`).then(({ data }) => {
          setText($("n-total"), `${data.total} denied since the daemon started` + (data.total ? "" : " (none)"));
          $("n-rows").replaceChildren(...data.entries.slice().reverse().map((e) =>
            el("tr", {}, el("td", { text: e.time }), el("td", { text: e.via }), el("td", { text: e.host }), el("td", { class: "num", text: String(e.port || "") }), el("td", { text: e.reason }))));
        }));
        if (n++ % 15 === 0) jobs.push(costChart()); // every 30 s
        const res = await Promise.allSettled(jobs);
        const bad = res.find((x) => x.status === "rejected");
        if (bad) throw bad.reason;
      },
      leave() { out = null; if (term) term.close(); },
    };
  }

  // ---- usage ----
  function usageView() {
    show("usage");
    document.title = "Usage · withruntime";
    let n = 0;
    return {
      async poll() {
        if (n++ % 5) return; // every 10 s is plenty
        const today = new Date(); today.setUTCHours(0, 0, 0, 0);
        const from = new Date(today.getTime() - 13 * 86400000).toISOString().slice(0, 10);
        const [byDay, byKey, names] = await Promise.all([
          api(`/v1/usage?group_by=day&from=${from}`), api("/v1/usage?group_by=key"),
          auditor() ? keyNames() : Promise.resolve(new Map())]);
        const days = [];
        for (let i = 13; i >= 0; i--) days.push(new Date(today.getTime() - i * 86400000).toISOString().slice(0, 10));
        const per = new Map((byDay.data.rows || []).map((r) => [r.day, r.cost_micros]));
        const limit = me && me.key ? me.key.daily_limit_micros : null;
        const vals = days.map((d) => per.get(d) || 0);
        barChart($("u-chart"), vals, days.map((d) => d.slice(5)),
          { label: "cost per day over the last 14 days", fmt: usd, limit });
        const today_ = vals[vals.length - 1], all = vals.reduce((a, b) => a + b, 0);
        setText($("u-summary"), `Today (UTC): ${usd(today_)} spent` +
          (limit ? ` of this key's daily limit of ${usd(limit)} (${percent(today_, limit)})` : "; this key has no daily limit") +
          `. Last 14 days: ${usd(all)}.`);
        setText($("u-caption"), "Cost per UTC day" + (limit ? `; the red line is this key's daily limit, ${usd(limit)}` : "; this key has no daily limit"));
        $("u-key-rows").replaceChildren(...(byKey.data.rows || []).map((r) => el("tr", {},
          el("td", { text: who(names, r.key_id) }), el("td", { class: "num", text: usd(r.cost_micros) }),
          el("td", { class: "num", text: human(r.cpu_usec / 1e6) }),
          el("td", { class: "num", text: (r.memory_mib_ms / 1024 / 3600000).toFixed(3) }))));
        setText($("u-total"), `Today's total: ${usd(byKey.data.total_micros)}`);
      },
    };
  }

  // ---- keys and the audit trail (an auditor key's) ----
  // Who a key id is, for the audit trail: "name (key_...)"; from /v1/keys, asked with its ETag.
  async function keyNames() {
    const r = await api("/v1/keys");
    return new Map((r.data.keys || []).map((k) => [k.id, k.name]));
  }
  const who = (names, id) => id ? (names.has(id) ? `${names.get(id)} (${id})` : id) : "admin";
  // The Keys and Audit pages for a key that is not an auditor: a clear message, no calls.
  function denied(name) {
    const no = !auditor();
    $(name[0] + "-denied").hidden = !no;
    $(name[0] + "-body").hidden = no;
    return no;
  }
  function access(k) {
    return k.auditor ? "auditor" : k.metrics ? "metrics" : k.read_only ? "read-only" : "read-write";
  }
  function keysView() {
    show("keys");
    document.title = "Keys · withruntime";
    $("k-rows").replaceChildren();
    if (denied("keys")) return { async poll() {} };
    const rows = new Map(); // id -> cells
    return {
      async poll() {
        const r = await api("/v1/keys");
        if (!r.changed && rows.size) return;
        for (const k of r.data.keys || []) {
          let c = rows.get(k.id);
          if (!c) {
            c = {};
            const td = (n, cls) => (c[n] = el("td", { class: cls }));
            const tr = el("tr", { "data-key": k.id }, td("id"), td("name"), td("access"), td("owner"),
              td("limit", "num"), td("spent", "num"), td("created", "nowrap"), td("revoked", "nowrap"));
            rows.set(k.id, c);
            $("k-rows").append(tr);
          }
          setText(c.id, k.id);
          setText(c.name, k.name);
          setText(c.access, access(k));
          setText(c.owner, k.owner_id === k.id ? "itself" : k.owner_id);
          setText(c.limit, k.daily_limit_micros === null ? "none" : usd(k.daily_limit_micros));
          setText(c.spent, usd(k.spent_today_micros));
          setText(c.created, k.created_at);
          setText(c.revoked, k.revoked_at || "in use");
        }
      },
    };
  }
  function auditView() {
    show("audit");
    document.title = "Audit · withruntime";
    $("a-rows").replaceChildren();
    setText($("a-count"), "");
    $("a-older").hidden = true;
    if (denied("audit")) return { async poll() {} };
    const PAGE = 50;
    const seen = new Set();
    let names = new Map(), older = null; // older: the next page's `before`, null when none
    function row(e) {
      return el("tr", { "data-seq": e.seq }, el("td", { class: "nowrap", text: e.at }), el("td", { text: who(names, e.key_id) }),
        el("td", { text: e.method }), el("td", {}, el("code", { text: e.route })),
        el("td", { text: e.sandbox_id || "" }), el("td", { class: "num", text: String(e.status) }));
    }
    function add(entries, atTop) {
      const fresh = entries.filter((e) => !seen.has(e.seq));
      for (const e of fresh) seen.add(e.seq);
      const trs = fresh.map(row);
      if (atTop) $("a-rows").prepend(...trs); else $("a-rows").append(...trs);
      setText($("a-count"), `${seen.size} entries shown`);
    }
    function olderFrom(page) {
      older = page.next_before === undefined ? null : page.next_before;
      $("a-older").hidden = older === null;
    }
    $("a-older").onclick = async () => {
      if (older === null) return;
      $("a-older").disabled = true;
      try {
        const page = (await api(`/v1/audit?limit=${PAGE}&before=${older}`)).data;
        add(page.entries || [], false);
        olderFrom(page);
      } catch (e) { status("Could not load older entries: " + e.message, true); }
      $("a-older").disabled = false;
    };
    let first = true;
    return {
      async poll() {
        // the newest page, live; pages already loaded below it stay (entries never change)
        const [n, r] = await Promise.all([keyNames(), api(`/v1/audit?limit=${PAGE}`)]);
        names = n;
        if (!r.changed && !first) return;
        const entries = r.data.entries || [];
        if (!first && entries.length === PAGE && entries.every((e) => !seen.has(e.seq))) {
          // a whole page new since the last poll: there may be a gap, so start again from it
          seen.clear();
          $("a-rows").replaceChildren();
          first = true;
        }
        add(entries, !first);
        if (first) olderFrom(r.data);
        first = false;
      },
    };
  }

  // ---- start ----
  document.addEventListener("DOMContentLoaded", async () => {
    $("signin-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const key = $("key").value.trim();
      setText($("signin-error"), "");
      try {
        await signIn(key);
        $("key").value = "";
        if (!location.hash || location.hash === "#/signin") location.hash = auditor() ? "#/keys" : "#/sandboxes";
        else route();
        $("main").focus();
      } catch (e) {
        setText($("signin-error"), e.message);
        $("key").select();
      }
    });
    $("signout").addEventListener("click", () => signOut());
    window.addEventListener("hashchange", route);
    const saved = sessionStorage.getItem(KEY);
    if (saved) {
      try { await signIn(saved); } catch (e) { setText($("signin-error"), e.message); }
    }
    route();
  });
})();
