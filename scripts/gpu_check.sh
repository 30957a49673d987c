#!/usr/bin/env bash
# The GPU proof in one go, on a lent GPU machine (torch, CuPy and timm there; no network): installs the
# wheels carried in .gpu-wheels/ (scripts/gpu_wheels.sh, run first where the registry is reachable)
# into a private folder, then runs the GPU tier (pytest -m gpu) and `compbench bench device=cuda`, and
# writes $OUT/report.md with the device, both outputs and the timings (under 10 minutes in all).
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu-check}
mkdir -p "$OUT"
EXTRA=$(mktemp -d)
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --find-links .gpu-wheels --target "$EXTRA" --no-deps hydra-core omegaconf \
  antlr4-python3-runtime tensorboardX tqdm pytest pluggy iniconfig packaging PyYAML > "$OUT/install.txt" 2>&1 \
  || echo "note: the wheels did not all install (see install.txt)" >> "$OUT/install.txt"
export PYTHONPATH="$PWD/src:$PWD:$EXTRA:${PYTHONPATH:-}"
export COMPBENCH_CONF_DIR="$PWD/conf"
{
  echo "# GPU check"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  "$PY" -c "import torch, cupy; print(f'device: {torch.cuda.get_device_name()}, torch {torch.__version__}, '
                                    f'CuPy {cupy.__version__}, CUDA {torch.version.cuda}')" 2>&1
  echo
  echo "## GPU tier: pytest -m gpu tests/gpu"
  echo '```'
  start=$(date +%s)
  timeout 300 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -40
  echo "($(( $(date +%s) - start )) s)"
  echo '```'
  echo
  echo "## compbench bench device=cuda"
  echo '```'
  start=$(date +%s)
  timeout 240 "$PY" -m compbench bench device=cuda "sizes=[1048576,25000000]" repeats=7 \
    "output=$OUT/bench.json" 2>&1 | tail -60
  echo "($(( $(date +%s) - start )) s)"
  echo '```'
} > "$OUT/report.md"
cat "$OUT/report.md"
