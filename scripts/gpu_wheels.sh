#!/usr/bin/env bash
# The pure-Python wheels that compbench needs beyond what the lent GPU machines have (torch, CuPy, timm,
# tensorboard, pytest, PyYAML: the device tool's KINDS.md): downloaded here, where the package registry
# is reachable, into .gpu-wheels/ (git-ignored), to be carried with the tree to a machine without
# network (the device tool's `carry`); scripts/gpu_check.sh installs those the machine lacks. Versions:
# this venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.gpu-wheels
rm -rf "$DEST"  # only this run's wheels: stale versions would be carried (and installed) too
mkdir -p "$DEST"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
PURE=(hydra-core omegaconf antlr4-python3-runtime tensorboardX)
specs=()
for pkg in "${PURE[@]}"; do specs+=("$pkg==$(version "$pkg")"); done
# pip wheel: a package published as an sdist only (antlr4's runtime) is built into a wheel here, so the
# machine without network installs it without a build step
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${specs[@]}"
# The device tool carries at most 64 MiB of ignored paths: these four wheels are ~0.5 MiB; a wheel
# of another version, or one left from an older run, must not push the folder near that.
kib=$(du -sk "$DEST" | cut -f1)
echo "gpu wheels: $(ls "$DEST" | wc -l) files in $DEST, ${kib} KiB"
if [ "$kib" -gt 8192 ]; then
  echo "error: $DEST holds ${kib} KiB (over 8 MiB): remove the stale wheels (rm -r $DEST; make gpu-wheels)" >&2
  exit 1
fi
