// The tenant's live session list: rows change and appear without a reload.
document.addEventListener("DOMContentLoaded", () => {
  const table = document.querySelector("[data-session-table]");
  if (!table) return;
  const body = table.querySelector("tbody");
  const { filterState, filterConversation, detailBase } = table.dataset;
  const active = ["creating", "ready"];
  const matches = (session) => (!filterConversation || session.conversation_id === filterConversation) &&
    (!filterState || filterState === session.state || (filterState === "active" && active.includes(session.state)));
  const age = (iso) => {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) return `${seconds} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
    return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  };
  const bytes = (value) => value == null ? "—" : value < 1048576 ? `${(value / 1024).toFixed(0)} KB` : `${(value / 1048576).toFixed(1)} MB`;
  const cell = (field, className) => {
    const td = document.createElement("td");
    td.dataset.field = field;
    if (className) td.className = className;
    return td;
  };
  const newRow = (session) => {
    const row = document.createElement("tr");
    row.dataset.session = session.id;
    const link = document.createElement("a");
    link.href = `${detailBase}${session.id}/`;
    const code = document.createElement("code");
    code.textContent = session.id.slice(0, 8);
    link.appendChild(code);
    const first = document.createElement("td");
    first.appendChild(link);
    const state = cell("state");
    state.appendChild(document.createElement("span"));
    const running = cell("running");
    running.appendChild(document.createElement("code"));
    row.append(first, state, cell("conversation_id"), cell("age", "nowrap"), running, cell("cpu_s", "num"),
      cell("memory_bytes", "num"), cell("policy_version"));
    const empty = body.querySelector(".empty-row-holder");
    if (empty) empty.remove();
    body.prepend(row);
    return row;
  };
  const badgeOf = (row) => {
    const badge = row.querySelector('[data-field="state"]');
    return badge.tagName === "SPAN" ? badge : badge.querySelector("span");
  };
  // A ready session whose command runs shows `running · N s`, counted from the command's start.
  const showState = (badge) => {
    const since = Date.parse(badge.dataset.runningSince || "");
    const running = badge.dataset.state === "ready" && !Number.isNaN(since);
    badge.textContent = running ? `running · ${Math.max(0, Math.round((Date.now() - since) / 1000))} s` : badge.dataset.state;
    badge.className = `badge sstate-${running ? "running" : badge.dataset.state}`;
  };
  const update = (session) => {
    let row = body.querySelector(`tr[data-session="${CSS.escape(session.id)}"]`);
    if (!row) {
      // A new session goes on top of the newest-first order; another order shows it on a reload.
      if (!matches(session) || (table.dataset.sort || "age") !== "age") return;
      row = newRow(session);
    }
    const stateBadge = badgeOf(row);
    stateBadge.dataset.state = session.state;
    stateBadge.title = session.state_reason || "";
    showState(stateBadge);
    row.querySelector('[data-field="conversation_id"]').textContent = session.conversation_id;
    const ageCell = row.querySelector('[data-field="age"]');
    ageCell.dataset.since = session.created_at;
    ageCell.textContent = age(session.created_at);
    row.querySelector('[data-field="running"] code').textContent = session.running || "";
    row.querySelector('[data-field="cpu_s"]').textContent = session.cpu_s == null ? "—" : session.cpu_s.toFixed(2);
    row.querySelector('[data-field="memory_bytes"]').textContent = bytes(session.memory_bytes);
    row.querySelector('[data-field="policy_version"]').textContent = session.policy_version;
  };
  Airlock.connect(table.dataset.ws, (event) => {
    if (event.event === "session.updated") update(event.session);
    if (event.event === "session.activity") {
      const row = body.querySelector(`tr[data-session="${CSS.escape(event.session)}"]`);
      if (!row) return;
      row.querySelector('[data-field="running"] code').textContent = event.running;
      const badge = badgeOf(row);
      if (event.running && event.running_since) badge.dataset.runningSince = new Date(event.running_since * 1000).toISOString();
      else delete badge.dataset.runningSince;
      showState(badge);
      if (event.cpu_s != null) row.querySelector('[data-field="cpu_s"]').textContent = event.cpu_s.toFixed(2);
      if (event.memory_bytes != null) row.querySelector('[data-field="memory_bytes"]').textContent = bytes(event.memory_bytes);
    }
  }, document.querySelector("[data-live-status]"));
  for (const badge of body.querySelectorAll('[data-field="state"]')) showState(badge);
  setInterval(() => {
    for (const badge of body.querySelectorAll('[data-running-since]')) showState(badge);
  }, 1000);
  setInterval(() => {
    for (const ageCell of body.querySelectorAll('[data-field="age"][data-since]')) ageCell.textContent = age(ageCell.dataset.since);
  }, 10000);
});
