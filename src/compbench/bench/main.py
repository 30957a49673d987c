"""`compbench bench [overrides]`: encode / decode / error-feedback cost of the compressors.

    compbench bench                                        # conf/bench.yaml: 13 compressors, 2^16 .. 25M
    compbench bench compressor=dragonn numel=25000000      # one compressor, its own settings
    compbench bench compressors=[dgc,dragonn] sizes=[1048576,25000000] ratios=[1e-2,1e-3] threads=1
    compbench bench device=cuda peers=8 output=bench.json
    compbench bench mode=e2e                               # end to end: the step-time matrix (bench/e2e.py)
    compbench bench mode=e2e e2e.rows=[dragonn,compute] e2e.links=[unshaped] e2e.repeat=3

Prints one line per (compressor, size, ratio) and writes a JSON file (the per-size costs are what a
SeCoPa plan needs). Every time comes with multiples of floors measured in the same run: one read
pass of the tensor, one copy of it, and exact `torch.topk` (speed-up). The measurements run in a
child process (`micro.py`) whose threads and allocator are fixed before torch starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from compbench.base.leftovers import scratch_dir
from compbench.base.values import require_int
from compbench.catalog import registry
from compbench.codec.base import check_ratio
from compbench.compose.checks import check_writable_file, is_json_with


def main(overrides: list[str]) -> int:
    from compbench.compose import config

    if {"-h", "--help"} & set(overrides):
        print(__doc__.strip())
        return 0
    cfg = config.compose(overrides, config_name="bench")
    if cfg.mode not in ("micro", "e2e"):
        raise ValueError(f"mode={cfg.mode} is not a bench mode; use mode=micro (encode/decode costs) or "
                         "mode=e2e (end-to-end step times against DDP and Horovod)")
    if cfg.mode == "e2e":
        from compbench.bench import e2e

        return e2e.run(**e2e.check(registry.plain(cfg.e2e), cfg.output, cfg.outputs_root))
    spec = check(cfg, overrides)
    output = Path(spec.pop("output"))
    result = measure(spec)
    if result is None:
        return 1
    report = {"config": spec, **result}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(format_table(report))
    print(f"compbench: wrote {output}")
    return 0


def _positive_int(value: Any, key: str, minimum: int = 1) -> int:
    require_int(key, value, minimum)  # the same rule and words as every other integer setting
    return value


def _as_list(value: Any) -> list[Any]:
    if OmegaConf.is_list(value):
        items = OmegaConf.to_container(value)
        assert isinstance(items, list)  # a ListConfig converts to a list
        return items
    return [value]


def check(cfg: DictConfig, overrides: list[str] | None = None) -> dict[str, Any]:
    """The composed bench config as a plain, checked spec for `micro.run` (ValueError names the fix)."""
    keys = {o.lstrip("+~").split("=", 1)[0] for o in overrides or []}
    known = registry.options("compressor")
    chosen = cfg.choices.get("compressor")
    if chosen:
        params = registry.plain(cfg.compressor)
        params.pop("_target_", None)
        compressors = {chosen: params}
        # Its own ratio unless ratio= / ratios= says otherwise.
        own_ratio = "ratio" in params and not ({"ratio", "ratios"} & keys)
        ratios = [params["ratio"]] if own_ratio else None
    else:
        names = _as_list(cfg.compressors)
        if not names:
            raise ValueError("compressors=[] is empty; pass e.g. compressors=[dgc,dragonn] or compressor=dgc")
        for name in names:
            if name not in known:
                raise ValueError(f"unknown compressor {name!r} in compressors; choose from: "
                                 f"{', '.join(known)}")
        compressors = {}
        for name in names:
            params = dict(registry.option_config("compressor", name))
            params.pop("_target_", None)
            compressors[name] = params
        ratios = None
    if ratios is None:
        ratios = [cfg.ratio] if cfg.ratio is not None else _as_list(cfg.ratios)
    ratios = [check_ratio(r, "bench ratios") for r in ratios]
    if not ratios:
        raise ValueError("ratios=[] is empty; pass e.g. ratios=[0.001]")

    sizes = [cfg.numel] if cfg.numel is not None else _as_list(cfg.sizes)
    if not sizes:
        raise ValueError("sizes=[] is empty; pass e.g. sizes=[65536,25000000] or numel=25000000")
    sizes = [_positive_int(n, "sizes" if cfg.numel is None else "numel") for n in sizes]
    device = str(cfg.device)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device} is not supported; use device=cpu or device=cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device=cuda but torch sees no CUDA device; use device=cpu")
    repeats = _positive_int(cfg.repeats, "repeats", 7)
    threads = cfg.threads
    if threads is not None:
        threads = _positive_int(threads, "threads")
    spread = cfg.spread_limit
    if isinstance(spread, bool) or not isinstance(spread, int | float) or spread <= 0:
        raise ValueError(f"spread_limit={spread} must be a number > 0, e.g. 0.25")
    overhead_numel = cfg.overhead_numel
    if overhead_numel is not None:
        overhead_numel = _positive_int(overhead_numel, "overhead_numel")
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    output = cfg.output or str(Path(cfg.outputs_root) / "bench" / f"{stamp}.json")
    # Now, not after the whole benchmark ran.
    check_writable_file("output", Path(output), ours=_is_report, what="a benchmark report")
    return {
        "compressors": compressors,
        "sizes": sizes,
        "ratios": ratios,
        "device": device,
        "repeats": repeats,
        "warmup": _positive_int(cfg.warmup, "warmup", 0),
        "peers": _positive_int(cfg.peers, "peers"),
        "threads": threads,
        "thp": bool(cfg.thp),
        "topk_baseline": bool(cfg.topk_baseline),
        "overhead_numel": overhead_numel,
        "overhead_calls": _positive_int(cfg.overhead_calls, "overhead_calls", 7),
        "spread_limit": float(spread),
        "seed": int(cfg.seed),
        "output": output,
    }


def measure(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run `micro.py` in a child process with the spec's threads and allocator; its results, or None
    (after printing why) when it failed."""
    env = dict(os.environ)
    if spec["threads"]:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(spec["threads"])
    env["THP_MEM_ALLOC_ENABLE"] = "1" if spec["thp"] else "0"
    with scratch_dir("compbench-bench-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "compbench.bench.micro", str(spec_path), str(out_path)]
        last = ""
        pipes: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
        with subprocess.Popen(cmd, env=env, **pipes) as proc:
            assert proc.stderr is not None
            for line in proc.stderr:  # progress lines, passed on as they come
                print(line, end="", file=sys.stderr, flush=True)
                last = line.strip() or last
        if proc.returncode != 0 or not out_path.is_file():
            print(f"error: the benchmark process failed (exit {proc.returncode}): {last or 'no output'}",
                  file=sys.stderr)
            return None
        return json.loads(out_path.read_text())


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(report: dict[str, Any]) -> str:
    """The printed summary: floors per size, then one line per result, then per-call overheads."""
    env = report["environment"]
    lines = [
        f"compbench bench on {env['device']} ({env.get('gpu') or env.get('cpu')}), "
        f"{env['threads']} thread(s), "
        f"THP_MEM_ALLOC_ENABLE={env['allocator']['THP_MEM_ALLOC_ENABLE']}, "
        f"load {env['load_average_before'][0]:.2f} -> {env['load_average_after'][0]:.2f}; "
        f"median of {report['config']['repeats']} ms (min in the JSON), '!' = spread > "
        f"{report['config']['spread_limit']:.0%}",
        f"cpu kernels: {env['cpu_kernels']}",
    ]
    for f in report["floors"]:
        topk = ", ".join(f"torch.topk r={r} {_ms(s['median'])}" for r, s in f["topk_ms"].items())
        lines.append(f"floors n={f['numel']}: read {_ms(f['read_ms']['median'])}, "
                     f"copy {_ms(f['copy_ms']['median'])}, zero fill {_ms(f['zero_ms']['median'])}"
                     + (f", {topk}" if topk else ""))
    peers = report["config"]["peers"]
    head = (f"{'compressor':<10} {'numel':>9} {'ratio':>6} {'enc':>7} {'x read':>7} {'x copy':>7} "
            f"{'vs topk':>8} {f'dec({peers})':>7} {'x floor':>7} {'EF upd':>7} {'bytes':>10} {'sent':>8} "
            f"{'rel.err':>7}")
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:g}"
        sent = "-" if r["sent_elements"] is None else str(r["sent_elements"])
        lines.append(
            f"{r['compressor']:<10} {r['numel']:>9} {ratio:>6} "
            f"{_ms(r['encode_ms']['median']):>7} {_x(r['encode_x_read']):>7} {_x(r['encode_x_copy']):>7} "
            f"{_x(r['speedup_vs_topk']):>8} {_ms(r['decode_ms']['median']):>7} {_x(r['decode_x_floor']):>7} "
            f"{_ms(r['ef_update_ms']['median']):>7} {r['payload_bytes']:>10} "
            f"{sent:>8} {r['relative_error']:>7.3f}"
            + (" !" if r["noisy"] else "")
        )
    if report["overhead"]:
        small = ", ".join(f"{o['compressor']} {o['encode_us']:.0f}/{o['decode_us']:.0f}"
                          for o in report["overhead"])
        lines.append(f"per-call overhead at n={report['overhead'][0]['numel']}, encode/decode us: {small}")
    return "\n".join(lines)


def _is_report(path: Path) -> bool:
    """A report `main` wrote (see `report` there and micro.OUT)."""
    return is_json_with(path, {"config", "environment", "floors", "results"})


if __name__ == "__main__":
    from compbench.base.errors import report_user_error

    with report_user_error():
        sys.exit(main(sys.argv[1:]))
