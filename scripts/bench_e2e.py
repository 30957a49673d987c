"""End-to-end step time: compbench's compressors against what users would otherwise run, one table.
`compbench bench mode=e2e` with flags (compbench.bench.e2e has the matrix and what it measures).

    python scripts/bench_e2e.py                      # the matrix, shaped 1 Gbit/s and unshaped
    python scripts/bench_e2e.py --steps 20 --gbps 1 --only ddp_fp32,dragonn
    python scripts/bench_e2e.py --repeat 2           # the whole matrix twice, interleaved: median
"""

from __future__ import annotations

import argparse
import sys

from compbench.base.errors import report_user_error
from compbench.bench import e2e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="steps per run (median over all but the first 5)")
    ap.add_argument("--gbps", type=float, default=1.0, help="shaped link per worker, Gbit/s")
    ap.add_argument("--only", default="", help="comma-separated row keys: " + ",".join(e2e.ROW_KEYS))
    ap.add_argument("--links", default="shaped,unshaped", choices=("shaped", "unshaped", "shaped,unshaped"),
                    help="shaped, unshaped, or both (the default)")
    ap.add_argument("--repeat", type=int, default=1, help="run the matrix this many times (interleaved)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--out", default=None,
                    help="a new folder for the runs and tables (default outputs/bench_e2e/DATE)")
    args = ap.parse_args(argv)
    settings = {"rows": args.only.split(",") if args.only else list(e2e.ROW_KEYS),
                "links": args.links.split(","), "gbps": args.gbps, "steps": args.steps,
                "repeat": args.repeat, "timeout": args.timeout}
    with report_user_error():
        spec = e2e.check(settings, args.out, "outputs")
    return e2e.run(**spec)


if __name__ == "__main__":
    sys.exit(main())
