#!/usr/bin/env bash
# The GPU check in one command: CUDA tests, kernels / encoders / end to end against the hardware's limits.
#
#   bash benchmarks/gpu_check.sh [--out DIR] [gpu_check.py options]    (make gpu-check)
#
# Writes DIR/gpu_check.json and DIR/gpu_check.log; DIR is --out, else $OUT (the device machine's folder that
# comes back), else benchmarks/results/gpu_check. On a machine without CUDA the GPU parts are skipped and the
# rest runs at tiny sizes in seconds (CI runs it so). Carried wheels in .gpu_wheels/ (`make gpu-wheels`) are
# installed into a scratch folder when open_clip is missing. Exit status: 0 when no part failed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out="${OUT:-$root/benchmarks/results/gpu_check}"
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --out=*) out="${1#--out=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

# The interpreter: $PYTHON, else this checkout's .venv, else python3 (on the device: the one holding torch).
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi

mkdir -p "$out"
cd "$root" || exit 2
PYTHONUNBUFFERED=1 "$py" "$here/gpu_check.py" --out "$out" "${args[@]+"${args[@]}"}" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
