"""Every `extensions/cuda/*.cu` compiles with nvcc (one invocation for all of them), so a syntax
error cannot land; and every kernel the launchers name exists. Skipped when nvcc is absent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compbench.kernels import loader

_EXPORTED = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')
_LAUNCHED = re.compile(r'launch\(\s*"(\w+)",\s*"?(\w+)"?')


def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _exported() -> dict[str, set[str]]:
    return {p.stem: set(_EXPORTED.findall(p.read_text())) for p in loader.sources()}


def test_every_launched_kernel_exists_in_its_source():
    exported = _exported()
    assert exported and all(exported.values()), "every .cu exports at least one extern \"C\" kernel"
    ops = Path(loader.__file__).with_name("ops.py").read_text()
    launched = set(_LAUNCHED.findall(ops))
    # _pack launches pack.cu with the function passed in: its names are the string literals given to it.
    launched |= {("pack", f) for f in re.findall(r'_pack\("(\w+)"', ops)}
    launched = {(m, f) for m, f in launched if f != "function"}
    assert launched, "ops.py launches kernels"
    for module, function in sorted(launched):
        assert module in exported, f"ops.py launches {module}.cu, which does not exist"
        assert function in exported[module], f"{module}.cu has no extern \"C\" __global__ {function}"


def test_sources_include_nothing_but_common_header():
    # NVRTC (CuPy's compiler) has no standard headers: a stray #include compiles with nvcc and
    # fails at run time on the GPU.
    for path in [*loader.sources(), loader.source_dir() / "common.cuh"]:
        for line in path.read_text().splitlines():
            if line.strip().startswith("#include"):
                assert line.strip() == '#include "common.cuh"', f"{path.name}: {line.strip()}"


def test_nvcc_compiles_every_source(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    sources = [str(p) for p in loader.sources()]
    # PTX for one virtual architecture: the whole front end (syntax, types, intrinsics) in a few
    # seconds; warnings are errors so that a suspicious conversion is fixed before it lands.
    cmd = [nvcc, "--ptx", "-arch=compute_80", "--std=c++14", "--Werror", "all-warnings",
           f"-I{loader.source_dir()}", *sources, "-odir", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for module, functions in _exported().items():
        ptx = (tmp_path / f"{module}.ptx").read_text()
        for function in functions:
            assert re.search(rf"\.entry\s+{function}\s*\(", ptx), f"{module}.ptx lacks the entry {function}"
