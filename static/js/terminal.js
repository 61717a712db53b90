// A session's live terminal on xterm.js (static/vendor/xterm): virtualised scrollback, 256 colours
// and truecolour, `\r` and cursor movement, search, copy, and the stored output to download.
// Output is untrusted: xterm.js draws it as text, never as HTML. Airlock's own lines (a command's
// argv, a decision's message) are untrusted too, and have their control characters shown, not run.
(() => {
  const SCROLLBACK = 10000;
  const THEME = { background: "#0d1117", foreground: "#d6dde5", cursor: "#0d1117" };
  const META = "\x1b[2m", PROMPT = "\x1b[1;36m", DENIED = "\x1b[31m", RESET = "\x1b[0m";
  // After a command: leave the alternate screen and reset modes and colours it may have left set.
  const SANE = "\x1b[?1047l\x1b[!p";  // 1047, not 1049: that one also moves the cursor back

  // xterm.js writes its colours and cell sizes into <style> elements it creates, and takes no
  // nonce (upstream: xtermjs/xterm.js#4445); the page's CSP admits styles carrying this response's
  // nonce (controlplane/security.py). Stamped at creation, before insertion, as the CSP needs.
  const nonce = document.querySelector('meta[name="csp-nonce"]')?.content;
  if (nonce && !document.createElement.airlockNonce) {
    const create = document.createElement.bind(document);
    document.createElement = (tag, options) => {
      const element = create(tag, options);
      if (String(tag).toLowerCase() === "style") element.setAttribute("nonce", nonce);
      return element;
    };
    document.createElement.airlockNonce = true;
  }

  const visible = (text) => String(text).replace(/[\x00-\x1f\x7f-\x9f]/g,
    (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);

  // A link the output writes (OSC 8) is untrusted: http(s) only, shown before it opens, in a new
  // tab that cannot reach back to this page.
  const linkHandler = {
    allowNonHttpProtocols: false,
    activate: (event, uri) => {
      if (/^https?:\/\//i.test(uri) && window.confirm(`Open a link that a command's output holds?\n\n${uri}`)) {
        window.open(uri, "_blank", "noopener,noreferrer");
      }
    },
  };

  function makeTerminal(element, options = {}) {
    const terminal = new Terminal({
      convertEol: true, scrollback: SCROLLBACK, disableStdin: true, cursorBlink: false, cursorInactiveStyle: "none",
      fontFamily: getComputedStyle(document.body).getPropertyValue("--mono") || "monospace", fontSize: 13,
      theme: THEME, linkHandler, ...options,
    });
    const fit = new FitAddon.FitAddon();
    terminal.loadAddon(fit);
    terminal.open(element);
    fit.fit();
    if (options.rows) terminal.resize(terminal.cols, options.rows);  // a stored output: its own height
    return { terminal, fit };
  }

  // Every line of a terminal's buffer as text (what Copy copies, and what tests read).
  function bufferLines(terminal) {
    const buffer = terminal.buffer.active, lines = [];
    for (let index = 0; index < buffer.length; index++) {
      const line = buffer.getLine(index);
      if (!line) continue;
      if (line.isWrapped && lines.length) lines[lines.length - 1] += line.translateToString(true);
      else lines.push(line.translateToString(true));
    }
    while (lines.length && !lines[lines.length - 1]) lines.pop();
    return lines;
  }

  class SessionTerminal {
    constructor(element) {
      ({ terminal: this.terminal, fit: this.fit } = makeTerminal(element));
      this.search = new SearchAddon.SearchAddon();
      this.terminal.loadAddon(this.search);
      this.atLineStart = true;
      this.cut = document.querySelector("[data-terminal-cut]");
      new ResizeObserver(() => this.fit.fit()).observe(element);
    }

    write(data) {
      if (!data) return;
      // Once the buffer is full, older lines (long ones wrap into several) leave it: say so.
      this.terminal.write(data, () => {
        if (this.cut && this.terminal.buffer.active.length >= SCROLLBACK + this.terminal.rows) this.cut.hidden = false;
      });
      this.atLineStart = data.endsWith("\n");
    }

    meta(text, style = META) {
      this.write(`${this.atLineStart ? "" : "\r\n"}${style}${visible(text)}${RESET}\n`);
    }

    exited(event) {
      this.terminal.write(SANE);  // moves nothing: where the line stands is unchanged
      this.meta(`[exit ${event.exit_code ?? "—"} · ${event.reason}` +
        (event.duration_ms !== undefined && event.duration_ms !== null ? ` · ${event.duration_ms} ms` : "") + "]");
    }

    reset() {
      this.terminal.reset();
      this.atLineStart = true;
      if (this.cut) this.cut.hidden = true;
    }
  }

  function wireToolbar(view) {
    const query = document.querySelector("[data-terminal-search]");
    const find = (forward) => {
      if (!query.value) return;
      const found = forward ? view.search.findNext(query.value) : view.search.findPrevious(query.value);
      query.classList.toggle("not-found", !found);
    };
    query?.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); find(!event.shiftKey); }
    });
    document.querySelector("[data-terminal-next]")?.addEventListener("click", () => find(true));
    document.querySelector("[data-terminal-previous]")?.addEventListener("click", () => find(false));
    const copy = document.querySelector("[data-terminal-copy]");
    copy?.addEventListener("click", async () => {
      const text = view.terminal.hasSelection() ? view.terminal.getSelection() : bufferLines(view.terminal).join("\n");
      try {
        await navigator.clipboard.writeText(text);
        copy.textContent = "Copied";
      } catch {
        copy.textContent = "Copy refused by the browser";
      }
      setTimeout(() => { copy.textContent = "Copy"; }, 1500);
    });
  }

  function liveTerminal(element) {
    const view = new SessionTerminal(element);
    wireToolbar(view);
    window.Airlock = window.Airlock || {};
    Airlock.terminalLines = () => bufferLines(view.terminal);
    Airlock.terminalSelection = () => view.terminal.getSelection();
    Airlock.connect(element.dataset.ws, (event) => {
      Airlock.sessionEvent?.(event);  // the state badge and the tables (session_page.js)
      switch (event.event) {
        case "session.state":
          if (event.commands) {
            view.reset();
            for (const command of event.commands) {
              view.meta(`$ ${command.argv.join(" ")}`, PROMPT);
              if (command.truncated) view.meta("[… earlier output cut: only the last part is stored]");
              view.write(command.output);
              if (!["queued", "running"].includes(command.state)) view.exited(command);
            }
          }
          break;
        case "command.started": view.meta(`$ ${event.argv.join(" ")}`, PROMPT); break;
        case "command.output": view.write(event.data); break;
        case "command.exited": view.exited(event); break;
        case "decision": {
          const egress = event.request.host !== undefined;
          const what = egress ? `egress ${event.request.host}:${event.request.port}`
            : `${event.request.bin} ${(event.request.args || []).join(" ")}`;
          if (!event.decision.allowed) {
            view.meta(`✗ ${what}: ${event.decision.message}` + (event.decision.hint ? ` (${event.decision.hint})` : ""),
              DENIED);
          } else if (egress) {
            view.meta(`⇢ ${what}: ${event.decision.message}`);
          }
          break;
        }
        case "lagged":
          view.meta(`[… ${event.missed} events missed: the output came faster than this page could take it]`);
          break;
      }
    }, document.querySelector("[data-live-status]"));
  }

  // A stored output tail (the Commands table): drawn when opened, at its own height.
  function storedOutput(details) {
    details.addEventListener("toggle", () => {
      if (!details.open || details.dataset.drawn) return;
      details.dataset.drawn = "1";
      // As JSON, not as markup: the HTML parser would turn a progress bar's \r into \n.
      const text = JSON.parse(details.querySelector("script[type='application/json']").textContent);
      const rows = Math.min(24, Math.max(2, text.split("\n").length + 1));
      const { terminal } = makeTerminal(details.querySelector("[data-stored-terminal]"), { rows, scrollback: 5000 });
      terminal.write(text);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const element = document.querySelector("[data-terminal]");
    if (element) liveTerminal(element);
    for (const details of document.querySelectorAll("details[data-stored-output]")) storedOutput(details);
  });
})();
