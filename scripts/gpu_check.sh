#!/usr/bin/env bash
# The GPU proof in one call, on a lent GPU machine (one GPU, 16 cores, no network; torch, CuPy, timm
# and pytest there, Hydra, tensorboardX and Horovod not): installs the few pure-Python wheels carried in
# .gpu-wheels/ (scripts/gpu_wheels.sh, run first where the registry is reachable), those the machine
# lacks only, into a private folder (its own pytest and plugins stay in force), builds the
# CPU kernels, then runs scripts/gpu_check.py's sections: 6 minutes by their own estimate (printed
# first), stopped at BOUND_S, $OUT/report.md rewritten after every section (docs/guide/benchmarks.md,
# "The GPU check"). A 15-minute lease: a start (1-2 min) + this (6.5) + a rerun on the warm machine.
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=420)
#   here:         bash scripts/gpu_check.sh --cpu      (the same sections on the CPU; a test runs it)
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
[ "${1:-}" = "--cpu" ] && DEVICE=cpu
OUT=${OUT:-outputs/gpu-check}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  PY=${PYTHON:-python3}
  EXTRA=$(mktemp -d)
  missing=()
  for pkg in hydra omegaconf antlr4 tensorboardX; do
    "$PY" -c "import $pkg" 2>/dev/null || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then  # only what the machine lacks: nothing of its own is shadowed
    "$PY" -m pip install -q --no-index --no-deps --find-links .gpu-wheels --target "$EXTRA" \
      hydra-core omegaconf antlr4-python3-runtime tensorboardX > "$OUT/install.txt" 2>&1 \
      || echo "note: the wheels did not all install (see install.txt)" | tee -a "$OUT/install.txt"
  fi
  # only packages the machine lacks are in $EXTRA: its pytest, plugins and numpy stay its own
  export PYTHONPATH="$PWD/src:$PWD:$EXTRA:${PYTHONPATH:-}"
  export COMPBENCH_CONF_DIR="$PWD/conf"
else
  PY=${PYTHON:-.venv/bin/python}
fi
export PYTHONUNBUFFERED=1
"$PY" -c 'from compbench.compll.generated import build_kernels; build_kernels()' > "$OUT/kernels.txt" 2>&1 \
  || echo "note: the CPU kernels did not build (see kernels.txt); their twins run" | tee -a "$OUT/kernels.txt"
BOUND_S=390  # the check's estimate is 360 s; its sections skip what their budgets cannot hold
timeout -k 10 $BOUND_S "$PY" scripts/gpu_check.py --device "$DEVICE" --out "$OUT"
code=$?
[ $code -eq 124 ] || [ $code -eq 137 ] && echo "gpu check: stopped at its ${BOUND_S} s bound (the sections above finished)" >> "$OUT/report.md"
echo "report: $OUT/report.md"
exit $code
