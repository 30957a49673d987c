#!/usr/bin/env bash
# The pure-Python wheels (and PyYAML's, for the usual Pythons) that compbench needs beyond what the lent
# GPU machines have (torch, CuPy, timm, tensorboard): downloaded here, where the package registry is
# reachable, into .gpu-wheels/ (git-ignored), to be carried with the tree to a machine without network
# (the device tool's `carry`); scripts/gpu_check.sh installs them there. Versions: this venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.gpu-wheels
mkdir -p "$DEST"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
PURE=(hydra-core omegaconf antlr4-python3-runtime tensorboardX tqdm pytest pluggy iniconfig packaging)
specs=()
for pkg in "${PURE[@]}"; do specs+=("$pkg==$(version "$pkg")"); done
# pip wheel: a package published as an sdist only (antlr4's runtime) is built into a wheel here, so the
# machine without network installs it without a build step
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${specs[@]}"
for py in 3.10 3.11 3.12 3.13; do  # PyYAML (omegaconf's) is compiled: one wheel per Python
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
    --python-version "$py" -d "$DEST" "PyYAML==$(version PyYAML)" || echo "note: no PyYAML wheel for $py"
done
echo "gpu wheels: $(ls "$DEST" | wc -l) files in $DEST"
