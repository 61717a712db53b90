// The policy editor on CodeMirror 6 (static/vendor/codemirror): YAML highlighting, completion and
// hover docs from the policy's JSON Schema, Tab indents (Esc, then Tab, leaves the editor), and
// marks at their lines for schema errors, lint warnings and failing tests as one types, checked by
// the server (…/check: the same review as saving, nothing saved) with the review panel redrawn, no
// reload. A side-by-side diff against the published version, and a box that judges one request
// with the document as it stands. Without the bundle the plain textarea and its buttons still work.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.querySelector("[data-editor-form]");
  if (!form || !window.CM) return;
  const textarea = form.querySelector("textarea[name=source]");
  const schema = JSON.parse(document.getElementById("policy-schema").textContent);
  const published = JSON.parse(document.getElementById("published-source").textContent);
  const panel = document.querySelector("[data-review-panel]");
  const status = form.querySelector("[data-check-status]");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  // CodeMirror writes its styles into a <style> element that carries the page's CSP nonce.
  const nonce = CM.EditorView.cspNonce.of(document.querySelector('meta[name="csp-nonce"]')?.content || "");
  const theme = window.matchMedia("(prefers-color-scheme: dark)").matches ? [CM.oneDark] : [];
  window.Airlock = window.Airlock || {};
  Airlock.editorMarks = [];

  // A check as one types and a replay asked for by the button run side by side: neither aborts the
  // other (a lint firing just after the click must not drop the replay), and the panel shows the
  // replay until the document changes.
  const pending = { lint: null, replay: null };
  let replayed = null;  // the source whose replay the panel shows
  const check = async (source, { replay = false } = {}) => {
    const kind = replay ? "replay" : "lint";
    pending[kind]?.abort();
    const controller = pending[kind] = new AbortController();
    const body = new FormData();
    body.append("csrfmiddlewaretoken", csrf);
    body.append("source", source);
    if (replay) body.append("replay", "1");
    status.textContent = replay ? "replaying…" : "checking…";
    try {
      const response = await fetch(form.dataset.checkUrl, { method: "POST", body, signal: controller.signal,
        headers: { "X-CSRFToken": csrf }, credentials: "same-origin" });
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const result = await response.json();
      if (source !== view.state.doc.toString()) return result.marks;  // typed over while it ran: stale
      if (replay) replayed = source;
      if (replay || source !== replayed) panel.innerHTML = result.panel;  // rendered by the server's template: escaped there
      Airlock.editorMarks = result.marks;
      const errors = result.marks.filter((mark) => mark.severity === "error").length;
      status.textContent = errors ? `${errors} problem${errors === 1 ? "" : "s"}` : "checked: valid";
      return result.marks;
    } catch (error) {
      if (error.name === "AbortError") return null;
      status.textContent = `not checked: ${error.message}`;
      return [];
    }
  };
  const diagnostics = (doc, found) => found.map((mark) => {
    const line = doc.line(Math.min(Math.max(mark.line || 1, 1), doc.lines));
    return { from: line.from, to: line.to, severity: mark.severity, message: mark.message };
  });
  const lintSource = async (view) => {
    const found = await check(view.state.doc.toString());
    return found === null ? [] : diagnostics(view.state.doc, found);
  };

  // Where the schema library offers nothing: a line that has only begun a key ("limits:", Enter,
  // "com…", which YAML reads as the value of the key above) gets the keys of the mapping its
  // indentation puts it in, and `key: ` the values the schema allows there (an enum, a boolean).
  const resolve = (node) => {
    while (node && node.$ref) node = schema.$defs[node.$ref.split("/").pop()];
    const choice = node && (node.anyOf || node.oneOf)?.find((option) => option.type !== "null");
    return choice ? resolve(choice) : node;
  };
  // The path of keys ("[]": a list's item) to the mapping that holds a line indented `limit`.
  const pathAbove = (doc, lineNumber, limit, dashed) => {
    const path = dashed ? ["[]"] : [];
    for (let number = lineNumber - 1; number >= 1 && limit > 0; number--) {
      const text = doc.line(number).text;
      if (!text.trim() || text.trim().startsWith("#")) continue;
      const parsed = text.match(/^(\s*)(-\s+)?(?:([A-Za-z_][\w-]*)\s*:)?/);
      const indent = parsed[1].length, content = indent + (parsed[2] ? parsed[2].length : 0);
      if (indent >= limit) continue;
      if (content < limit || !parsed[2]) {
        if (!parsed[3]) return null;
        path.unshift(parsed[3]);
      }
      if (parsed[2]) path.unshift("[]");
      limit = indent;
    }
    let node = resolve(schema);
    for (const step of path) node = resolve(step === "[]" ? node?.items : node?.properties?.[step]);
    return node;
  };
  const keyCompletion = (context, line, typed) => {
    const node = pathAbove(context.state.doc, line.number, typed[1].length, Boolean(typed[2]));
    if (!node?.properties) return null;
    return {
      from: context.pos - (typed[3] || "").length,
      options: Object.entries(node.properties).map(([name, property]) => {
        const described = resolve(property) || {};
        return { label: name, type: "property", apply: `${name}: `,
          detail: described.type || (described.enum ? described.enum.join(" | ") : ""),
          info: property.description || described.description || undefined };
      }),
      validFor: /^[\w-]*$/,
    };
  };
  const valueCompletion = (context, line, typed) => {
    const holder = pathAbove(context.state.doc, line.number, typed[1].length, Boolean(typed[2]));
    const property = resolve(holder?.properties?.[typed[3]]);
    const values = property?.enum || (property?.type === "boolean" ? [true, false] : null);
    if (!values) return null;
    return { from: context.pos - typed[4].length, validFor: /^[\w-]*$/,
      options: values.filter((value) => value !== null).map((value) => ({ label: String(value), type: "enum" })) };
  };
  const ownCompletion = (context) => {
    const line = context.state.doc.lineAt(context.pos);
    const before = line.text.slice(0, context.pos - line.from);
    const key = before.match(/^(\s*)(-\s+)?([A-Za-z_][\w-]*)?$/);
    if (key && (key[3] || context.explicit)) return keyCompletion(context, line, key);
    const value = before.match(/^(\s*)(-\s+)?([A-Za-z_][\w-]*):\s*([\w-]*)$/);
    return value ? valueCompletion(context, line, value) : null;
  };
  const schemaCompletion = CM.yamlCompletion();
  const completion = async (context) => {
    const found = await schemaCompletion(context);
    return found?.options?.length ? found : ownCompletion(context);
  };

  // Enter after `key:` opens the mapping below it, indented (CodeMirror's YAML keeps the indent).
  const enterAfterKey = (view) => {
    const range = view.state.selection.main;
    const line = view.state.doc.lineAt(range.head);
    const before = line.text.slice(0, range.head - line.from);
    if (!range.empty || !/^\s*(-\s+)?[^#\s][^#]*:\s*$/.test(before)) return false;
    const column = before.match(/^\s*(-\s+)?/)[0].length;
    view.dispatch(view.state.replaceSelection("\n" + " ".repeat(column + 2)), { scrollIntoView: true });
    return true;
  };

  const host = form.querySelector("[data-code-editor]");
  const view = new CM.EditorView({
    doc: textarea.value,
    parent: host,
    extensions: [
      nonce,
      theme,
      CM.keymap.of([{ key: "Enter", run: enterAfterKey }, CM.indentWithTab]),
      CM.basicSetup,
      CM.yaml(),
      CM.stateExtensions(schema),
      CM.yamlLanguage.data.of({ autocomplete: completion }),
      CM.hoverTooltip(CM.yamlSchemaHover()),
      CM.linter(lintSource, { delay: 400 }),
      CM.lintGutter(),
      CM.EditorView.updateListener.of((update) => {
        if (update.docChanged) textarea.value = update.state.doc.toString();
      }),
      CM.EditorView.contentAttributes.of({ "aria-label": "Policy YAML" }),
    ],
  });
  Airlock.editor = view;
  form.querySelector("[data-plain-editor]").hidden = true;
  host.hidden = false;

  // Check and Check-and-replay answer in place; Save draft submits the form as before.
  form.addEventListener("click", (event) => {
    const button = event.target.closest("button[name=action]");
    if (!button || button.value === "save") return;
    event.preventDefault();
    if (button.value === "replay") check(view.state.doc.toString(), { replay: true });
    else CM.forceLinting(view);
  });

  // The diff: published on the left, this document on the right, both read-only here.
  const tabs = form.querySelector("[data-editor-tabs]");
  const mergeHost = form.querySelector("[data-merge]");
  let merge = null;
  tabs.hidden = false;
  tabs.addEventListener("click", (event) => {
    const tab = event.target.closest("[data-tab]");
    if (!tab) return;
    for (const other of tabs.querySelectorAll("[data-tab]")) other.setAttribute("aria-selected", String(other === tab));
    const diff = tab.dataset.tab === "diff";
    const floorShown = tab.dataset.tab === "floor";
    merge?.destroy();
    merge = null;
    const floorSource = form.querySelector("[data-floor]");
    if (floorSource) floorSource.hidden = !floorShown;
    if (diff) {
      const readOnly = [nonce, theme, CM.basicSetup, CM.yaml(), CM.EditorState.readOnly.of(true), CM.EditorView.editable.of(false)];
      merge = new CM.MergeView({ a: { doc: published, extensions: readOnly },
        b: { doc: view.state.doc.toString(), extensions: readOnly }, parent: mergeHost });
    }
    mergeHost.hidden = !diff;
    host.hidden = diff || floorShown;
  });

  // Try a request: judged by the document in the editor, nothing recorded.
  const tryForm = document.querySelector("[data-try-form]");
  const tryResult = document.querySelector("[data-try-result]");
  tryForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = new FormData(tryForm);
    body.set("source", view.state.doc.toString());
    const response = await fetch(tryForm.action, { method: "POST", body, credentials: "same-origin" });
    const result = await response.json();
    tryResult.replaceChildren();
    if (!response.ok) {
      tryResult.textContent = result.detail || Object.values(result.fields || {}).flat().join(" ") || "not judged";
      return;
    }
    const decision = result.decision;
    const badge = document.createElement("span");
    badge.className = `badge effect-${decision.effect}`;
    badge.textContent = decision.effect;
    badge.dataset.testid = "try-effect";
    const why = document.createElement("span");
    why.textContent = ` ${decision.reason_code ? decision.reason_code + ": " : ""}${decision.message}` +
      (decision.hint ? ` — ${decision.hint}` : "");
    tryResult.append(badge, why);
  });
});
