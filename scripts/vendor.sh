#!/usr/bin/env bash
# Re-fetches the vendored front-end files under static/vendor/ from the npm registry.
# Nothing is loaded from a CDN at run time; each package keeps its license beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

vendor() {  # vendor <package@version> <destination> <files...>
  local spec=$1 dest=static/vendor/$2
  shift 2
  (cd "$work" && npm pack --silent "$spec" >/dev/null && tar xzf ./*.tgz && rm ./*.tgz)
  mkdir -p "$dest"
  for file in "$@"; do cp "$work/package/$file" "$dest/"; done
  rm -rf "$work/package"
  echo "vendored $spec into $dest"
}

vendor swagger-ui-dist@5.35.0 swagger-ui LICENSE NOTICE swagger-ui-bundle.js \
  swagger-ui-bundle.js.LICENSE.txt swagger-ui.css swagger-ui-standalone-preset.js \
  swagger-ui-standalone-preset.js.LICENSE.txt
vendor chart.js@4.6.1 chartjs LICENSE.md dist/chart.umd.min.js
