#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 into the active Python environment.
#
# Horovod 0.28.1 is the last release and does not compile against torch >= 2.1 as released: its
# CMake files ask for C++14 while torch's headers need C++17. We patch the two
# `set(CMAKE_CXX_STANDARD 14)` lines and build with Gloo for CPU collectives (no MPI/TF/MXNet), and
# with NCCL for CUDA tensors where this torch has CUDA and NCCL's headers are found (a GPU machine:
# device=cuda on engine=horovod needs it; compbench refuses CUDA tensors for a Gloo-only build).
# The built wheel is cached outside the repository so a fresh clone does not rebuild it (~3 min).
set -euo pipefail
PY=${PYTHON:-python}
CACHE=${COMPBENCH_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/compbench/wheels}
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
# NCCL's home (include/nccl.h): $HOROVOD_NCCL_HOME, the CUDA toolkit's, the system's or the pip
# package nvidia-nccl's; empty for a CPU build of torch or where none is found.
NCCL_HOME=$("$PY" - <<'PY'
import os, pathlib, torch
homes = [os.environ.get("HOROVOD_NCCL_HOME", ""), "/usr/local/cuda", "/usr"]
try:
    import nvidia.nccl
    homes += list(nvidia.nccl.__path__)
except ImportError:
    pass
found = [h for h in homes if h and (pathlib.Path(h) / "include" / "nccl.h").is_file()]
print(found[0] if torch.version.cuda and found else "")
PY
)
# The wheel links against torch's C++ ABI and, with NCCL, CUDA's: one cached wheel per torch version
# and kind of build.
KIND=gloo
[ -n "$NCCL_HOME" ] && KIND=nccl
WHEEL_DIR="$CACHE/horovod-0.28.1-torch$TORCH_VERSION-$KIND"

if "$PY" -c "import horovod.torch as h, sys; sys.exit(h.nccl_built() != ('$KIND' == 'nccl'))" 2>/dev/null; then
  exit 0
fi
if ! ls "$WHEEL_DIR"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PY" -m pip download --no-deps --no-binary :all: -d "$work" horovod==0.28.1
  tar -xzf "$work"/horovod-0.28.1.tar.gz -C "$work"
  src="$work/horovod-0.28.1"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt"
  mkdir -p "$WHEEL_DIR"
  gpu=()
  if [ "$KIND" = nccl ]; then
    echo "horovod: building with NCCL from $NCCL_HOME (CUDA tensors) and Gloo (CPU tensors)"
    gpu=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_NCCL_HOME=$NCCL_HOME")
  fi
  env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo "${gpu[@]}" \
  MAKEFLAGS="-j$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    "$PY" -m pip wheel --no-deps --no-build-isolation -w "$WHEEL_DIR" "$src"
fi
"$PY" -m pip install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-0.28.1-*.whl
# horovod's own runtime dependencies (horovodrun needs them).
"$PY" -m pip install cffi cloudpickle psutil pyyaml packaging
