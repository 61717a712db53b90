// A session's live terminal. Output is untrusted: it only ever becomes text nodes; ANSI SGR
// colour codes become classes, every other escape sequence is dropped.
(() => {
  const MAX_CHARS = 400000;
  const SGR = /\x1b\[([0-9;]*)m/g;
  const OTHER_ESCAPES = /\x1b\[[0-9;?]*[ -\/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;
  const PARTIAL_ESCAPE = /\x1b(?:\[[0-9;?]*[ -\/]*|\][^\x07\x1b]*)?$/;

  class AnsiWriter {
    constructor(element) { this.element = element; this.style = {}; this.carry = ""; this.chars = 0; }

    write(text, extraClass) {
      text = this.carry + text;
      const partial = text.match(PARTIAL_ESCAPE);
      this.carry = partial ? partial[0] : "";
      if (partial) text = text.slice(0, partial.index);
      let last = 0;
      for (const match of text.matchAll(SGR)) {
        this.span(text.slice(last, match.index), extraClass);
        this.apply(match[1]);
        last = match.index + match[0].length;
      }
      this.span(text.slice(last), extraClass);
    }

    line(text, className) { this.style = {}; this.span(text + "\n", className); }

    span(text, extraClass) {
      text = text.replace(OTHER_ESCAPES, "");
      if (!text) return;
      const span = document.createElement("span");
      span.textContent = text;
      const classes = [extraClass, this.style.fg && `fg-${this.style.fg}`, this.style.bg && `bg-${this.style.bg}`,
        this.style.bold && "bold"].filter(Boolean);
      if (classes.length) span.className = classes.join(" ");
      const follow = this.element.scrollTop + this.element.clientHeight >= this.element.scrollHeight - 4;
      this.element.appendChild(span);
      this.chars += text.length;
      while (this.chars > MAX_CHARS && this.element.firstChild) {
        this.chars -= this.element.firstChild.textContent.length;
        this.element.firstChild.remove();
      }
      if (follow) this.element.scrollTop = this.element.scrollHeight;
    }

    apply(codes) {
      for (const code of (codes || "0").split(";").map(Number)) {
        if (code === 0) this.style = {};
        else if (code === 1) this.style.bold = true;
        else if (code === 22) this.style.bold = false;
        else if (code >= 30 && code <= 37) this.style.fg = code - 30;
        else if (code >= 90 && code <= 97) this.style.fg = code - 90 + 8;
        else if (code === 39) this.style.fg = undefined;
        else if (code >= 40 && code <= 47) this.style.bg = code - 40;
        else if (code >= 100 && code <= 107) this.style.bg = code - 100 + 8;
        else if (code === 49) this.style.bg = undefined;
      }
    }
  }
  window.Airlock = window.Airlock || {};
  Airlock.AnsiWriter = AnsiWriter;

  document.addEventListener("DOMContentLoaded", () => {
    for (const pre of document.querySelectorAll("pre[data-ansi]")) {
      const text = pre.textContent;
      pre.textContent = "";
      new AnsiWriter(pre).write(text);
    }
    const terminal = document.querySelector("[data-terminal]");
    if (!terminal) return;
    const writer = new AnsiWriter(terminal);
    const badge = document.querySelector("[data-session-state]");
    const reason = document.querySelector("[data-session-reason]");
    const killForm = document.querySelector("[data-kill-form]");
    const setState = (state, why) => {
      badge.textContent = state;
      badge.className = `badge sstate-${state}`;
      if (reason && why !== undefined) reason.textContent = why;
      if (killForm && !["creating", "ready"].includes(state)) killForm.remove();
    };
    const exited = (event) => writer.line(`[exit ${event.exit_code ?? "—"} · ${event.reason}` +
      (event.duration_ms !== undefined ? ` · ${event.duration_ms} ms` : "") + "]", "meta");
    // The Decisions table gains each decision as it is made (at the end: the page lists oldest first).
    const decisions = document.querySelector("[data-decisions]");
    const addDecision = (event, what) => {
      if (!decisions) return;
      decisions.querySelector(".empty-row")?.closest("tr").remove();
      const row = document.createElement("tr");
      const cells = [new Date().toISOString().slice(11, 19), event.request.host !== undefined ? "egress" : "exec",
        what, event.decision.effect, event.decision.reason_code || "—", event.decision.rule_id || "—",
        event.decision.message + (event.decision.hint ? ` — ${event.decision.hint}` : "")];
      for (const [index, text] of cells.entries()) {
        const cell = document.createElement("td");
        if (index === 2) {
          const code = document.createElement("code");
          code.textContent = text;
          cell.appendChild(code);
        } else if (index === 3) {
          const badge = document.createElement("span");
          badge.className = `badge effect-${text}`;
          badge.textContent = text;
          cell.appendChild(badge);
        } else {
          cell.textContent = text;
        }
        row.appendChild(cell);
      }
      row.dataset.decision = event.decision.id || "";
      decisions.append(row);
    };
    Airlock.connect(terminal.dataset.ws, (event) => {
      switch (event.event) {
        case "session.state":
          setState(event.state, event.reason);
          if (event.commands) {
            terminal.replaceChildren();
            writer.chars = 0;
            for (const command of event.commands) {
              writer.line(`$ ${command.argv.join(" ")}`, "prompt");
              if (command.output) writer.write(command.output);
              if (!["queued", "running"].includes(command.state)) exited(command);
            }
          }
          break;
        case "command.started": writer.line(`$ ${event.argv.join(" ")}`, "prompt"); break;
        case "command.output": writer.write(event.data, event.stream === "stderr" ? "stderr" : ""); break;
        case "command.exited": writer.write("\n"); exited(event); break;
        case "decision": {
          const egress = event.request.host !== undefined;
          const what = egress ? `egress ${event.request.host}:${event.request.port}`
            : `${event.request.bin} ${(event.request.args || []).join(" ")}`;
          if (!event.decision.allowed) {
            writer.line(`✗ ${what}: ${event.decision.message}` +
              (event.decision.hint ? ` (${event.decision.hint})` : ""), "denied");
          } else if (egress) {
            writer.line(`⇢ ${what}: ${event.decision.message}`, "meta");
          }
          addDecision(event, what);
          break;
        }
        case "lagged": writer.line(`[… ${event.missed} events missed: the output came faster than this page could take it]`, "meta"); break;
      }
    }, document.querySelector("[data-live-status]"));
  });
})();
