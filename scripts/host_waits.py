"""Host waits per training step on the device path, by the foreign-device mode (tests/foreign_device.py):
for a few representative runs, the median over the steps after the first of the host reads of device
tensors (item, tolist, copies to the host, outputs sized by the data), inside backward hooks and
elsewhere, with their sites. Nothing fails here (the test does that): the mode only counts.

    .venv/bin/python scripts/host_waits.py [--json FILE] [--steps N]
    PYTHONPATH=/other/worktree/src .venv/bin/python scripts/host_waits.py   # another checkout's code

It relies only on the Trainer, StepStats' phase and step edges and the threaded engine (as at 5804d55),
so the same probe measures before and after."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ of this checkout (after PYTHONPATH)

from omegaconf import open_dict  # noqa: E402
from tests.foreign_device import PLACED, ForeignDevice, watched_stats  # noqa: E402
from tests.helpers import TINY  # noqa: E402
from tests.threaded_engine import ThreadWorld  # noqa: E402

import compbench  # noqa: E402
from compbench.catalog import registry  # noqa: E402
from compbench.compose import config  # noqa: E402
from compbench.train.loop import Trainer  # noqa: E402

RUNS = {
    "dragonn+residual allgather": ["compressor=dragonn", "memory=residual", "comm=allgather"],
    "dgc+dgc": ["compressor=dgc", "memory=dgc", "comm=allgather"],
    "topk optim=adamw": ["compressor=topk", "comm=allgather", "optim=adamw"],
    "powersgd allreduce": ["compressor=powersgd", "comm=allreduce", "compressor.start_iter=2"],
    "randk": ["compressor=randk", "comm=allgather"],
    "sparta": ["sync=sparta", "optim=adamw"],
    "onebit_lamb": ["sync=onebit_lamb", "optim=adamw", "sync.freeze_step=2"],
    "natural": ["compressor=natural", "comm=allgather"],
    "fp16 comm=ring": ["compressor=fp16", "comm=ring"],
    "topk on_nonfinite=skip": ["compressor=topk", "comm=allgather", "on_nonfinite=skip"],
    "topk on_nonfinite=raise": ["compressor=topk", "comm=allgather", "on_nonfinite=raise"],
    "topk comm=hierarchical": ["compressor=topk", "comm=hierarchical"],
    "dgc+dgc gradient_clipping": ["compressor=dgc", "memory=dgc", "comm=allgather",
                                  "memory.gradient_clipping=1.0"],
}


def probe(overrides: list[str], steps: int) -> dict:
    """Rank 0's host waits per step of `overrides` on 2 threaded ranks with the foreign device."""
    cfg = config.check(config.compose([*TINY, "batch_size=32", f"max_steps={steps}", "eval_points=1",
                                       "checkpoint=false",
                                       *(o.replace("hierarchical", "allgather") for o in overrides)]))
    if "comm=hierarchical" in overrides:  # one machine: swapped in after the check, each rank its node
        with open_dict(cfg):
            cfg.comm = registry.option_config("comm", "hierarchical")
            cfg.choices.comm = "hierarchical"

    def rank(engine):
        with ForeignDevice(strict=False) as mode:
            Trainer(cfg, engine, Path(tempfile.mkdtemp())).fit()
        return mode

    with watched_stats(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mode = ThreadWorld(2, local_size=1, device=PLACED).run(rank, name=cfg.choices["engine"])[0]
    later = mode.steps[1:] or mode.steps

    def median(where: str) -> tuple[float, dict[str, float]]:
        counters = [getattr(s, where) for s in later]
        sites = sorted(set().union(*counters))
        per_site = {site: statistics.median(c[site] for c in counters) for site in sites}
        return statistics.median(sum(c.values()) for c in counters), per_site

    in_hook, hook_sites = median("in_hook")
    elsewhere, other_sites = median("elsewhere")
    return {"overrides": overrides, "steps": len(mode.steps), "in_hook": in_hook, "elsewhere": elsewhere,
            "in_hook_sites": hook_sites, "elsewhere_sites": other_sites,
            "violations": sorted(set(mode.errors))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"compbench from {Path(compbench.__file__).parent}; median host waits per step after the first")
    out = {}
    for name, overrides in RUNS.items():
        try:
            r = out[name] = probe(overrides, args.steps)
        except Exception as e:  # another checkout may refuse a run or fail under the mode: say so, go on
            out[name] = {"overrides": overrides, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name:28s} error: {out[name]['error']}")
            continue
        print(f"{name:28s} in backward hooks {r['in_hook']:4g}   elsewhere {r['elsewhere']:4g}")
        for where in ("in_hook_sites", "elsewhere_sites"):
            for site, n in r[where].items():
                print(f"    {'hook' if where == 'in_hook_sites' else 'else'} {n:4g}  {site}")
        for v in r["violations"]:
            print(f"    ! {v}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
