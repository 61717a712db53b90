// A session's page, live: its Commands and Decisions tables gain rows as the stream tells them,
// a running command counts its seconds, and the state badge says `running` while one runs.
// Every text from the stream goes in as text (textContent), never as markup.
(() => {
  const cell = (text, className) => {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  };
  const code = (text) => {
    const td = document.createElement("td");
    const element = document.createElement("code");
    element.textContent = text;
    td.append(element);
    return td;
  };
  const badge = (text, className) => {
    const td = document.createElement("td");
    const element = document.createElement("span");
    element.className = `badge ${className}`;
    element.textContent = text;
    td.append(element);
    return { td, element };
  };
  // A message whose `quoted` parts are code, as the server's `ticks` filter shows it: text nodes and
  // <code> elements, never markup.
  const ticked = (element, text) => {
    String(text).split("`").forEach((part, index) => {
      if (index % 2) {
        const quoted = document.createElement("code");
        quoted.textContent = part;
        element.append(quoted);
      } else {
        element.append(part);
      }
    });
    return element;
  };
  const clock = () => new Date().toISOString().slice(11, 19);
  const seconds = (since) => Math.max(0, Math.round((Date.now() - since) / 1000));

  document.addEventListener("DOMContentLoaded", () => {
    const commands = document.querySelector("[data-commands] tbody");
    const decisions = document.querySelector("[data-decisions]");
    const state = document.querySelector("[data-session-state]");
    const reason = document.querySelector("[data-session-reason]");
    const killForm = document.querySelector("[data-kill-form]");
    if (!commands || !state) return;
    let running = null;  // {id, since}: the command running now, as the stream told

    const showState = () => {
      const base = state.dataset.state || state.textContent;
      state.dataset.state = base;
      if (running && base === "ready") {
        state.textContent = `running · ${seconds(running.since)} s`;
        state.className = "badge sstate-running";
      } else {
        state.textContent = base;
        state.className = `badge sstate-${base}`;
      }
    };
    const tick = () => {
      for (const element of document.querySelectorAll("[data-running-since]")) {
        element.textContent = `${seconds(Date.parse(element.dataset.runningSince))} s…`;
      }
      showState();
    };
    setInterval(tick, 1000);
    tick();

    const started = (event) => {
      commands.querySelector(".empty-row")?.closest("tr").remove();
      const row = document.createElement("tr");
      row.dataset.command = event.command;
      const { td: stateCell, element } = badge("running", "cstate-running");
      element.dataset.field = "state";
      const duration = cell("0 s…", "num");
      duration.dataset.field = "duration_ms";
      duration.dataset.runningSince = new Date().toISOString();
      const exitCell = cell("—", "num");
      exitCell.dataset.field = "exit_code";
      const reasonCell = cell("");
      reasonCell.dataset.field = "reason";
      row.append(cell(clock(), "nowrap"), code(event.argv.join(" ")), stateCell, exitCell, reasonCell, duration,
        cell("", "details"));
      commands.append(row);
      running = { id: event.command, since: Date.now() };
      showState();
    };
    const exited = (event) => {
      const row = commands.querySelector(`tr[data-command="${CSS.escape(event.command)}"]`);
      if (row) {
        const stateBadge = row.querySelector("[data-field=state]");
        const ended = event.reason === "exited" ? "exited" : event.reason;
        stateBadge.textContent = ended;
        stateBadge.className = `badge cstate-${ended}`;
        row.querySelector("[data-field=exit_code]").textContent = event.exit_code ?? "—";
        row.querySelector("[data-field=reason]").textContent = event.reason;
        const duration = row.querySelector("[data-field=duration_ms]");
        delete duration.dataset.runningSince;
        duration.textContent = event.duration_ms ?? "—";
      }
      if (running && running.id === event.command) running = null;
      showState();
    };
    const decided = (event) => {
      if (!decisions) return;
      decisions.querySelector(".empty-row")?.closest("tr").remove();
      const egress = event.request.host !== undefined;
      const what = egress ? `${event.request.host}:${event.request.port}`
        : `${event.request.bin} ${(event.request.args || []).join(" ")}`;
      const row = document.createElement("tr");
      row.dataset.decision = event.decision.id || "";
      const explanation = ticked(cell("", "details"), event.decision.message);
      if (event.decision.hint) {
        const hint = document.createElement("span");
        hint.className = "muted";
        explanation.append(document.createElement("br"), ticked(hint, event.decision.hint));
      }
      row.append(cell(clock(), "nowrap"), cell(egress ? "egress" : "exec"), code(what),
        badge(event.decision.effect, `effect-${event.decision.effect}`).td, cell(event.decision.reason_code || "—"),
        cell(event.decision.rule_id || "—"), explanation);
      decisions.append(row);
    };

    window.Airlock = window.Airlock || {};
    Airlock.sessionEvent = (event) => {
      switch (event.event) {
        case "session.state":
          state.dataset.state = event.state;
          if (reason && event.reason !== undefined) reason.textContent = event.reason;
          if (killForm && !["creating", "ready"].includes(event.state)) killForm.remove();
          if (event.commands) {
            const live = event.commands.find((command) => command.state === "running");
            const shown = live && commands.querySelector(`tr[data-command="${CSS.escape(live.command)}"] [data-running-since]`);
            running = live ? { id: live.command, since: Date.parse(shown?.dataset.runningSince) || Date.now() } : null;
          }
          showState();
          break;
        case "command.started": started(event); break;
        case "command.exited": exited(event); break;
        case "decision": decided(event); break;
      }
    };
  });
})();
