#!/usr/bin/env bash
# Refresh the vendored uPlot chart library from the npm registry.
# The dashboard has no build step, so the files are committed; bump UPLOT_VERSION and rerun.
set -euo pipefail

UPLOT_VERSION="1.6.32"
DEST="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/static/vendor/uplot"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm pack "uplot@${UPLOT_VERSION}" --silent >/dev/null
tar xzf "uplot-${UPLOT_VERSION}.tgz"
mkdir -p "$DEST"
cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE "$DEST/"
echo "$UPLOT_VERSION" >"$DEST/VERSION"
echo "uPlot ${UPLOT_VERSION} -> ${DEST}"
