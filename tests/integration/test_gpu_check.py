"""scripts/gpu_check.sh --cpu: the GPU check's every section on the CPU (the same code a lent GPU
runs with device=cuda), so that the script cannot rot where CI has no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import default_sigint

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.dist


# slow tier: ~45 s (every section's runs); the default tier composes and checks every configuration the
# check runs (tests/unit/test_gpu_check_configs.py)
@pytest.mark.slow
def test_the_gpu_check_runs_every_section_on_the_cpu(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, preexec_fn=default_sigint,
                          env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable})
    report = (tmp_path / "report.md").read_text()
    assert proc.returncode == 0, report[-3000:]
    assert report.splitlines()[2] == "all sections passed"
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert len(sections) == 6 and all(": ok (" in line for line in sections), sections
    assert "34 of 34 runs as on the CPU" in report  # every method of section 3 trained
    assert report.splitlines()[4].startswith("device cpu; estimate 360 s on a GPU")
    assert proc.stdout.startswith("gpu check: estimate 360 s")  # the estimate comes first
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in report.splitlines()
            if line.startswith("| ")}
    # section 3: each row names the kernels it ran and what it compared (statistics for own draws)
    assert rows["compressor=dragonn comm=allgather"][1].startswith("cpu ")
    assert rows["compressor=topk comm=allgather"][-1] == "bytes, parameters |"
    assert rows["sync=sparta optim=adamw"][-1].startswith("statistics: ")
    # section 6: the step's real gradients captured and their bytes compared, device against CPU
    for method in ("dragonn", "topk+residual", "qsgd", "graddrop"):
        captured, device_bytes, cpu_bytes = rows[method][4:7]
        assert captured.endswith("gradients)") and int(device_bytes) > 0, rows[method]
        assert int(cpu_bytes.split()[0]) == int(device_bytes), rows[method]
