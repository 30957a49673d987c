"""Plugins: a compressor and a communicator from a package of the user's own, with no edit to
compbench. The package is built here in a temporary folder (a module, its conf/ folder and a real
`*.dist-info` with an entry point in `compbench.plugins`); putting that folder on PYTHONPATH is what
"installed" means to Python (importlib.metadata finds the distribution there).

The run, the listing, the sweep, the config check, the report's what-if model and the contract tests
all see the plugin's options as they see compbench's: by the registry and the declared traits."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from compbench.catalog import registry
from compbench.compose import config
from tests.helpers import TINY, compbench, results

PACKAGE = "cbplug_int8"
DIST = "cbplug-int8"

COMPRESSOR = '''
"""A symmetric 8-bit quantizer: one fp32 scale (max |x|) per tensor and n int8 codes."""

import torch

from compbench.codec.base import Capabilities, CompressorBase, make_ctx


class Int8(CompressorBase):
    """round(127 x / max|x|) as int8, the scale as a 1-element fp32 tensor: n + 4 bytes. Each rank's
    scale is its own, so payloads cannot be summed (comm=allreduce refuses it)."""

    name = "int8"
    caps = Capabilities(recipe={"memory": "residual"},
                        why_not_summable="scales each tensor by its own max |x|")

    def compress(self, x, name):
        flat = x.detach().reshape(-1).float()
        scale = flat.abs().max().clamp_min(1e-30).reshape(1)
        codes = torch.round(flat * (127.0 / scale)).to(torch.int8)
        return [codes, scale], make_ctx(x, name)

    def decompress(self, payload, ctx):
        codes, scale = payload
        return (codes.float() * (scale / 127.0)).to(ctx.dtype).view(ctx.shape)

    def wire_bytes(self, numel):
        return numel + 4
'''

COMM = '''
"""A communicator of the plugin's own: allgather the payloads, decode and average."""

from compbench.comm.base import CommBase, CommTraits, encode
from compbench.engines.base import Handle


class GatherComm(CommBase):
    """Every rank's payload to every rank (sizes may differ), decoded and averaged."""

    traits = CommTraits(pattern="allgather")

    def reduce(self, grad, name, memory):
        payload, ctx = encode(self.compressor, memory, grad, name, self.stats)
        self.book_payload(payload)
        gathered = self.engine.allgather_async(payload, name)

        def finish():
            payloads = gathered.wait()
            with self.stats.time("decompress"):
                return self.compressor.decompress_all(payloads, ctx)

        return Handle(finish)
'''


def build_package(site: Path) -> Path:
    """The plugin, laid out as pip installs it into site-packages: the package and its dist-info."""
    files = {
        f"{PACKAGE}/__init__.py": '"""compbench plugin: compressor=int8, comm=gather."""\n',
        f"{PACKAGE}/int8.py": COMPRESSOR,
        f"{PACKAGE}/gather.py": COMM,
        f"{PACKAGE}/conf/compressor/int8.yaml": f"""\
            # Symmetric int8 quantizer (a plugin's): n + 4 bytes, one fp32 scale per tensor.
            _target_: {PACKAGE}.int8.Int8
            compress_threshold: 0
            dense_steps: 0
            """,
        f"{PACKAGE}/conf/comm/gather.yaml": f"""\
            # Allgather of every rank's payload, decode all, average (a plugin's communicator).
            _target_: {PACKAGE}.gather.GatherComm
            """,
        f"{PACKAGE}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n",
        f"{PACKAGE}-0.1.dist-info/entry_points.txt": f"[compbench.plugins]\nint8 = {PACKAGE}\n",
    }
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build_package(tmp_path_factory.mktemp("site"))


def _env(site: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), **extra}


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_list_shows_the_plugin_options_with_their_package(site):
    proc = compbench("list", "compressor", "comm", env=_env(site))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.split()[:3] == ["int8", "[package", f"{DIST}]"] for ln in lines), proc.stdout
    assert any(ln.split()[:3] == ["gather", "[package", f"{DIST}]"] for ln in lines), proc.stdout
    assert any(ln.split()[0] == "topk" and "[" not in ln.split()[1] for ln in lines if ln.strip())
    without = compbench("list", "compressor")  # not installed: not listed
    assert without.returncode == 0 and "int8" not in without.stdout


def test_trains_with_the_plugin_and_reports_by_its_declared_pattern(site, tmp_path):
    out = tmp_path / "run"
    proc = compbench("train", *TINY, "compressor=int8", "comm=gather", "engine.np=2", "max_steps=4",
                     "eval=false", f"output_dir={out}", env=_env(site))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = results(out)
    assert res["config"]["choices"]["compressor"] == "int8" and res["config"]["choices"]["comm"] == "gather"
    assert res["config"]["recipe"] == {"memory": "residual"}  # the plugin's Capabilities.recipe
    assert res["environment"]["world_size"] == 2
    # n + 4 bytes a tensor, every step: the plugin's compressor was on the wire.
    assert 0 < res["summary"]["bytes_sent_per_step"] < res["summary"]["bytes_dense_per_step"] / 3
    report = compbench("report", str(out), env=_env(site))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "| int8 |" in report.stdout and "| gather |" in report.stdout, report.stdout
    # The what-if model priced the plugin communicator by its declared traits.pattern (allgather).
    whatif = (out / "report.md").read_text()
    assert "### .: int8 ratio= comm=gather (break-even N vs dense allreduce: " in whatif, whatif


def test_the_config_check_refuses_the_plugin_compressor_over_allreduce(site, tmp_path):
    line = _one_error_line(compbench("train", *TINY, "compressor=int8", "comm=allreduce",
                                     f"output_dir={tmp_path / 'r'}", env=_env(site)))
    assert "compressor=int8" in line and "scales each tensor by its own max |x|" in line, line
    assert not (tmp_path / "r").exists()


def test_a_sweep_glob_picks_plugin_options(site, tmp_path):
    proc = compbench("train", "-m", "--cfg", "compressor=glob([int*,top*])", "comm=glob(g*)", *TINY,
                     cwd=tmp_path, env=_env(site))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [ln for ln in proc.stdout.splitlines() if ln.startswith("# job ")]
    assert len(jobs) == 2, jobs
    assert "compressor=int8" in jobs[0] and "compressor=topk" in jobs[1] and "comm=gather" in jobs[0]


def test_a_plugin_may_not_shadow_an_option(site, tmp_path):
    shadow = tmp_path / "conf" / "compressor"
    shadow.mkdir(parents=True)
    (shadow / "topk.yaml").write_text("_target_: compbench.compressors.fp16.FP16\n")
    env = _env(site, COMPBENCH_CONF_PATH=str(tmp_path / "conf"))
    line = _one_error_line(compbench("list", "compressor", env=env))
    assert "compressor=topk is defined twice: by compbench" in line and "COMPBENCH_CONF_PATH" in line, line
    assert str(shadow / "topk.yaml") in line
    # A plain folder (no package) on the variable adds options as an entry point does.
    (shadow / "topk.yaml").rename(shadow / "half.yaml")
    proc = compbench("train", "--cfg", "compressor=half", "comm=gather", *TINY, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compbench.compressors.fp16.FP16" in proc.stdout and f"{PACKAGE}.gather" in proc.stdout


def test_plugin_folders_that_compbench_would_misread_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPBENCH_CONF_PATH", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="COMPBENCH_CONF_PATH: .*missing is not a folder"):
        registry.options("compressor")
    (tmp_path / "conf" / "compressors").mkdir(parents=True)  # the group's name misspelt
    monkeypatch.setenv("COMPBENCH_CONF_PATH", str(tmp_path / "conf"))
    with pytest.raises(ValueError, match=r"compressors: a plugin.s conf folder \(COMPBENCH_CONF_PATH\)"):
        config.compose([])
    monkeypatch.delenv("COMPBENCH_CONF_PATH")
    broken = tmp_path / "site"  # an installed distribution whose entry point names no package
    info = broken / "broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[compbench.plugins]\nb = cbplug_nowhere\n")
    monkeypatch.syspath_prepend(str(broken))
    with pytest.raises(ValueError, match="of package broken: package cbplug_nowhere cannot be found"):
        registry.options("compressor")


def test_the_contract_tests_run_on_the_plugin_without_new_test_code(site, monkeypatch, tmp_path):
    """The registry-parametrized contract functions, called on the plugin's options: what
    `pytest tests/unit` runs for them once the package is installed."""
    from compbench.comm import cost_model
    from tests.unit import test_combinations as combos
    from tests.unit import test_compressor_contract as contract

    monkeypatch.syspath_prepend(str(site))  # installed, for this process too
    assert "int8" in registry.options("compressor") and "gather" in registry.options("comm")
    assert registry.option_origin("compressor", "int8") == f"package {DIST}"
    for shape in contract.SHAPES:
        contract.test_round_trip_keeps_shape_dtype_device("int8", shape)
        contract.test_exact_wire_bytes("int8", shape)
    contract.test_error_feedback_invariant("int8")
    contract.test_decompress_all_averages("int8")
    error, alignment = contract._quality("int8", 1.0)  # 8 bits: a small, unbiased-looking error
    assert error < 1e-3 and alignment > 0.99, (error, alignment)
    # Every memory x scheduler x engine over every communicator, the plugin's among them: refused
    # with a one-line fix, or trained 3 steps on 2 thread ranks.
    assert "gather" in registry.options("comm")  # so the matrix below runs the plugin's pair too
    combos.test_every_combination_is_refused_or_trains("int8", tmp_path)
    config.check(combos._compose("int8", "gather"))  # accepted, hence trained above
    # The what-if model reads the plugin communicator's declared pattern: no table names it.
    assert cost_model.pattern("gather") == "allgather"


@pytest.mark.parametrize("yaml_text, module, expected", [
    ("_target_: [unclosed\n", None, "is not a readable YAML config"),
    ("_target_: nosuchmodule_xyz.Foo\n", None, "_target_ nosuchmodule_xyz.Foo cannot be loaded "
                                               "(ModuleNotFoundError: No module named 'nosuchmodule_xyz')"),
    ("_target_: raisingplugin.Foo\n", "raise RuntimeError('broken on import')\n",
     "_target_ raisingplugin.Foo cannot be loaded (RuntimeError: broken on import)"),
    ("_target_: nocaps.NoCaps\n", "class NoCaps:\n    pass\n",
     "compressor=broken (nocaps.NoCaps) declares no `caps`"),
])
def test_a_broken_plugin_is_one_line(tmp_path, yaml_text, module, expected):
    conf = tmp_path / "conf" / "compressor"
    conf.mkdir(parents=True)
    (conf / "broken.yaml").write_text(yaml_text)
    env = {"COMPBENCH_CONF_PATH": str(tmp_path / "conf")}
    if module is not None:
        name = yaml_text.split()[1].split(".")[0]
        (tmp_path / f"{name}.py").write_text(module)
        env["PYTHONPATH"] = f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"
    proc = compbench("train", "compressor=broken", cwd=tmp_path, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]
