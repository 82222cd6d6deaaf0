#!/usr/bin/env bash
# Build the report of a results folder (default: the demo's) and screenshot it in headless Chromium.
#   benchmarks/screenshot_report.sh [RESULTS_DIR] [REPORT_DIR]     (HEIGHT=4000 for a taller page)
set -euo pipefail
RESULTS=${1:-results/demo}
OUT=${2:-$RESULTS/report}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$CHROME" ]; then
    echo "no chromium on PATH; install it (apt-get install chromium) or open $OUT/report.html yourself" >&2
    exit 1
fi
"$PY" -m hardrank.jobs.cli report "$RESULTS" --out "$OUT" >/dev/null
PROFILE=$(mktemp -d)
trap 'rm -rf "$PROFILE"' EXIT
# no network, no GPU, a throwaway profile: the report is self-contained
"$CHROME" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
    --disable-sync --no-first-run --user-data-dir="$PROFILE" --screenshot="$OUT/report.png" \
    --window-size="1400,${HEIGHT:-2400}" "file://$(realpath "$OUT/report.html")" 2>/dev/null
echo "$OUT/report.png"
