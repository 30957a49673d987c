"""Shell completion: the candidates `compbench _complete` offers, and the bash function really
completing through it (a bash started with the script, asked as the shell asks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from compbench.cli.completion import candidates, script


@pytest.mark.parametrize("words, expected", [
    (["tr"], ["train"]),
    (["train", "compressor=dg"], ["compressor=dgc"]),
    (["train", "compressor=dgc", "compressor.rat"], ["compressor.ratio="]),
    (["train", "compressor.rat"], []),  # the default compressor (none) has no ratio
    (["train", "sync.inner"], []),
    (["train", "sync=diloco", "sync.inner"], ["sync.inner_steps=", "sync.inner_steps_per_worker="]),
    (["train", "max_st"], ["max_steps="]),
    (["train", "target_"], ["target_loss=", "target_acc1="]),
    (["race", "--li"], ["--links"]),
])
def test_candidates(words, expected):
    assert candidates(words) == expected


def test_bash_completes_through_compbench(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    shim = tmp_path / "compbench"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m compbench \"$@\"\n")
    shim.chmod(0o755)
    probe = script("bash") + (
        'COMP_WORDS=(compbench train sync=diloco sync.fra); COMP_CWORD=3; _compbench_complete; '
        'printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"})
    assert out.stdout.split() == ["sync.fragments="], out.stderr
