// Bundles codemirror.mjs with the pinned esbuild (run by scripts/vendor.sh in a copy of this folder
// after `npm ci`). codemirror-json-schema renders its schema descriptions as Markdown through
// markdown-it and shiki (a highlighter that fetches grammars at run time and wants WebAssembly);
// ours are plain sentences, so that module is replaced by one that escapes text: a bundle of a
// third the size, no WebAssembly under the page's CSP, and no HTML made from any text.
import { build } from "esbuild";
import { writeFileSync } from "node:fs";

const plainText = {
  name: "plain-text-descriptions",
  setup(b) {
    b.onResolve({ filter: /\/utils\/markdown(\.js)?$/ }, () => ({ path: "markdown", namespace: "airlock" }));
    b.onLoad({ filter: /.*/, namespace: "airlock" }, () => ({
      contents: `export function renderMarkdown(text) {
        return String(text ?? "").replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
      }`,
      loader: "js",
    }));
  },
};

const result = await build({
  entryPoints: ["codemirror.mjs"], bundle: true, minify: true, format: "iife", globalName: "CM",
  outfile: process.argv[2], metafile: true, legalComments: "none", target: "es2020", plugins: [plainText],
});
// The packages inside the bundle, for their licenses.
const packages = new Set();
for (const input of Object.keys(result.metafile.inputs)) {
  const match = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)/);
  if (match) packages.add(match[1]);
}
writeFileSync(process.argv[3], [...packages].sort().join("\n") + "\n");
