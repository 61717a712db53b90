// The policy editor's CodeMirror 6, bundled by build.mjs into static/vendor/codemirror/codemirror.js
// as one script that defines window.CM (the page's CSP allows scripts from this origin only).
export { EditorView, keymap, hoverTooltip } from "@codemirror/view";
export { EditorState, Compartment } from "@codemirror/state";
export { basicSetup } from "codemirror";
export { indentWithTab } from "@codemirror/commands";
export { yaml, yamlLanguage } from "@codemirror/lang-yaml";
export { linter, lintGutter, forceLinting } from "@codemirror/lint";
export { MergeView } from "@codemirror/merge";
export { yamlCompletion, yamlSchemaHover } from "codemirror-json-schema/yaml";
export { stateExtensions } from "codemirror-json-schema";
export { oneDark } from "@codemirror/theme-one-dark";
