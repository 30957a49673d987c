"""`compbench bench`: config checks, the measurements' content, the table and the JSON file.

Tiny sizes only: this checks what is measured and recorded, not how fast anything is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from compbench.bench import main as bench_main
from compbench.bench import micro
from compbench.compose import config


def _spec(*overrides: str) -> dict:
    return bench_main.check(config.compose(list(overrides), config_name="bench"), list(overrides))


@pytest.mark.parametrize(
    "override,message",
    [
        ("compressors=[nope]", "unknown compressor 'nope'"),
        ("compressors=[]", "compressors=[] is empty"),
        ("sizes=[0]", "sizes=0 must be an integer >= 1"),
        ("numel=-5", "numel=-5 must be an integer >= 1"),
        ("repeats=3", "repeats=3 must be an integer >= 7"),
        ("device=tpu", "device=tpu is not supported"),
        ("ratio=2", "ratio=2"),
        ("ratios=[0.5,0]", "ratio=0"),
        ("threads=0", "threads=0 must be an integer >= 1"),
        ("peers=0", "peers=0 must be an integer >= 1"),
        ("spread_limit=0", "spread_limit=0 must be a number > 0"),
    ],
)
def test_bad_settings_raise_one_line_value_errors(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        _spec(override)
    assert "\n" not in str(info.value)


def test_unknown_group_option_is_refused():
    with pytest.raises(ValueError, match="unknown compressor=nope"):
        _spec("compressor=nope")


def test_defaults_cover_the_registry_and_2e16_to_25m():
    spec = _spec()
    assert spec["sizes"][0] == 2**16 and spec["sizes"][-1] == 25_000_000
    assert {"dgc", "dragonn", "topk", "randk", "fp16", "signsgd"} <= set(spec["compressors"])
    assert spec["repeats"] >= 7 and spec["threads"] == 1 and spec["thp"] is True
    assert spec["output"].startswith("outputs")


def test_one_compressor_with_its_own_settings_and_shorthands():
    spec = _spec("compressor=dragonn", "compressor.sample_ratio=0.1", "numel=4096")
    assert list(spec["compressors"]) == ["dragonn"]
    assert spec["compressors"]["dragonn"]["sample_ratio"] == 0.1
    assert spec["sizes"] == [4096]
    assert spec["ratios"] == [0.01]  # dragonn.yaml's own ratio ...
    assert _spec("compressor=dragonn", "ratio=1e-3")["ratios"] == [0.001]  # ... unless told
    assert _spec("compressors=[dgc]", "ratios=[0.01,0.001]")["ratios"] == [0.01, 0.001]


def test_timer_statistics_and_noise_flag():
    s = micro.stat([1.0, 1.0, 1.1, 5.0, 1.0, 1.0, 1.0], 0.25)
    assert s["median"] == 1.0 and s["min"] == 1.0 and s["max"] == 5.0 and s["noisy"]
    assert not micro.stat([2.0] * 7, 0.25)["noisy"]


def test_matrix_shape():
    assert micro.matrix_shape(25_000_000) == (5000, 5000)
    assert micro.matrix_shape(65536) == (256, 256)
    assert micro.matrix_shape(1_000_003) == (1_000_003,)  # prime: stays 1-D
    assert micro.matrix_shape(12) == (3, 4)


@pytest.fixture(scope="module")
def small_run():
    spec = _spec("compressors=[none,fp16,dgc,dragonn,randk,signsgd,tbq]", "sizes=[4096,6000]",
                 "ratios=[0.01]", "warmup=1", "overhead_numel=256", "overhead_calls=7", "threads=null")
    return spec, micro.run(spec)


def test_measurements_are_complete_and_consistent(small_run):
    spec, out = small_run
    assert [f["numel"] for f in out["floors"]] == [4096, 6000]
    for f in out["floors"]:
        for key in ("read_ms", "copy_ms", "zero_ms"):
            assert f[key]["n"] == 7 and 0 < f[key]["min"] <= f[key]["median"] <= f[key]["max"]
        assert set(f["topk_ms"]) == {"0.01"}
    rows = {(r["compressor"], r["numel"]): r for r in out["results"]}
    assert len(rows) == 7 * 2
    for (_, n), r in rows.items():
        for key in ("encode_ms", "decode_ms", "ef_update_ms"):
            assert r[key]["n"] == 7 and r[key]["min"] <= r[key]["median"] <= r[key]["max"]
        assert r["encode_x_read"] > 0 and r["encode_x_copy"] > 0 and r["decode_x_floor"] > 0
        for phase in ("encode", "decode", "ef_update"):
            assert r["vs_floors"][phase]["x_read"] > 0 and r["vs_floors"][phase]["x_copy"] > 0
            assert (r["vs_floors"][phase]["topk_speedup"] is None) == (r["ratio"] is None)
        assert r["bits_per_element"] == pytest.approx(8 * r["payload_bytes"] / n)
        assert r["decode_peers"] == 2 and 0 <= r["relative_error"] < 2
    # Exact wire sizes and what the sparsifiers actually sent.
    assert rows[("fp16", 6000)]["payload_bytes"] == 2 * 6000
    assert rows[("signsgd", 6000)]["payload_bytes"] == math.ceil(6000 / 8) + 4
    assert rows[("tbq", 6000)]["payload_bytes"] == math.ceil(6000 / 4)
    assert rows[("none", 4096)]["relative_error"] == 0 and rows[("fp16", 4096)]["relative_error"] < 1e-3
    dgc = rows[("dgc", 6000)]
    assert dgc["ratio"] == 0.01 and dgc["k"] == 60 and 0.8 * 60 <= dgc["sent_elements"] <= 60
    assert dgc["payload_bytes"] == 8 * dgc["sent_elements"] and dgc["speedup_vs_topk"] > 0
    assert rows[("randk", 6000)]["payload_bytes"] == 4 * 60
    assert rows[("fp16", 6000)]["ratio"] is None and rows[("fp16", 6000)]["speedup_vs_topk"] is None
    # Sparse decodes go into a reused buffer and are compared with zero fill + scatter.
    assert dgc["decode_into_buffer"] and dgc["decode_floor_ms"]["n"] == 7
    assert {o["compressor"] for o in out["overhead"]} == set(spec["compressors"])
    assert all(o["numel"] == 256 and o["encode_us"] > 0 for o in out["overhead"])
    env = out["environment"]
    assert env["threads"] >= 1 and len(env["load_average_before"]) == 3 and env["torch"] and env["numpy"]
    assert "THP_MEM_ALLOC_ENABLE" in env["allocator"]


def test_table_has_floors_rows_and_overheads(small_run):
    spec, out = small_run
    table = bench_main.format_table({"config": spec, **out})
    lines = table.splitlines()
    assert lines[0].startswith("compbench bench on cpu")
    assert sum(line.startswith("floors n=") for line in lines) == 2
    assert any(line.split()[:3] == ["dgc", "6000", "0.01"] for line in lines)
    assert any(line.split()[:3] == ["fp16", "4096", "-"] for line in lines)
    assert lines[-1].startswith("per-call overhead at n=256")


def _bench(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMPBENCH_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", "compbench.bench.main", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)


def test_command_line_writes_json_and_prints_the_table(tmp_path):
    out = tmp_path / "b.json"
    args = ["compressors=[fp16,dragonn]", "sizes=[2048]", "ratio=0.01", "warmup=0", "overhead_numel=null",
            "topk_baseline=false", "threads=1", f"output={out}"]
    proc = _bench(*args, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dragonn" in proc.stdout and f"wrote {out}" in proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["sizes"] == [2048] and "output" not in report["config"]
    assert report["environment"]["threads"] == 1 and report["environment"]["omp_num_threads"] == "1"
    assert report["environment"]["allocator"]["THP_MEM_ALLOC_ENABLE"] == "1"
    assert [r["compressor"] for r in report["results"]] == ["fp16", "dragonn"]
    assert report["floors"][0]["topk_ms"] == {} and report["results"][1]["speedup_vs_topk"] is None


def test_bad_input_exits_2_with_one_line_before_writing(tmp_path, monkeypatch, capsys):
    from compbench.base.errors import report_user_error

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPBENCH_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info, report_user_error():
        bench_main.main(["repeats=2"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == "error: repeats=2 must be an integer >= 7"
    assert not (tmp_path / "outputs").exists()
