#!/usr/bin/env bash
# Re-makes the vendored front-end files under static/vendor/ from the npm registry, at the versions
# pinned in scripts/vendor/package.json and its lock file. Nothing is loaded from a CDN at run time;
# each package keeps its license beside it. The policy editor's CodeMirror is one bundle, built here
# with the pinned esbuild (scripts/vendor/build.mjs); everything else is copied as published.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp scripts/vendor/package.json scripts/vendor/package-lock.json scripts/vendor/*.mjs "$work/"
(cd "$work" && npm ci --silent --no-audit --no-fund)
modules=$work/node_modules

copy() {  # copy <package> <destination> <files...>: files of an installed package, flat
  local package=$1 dest=static/vendor/$2
  shift 2
  rm -rf "$dest" && mkdir -p "$dest"
  for file in "$@"; do cp "$modules/$package/$file" "$dest/"; done
  echo "vendored $package@$(node -p "require('$modules/$package/package.json').version") into $dest"
}

copy swagger-ui-dist swagger-ui LICENSE NOTICE swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt \
  swagger-ui.css swagger-ui-standalone-preset.js swagger-ui-standalone-preset.js.LICENSE.txt
copy chart.js chartjs LICENSE.md dist/chart.umd.min.js
copy @xterm/xterm xterm LICENSE lib/xterm.js css/xterm.css
copy @xterm/addon-fit xterm-addon-fit LICENSE lib/addon-fit.js
copy @xterm/addon-search xterm-addon-search LICENSE lib/addon-search.js

dest=static/vendor/codemirror
rm -rf "$dest" && mkdir -p "$dest"
(cd "$work" && node build.mjs "$root/$dest/codemirror.js" "$work/bundled.txt")
{
  echo "static/vendor/codemirror/codemirror.js bundles these npm packages (scripts/vendor/); their licenses follow."
  while read -r package; do
    version=$(node -p "require('$modules/$package/package.json').version")
    license=$(find "$modules/$package" -maxdepth 1 -iname 'licen[cs]e*' | head -n 1)
    printf '\n==== %s@%s ====\n\n' "$package" "$version"
    if [ -n "$license" ]; then cat "$license"; else node -p "'License: ' + require('$modules/$package/package.json').license"; fi
  done <"$work/bundled.txt"
} >"$dest/LICENSES.txt"
echo "bundled CodeMirror ($(wc -l <"$work/bundled.txt") packages) into $dest"
