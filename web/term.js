// withruntime dashboard: a terminal into a sandbox over the API's sessions (docs/api.md,
// "Sessions"): POST .../sessions makes a login shell on a pseudo-terminal, and its WebSocket
// carries the bytes both ways, the key offered as the subprotocol withruntime.key.<key>.
// The renderer is a small VT100 subset of its own: enough for a shell prompt, line editing
// (readline's cursor moves and erases), colours ignored. No third-party code.
"use strict";

(function () {
  const SCROLLBACK = 1000;

  class Screen {
    constructor(rows, cols) { this.resize(rows, cols); this.scroll = []; this.x = 0; this.y = 0; this.state = 0; this.params = ""; }
    resize(rows, cols) {
      const old = this.lines || [];
      this.rows = rows; this.cols = cols;
      this.lines = [];
      for (let i = 0; i < rows; i++) this.lines.push(this.blank(old[i + Math.max(0, old.length - rows)]));
      this.x = Math.min(this.x || 0, cols - 1); this.y = Math.min(this.y || 0, rows - 1);
    }
    blank(from) { const l = new Array(this.cols).fill(" "); if (from) for (let i = 0; i < Math.min(this.cols, from.length); i++) l[i] = from[i]; return l; }
    newline() {
      if (this.y === this.rows - 1) {
        this.scroll.push(this.lines.shift().join("").replace(/\s+$/, ""));
        if (this.scroll.length > SCROLLBACK) this.scroll.shift();
        this.lines.push(this.blank());
      } else this.y++;
    }
    put(ch) {
      if (this.x >= this.cols) { this.x = 0; this.newline(); }
      this.lines[this.y][this.x++] = ch;
    }
    eraseLine(mode) {
      const l = this.lines[this.y];
      const [a, b] = mode === 1 ? [0, this.x + 1] : mode === 2 ? [0, this.cols] : [this.x, this.cols];
      for (let i = a; i < Math.min(b, this.cols); i++) l[i] = " ";
    }
    csi(final, params) {
      const priv = params.startsWith("?");
      const ps = (priv ? params.slice(1) : params).split(";").map((p) => parseInt(p, 10));
      const n = (i, d) => (isNaN(ps[i]) || ps[i] === 0 ? d : ps[i]);
      const clampX = (v) => Math.max(0, Math.min(this.cols - 1, v));
      const clampY = (v) => Math.max(0, Math.min(this.rows - 1, v));
      switch (final) {
        case "A": this.y = clampY(this.y - n(0, 1)); break;
        case "B": this.y = clampY(this.y + n(0, 1)); break;
        case "C": this.x = clampX(this.x + n(0, 1)); break;
        case "D": this.x = clampX(Math.min(this.x, this.cols - 1) - n(0, 1)); break;
        case "G": this.x = clampX(n(0, 1) - 1); break;
        case "d": this.y = clampY(n(0, 1) - 1); break;
        case "H": case "f": this.y = clampY(n(0, 1) - 1); this.x = clampX(n(1, 1) - 1); break;
        case "K": this.eraseLine(isNaN(ps[0]) ? 0 : ps[0]); break;
        case "J": {
          const mode = isNaN(ps[0]) ? 0 : ps[0];
          if (mode === 2 || mode === 3) { for (let i = 0; i < this.rows; i++) this.lines[i] = this.blank(); }
          else if (mode === 0) { this.eraseLine(0); for (let i = this.y + 1; i < this.rows; i++) this.lines[i] = this.blank(); }
          else { this.eraseLine(1); for (let i = 0; i < this.y; i++) this.lines[i] = this.blank(); }
          break;
        }
        case "P": { const l = this.lines[this.y]; l.splice(this.x, n(0, 1)); while (l.length < this.cols) l.push(" "); break; }
        case "@": { const l = this.lines[this.y]; l.splice(this.x, 0, ...new Array(n(0, 1)).fill(" ")); l.length = this.cols; break; }
        case "X": for (let i = this.x; i < Math.min(this.cols, this.x + n(0, 1)); i++) this.lines[this.y][i] = " "; break;
        default: break; // m (colours), h/l (modes), r, ...: not drawn
      }
    }
    write(text) {
      for (const ch of text) {
        const c = ch.codePointAt(0);
        if (this.state === 1) { // after ESC
          if (ch === "[") { this.state = 2; this.params = ""; }
          else if (ch === "]") { this.state = 3; }
          else this.state = 0; // ESC = ESC > ESC 7 ...: ignored
          continue;
        }
        if (this.state === 2) { // CSI
          if (c >= 0x40 && c <= 0x7e) { this.state = 0; this.csi(ch, this.params); }
          else if (this.params.length < 64) this.params += ch;
          continue;
        }
        if (this.state === 3) { // OSC: up to BEL or ESC \
          if (c === 7) this.state = 0; else if (c === 27) this.state = 1;
          continue;
        }
        if (c === 27) this.state = 1;
        else if (ch === "\r") this.x = 0;
        else if (ch === "\n") this.newline();
        else if (ch === "\b") this.x = Math.max(0, Math.min(this.x, this.cols) - 1);
        else if (ch === "\t") this.x = Math.min(this.cols - 1, (Math.floor(this.x / 8) + 1) * 8);
        else if (c >= 32 && c !== 127) this.put(ch);
      }
    }
  }

  const KEYS = { Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A", ArrowDown: "\x1b[B",
    ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D", Home: "\x1b[H", End: "\x1b[F", Delete: "\x1b[3~",
    PageUp: "\x1b[5~", PageDown: "\x1b[6~" };

  function mount(panel, id, readOnly, api) {
    let ws = null, session = null, screen = null, state = "";
    const out = document.createElement("div");
    out.className = "term";
    out.tabIndex = 0;
    out.setAttribute("role", "log");
    out.setAttribute("aria-label", "Terminal: click or focus it, then type");
    out.id = "term";
    const open = document.createElement("button");
    open.type = "button"; open.id = "term-open"; open.textContent = "Open terminal";
    const close = document.createElement("button");
    close.type = "button"; close.className = "secondary"; close.id = "term-close"; close.textContent = "Close terminal"; close.hidden = true;
    const note = document.createElement("p");
    note.className = "hint";
    const bar = document.createElement("div");
    bar.className = "actions";
    bar.append(open, close);
    panel.replaceChildren(bar, note, out);
    out.hidden = true;
    if (readOnly) {
      open.disabled = true;
      note.textContent = "A terminal needs a full key: this one is read-only.";
    }

    let pending = false;
    function draw() {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        if (!screen) return;
        const lines = screen.lines.map((l) => l.join("").replace(/\s+$/, ""));
        let last = lines.length - 1;
        while (last > screen.y && !lines[last].trim()) last--;
        const frag = document.createDocumentFragment();
        const before = screen.scroll.concat(lines.slice(0, screen.y)).join("\n");
        const row = screen.lines[screen.y].join("");
        const cx = Math.min(screen.x, screen.cols - 1);
        frag.append(document.createTextNode((before ? before + "\n" : "") + row.slice(0, cx)));
        const cur = document.createElement("span");
        cur.className = "cursor";
        cur.textContent = row[cx] || " ";
        frag.append(cur);
        const after = row.slice(cx + 1).replace(/\s+$/, "") + (last > screen.y ? "\n" + lines.slice(screen.y + 1, last + 1).join("\n") : "");
        frag.append(document.createTextNode(after));
        out.replaceChildren(frag);
        out.scrollTop = out.scrollHeight;
      });
    }
    const enc = new TextEncoder();
    function send(s) { if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(s)); }
    function size() {
      const cols = Math.max(20, Math.min(200, Math.floor((panel.clientWidth || 800) / 8) - 2));
      return { rows: 24, cols };
    }
    out.addEventListener("keydown", (ev) => {
      if (!ws) return;
      let s = null;
      if (ev.ctrlKey && !ev.altKey && ev.key.length === 1) {
        const k = ev.key.toUpperCase().charCodeAt(0);
        if (k >= 64 && k <= 95) s = String.fromCharCode(k - 64);
      } else if (KEYS[ev.key]) s = KEYS[ev.key];
      else if (ev.key.length === 1 && !ev.metaKey) s = (ev.altKey ? "\x1b" : "") + ev.key;
      if (s !== null) { ev.preventDefault(); send(s); }
    });
    out.addEventListener("paste", (ev) => { ev.preventDefault(); send(ev.clipboardData.getData("text")); });

    async function start() {
      open.disabled = true;
      note.textContent = "Starting a shell…";
      const { rows, cols } = size();
      try {
        session = (await api(`/v1/sandboxes/${id}/sessions`, { method: "POST", json: { rows, cols } })).data;
      } catch (e) {
        note.textContent = "Could not start a shell: " + e.message;
        open.disabled = state !== "running";
        return;
      }
      screen = new Screen(rows, cols);
      const dec = new TextDecoder();
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      const key = sessionStorage.getItem("withruntime.key");
      ws = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${id}/sessions/${session.id}/connect`,
        ["withruntime", "withruntime.key." + key]);
      ws.binaryType = "arraybuffer";
      ws.onopen = () => { note.textContent = `Connected to ${session.id}.`; close.hidden = false; out.hidden = false; out.focus(); draw(); };
      ws.onmessage = (m) => {
        if (typeof m.data === "string") {
          let msg = {};
          try { msg = JSON.parse(m.data); } catch (e) { return; }
          if (msg.type === "exit") screen.write(`\r\n[exited${msg.exit_code !== null && msg.exit_code !== undefined ? " " + msg.exit_code : ""}${msg.error ? ": " + msg.error : ""}]\r\n`);
        } else screen.write(dec.decode(m.data, { stream: true }));
        draw();
      };
      ws.onclose = (ev) => {
        note.textContent = `Disconnected${ev.code && ev.code !== 1000 ? ` (${ev.code})` : ""}.`;
        ws = null;
        close.hidden = true;
        open.disabled = state !== "running";
      };
    }
    async function stop() {
      const s = session;
      session = null;
      if (ws) ws.close(1000);
      if (s) await api(`/v1/sandboxes/${id}/sessions/${s.id}`, { method: "DELETE" }).catch(() => {});
    }
    open.addEventListener("click", start);
    close.addEventListener("click", stop);
    window.addEventListener("resize", () => {
      if (!ws || !screen) return;
      const { rows, cols } = size();
      if (cols === screen.cols) return;
      screen.resize(rows, cols);
      ws.send(JSON.stringify({ type: "resize", rows, cols }));
      draw();
    });
    return {
      state(s) { state = s; if (!readOnly && !ws) open.disabled = s !== "running"; },
      close() { stop(); },
    };
  }

  window.wrTerminal = { mount };
})();
