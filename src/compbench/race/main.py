"""`compbench race [--suite text|field|cnn|sharded] [--quick] [--out DIR] [--only M,...]
[--links MBPS[:MS],...] [--seeds N] [--workers N] [--per-node L] [--memory-gb GB] [--params P,...]
[key=value ...]`: which method reaches a target quality first over a given link.

Runs every method of the race (compbench.race.suites) on every link (net.emulate_gbps: a shaped
network namespace, root; `MBPS:MS` adds MS milliseconds of one-way delay, net.emulate_latency_us)
for every seed, each to the race's target (stop_at_target) within its budget of training seconds
(max_train_s), through `compbench train`, into DIR/runs/METHOD-LINKmbps[-DELAYms]-sSEED/
(compbench.cli.matrix: resumable; a finished run is kept). Then DIR/race.md, race.csv and plots/
(compbench.race.report): time to target with its spread, throughput against the baseline,
utilization, bytes per token, peak bytes per exchange, exposed communication against the wire time,
the what-if model's step times beside the measured ones, the bandwidth below which each method
beats the baseline and the round trip above which it does; for the text race, its throughput
targets as met or not.

The what-if (compbench.race.model) predicts each method's time to target at 10, 100 and 1000 Mbit/s
with --workers N workers (default 8), --per-node L to a machine (default 1: each its own), 10 ms per
message round, and a worker's memory (parameters, gradients and optimizer state over its shard
group, activations, gathered weights) against --memory-gb GB (default 80): fits or not; --params
P,... adds a table of a step's time and the memory at those model sizes (parameters). A finished
race is kept, so running it again with other what-if flags writes its report again.

Default output: outputs/race-SUITE[-quick]. Extra key=value overrides apply to every run.
Exit status: 0 when every run completed, 1 when a run failed, 2 for a usage error, 130 for Ctrl-C.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from compbench.base.args import ArgumentParser, decimal, override_key, whole
from compbench.base.errors import INTERRUPTED_EXIT
from compbench.cli.matrix import Job, check_jobs, run_jobs
from compbench.network.netem import RATE_GBPS
from compbench.race.model import WhatIf
from compbench.race.report import load, write
from compbench.race.suites import LINKS, RACES, Link, Race
from compbench.race.targets import TARGETS

MAX_SEEDS = 10  # a race of 3 links and 8 methods at 10 seeds is 240 runs already
MAX_WORKERS = 1_000_000  # the what-if's
MAX_PARAMS = 1e15
LINK_KEYS = {f"net.{k}" for k in ("emulate_gbps", "emulate_latency_us", "emulate_rank_gbps",
                                  "emulate_rank_latency_us")}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="compbench race", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=tuple(RACES), default="text",
                        help="text (default): model=gpt on Shakespeare; field: the field's other methods on "
                             "the same; cnn: the seeds' compressors on Fashion-MNIST; sharded: DDP, FSDP, "
                             "ZeRO++ and HSDP + DiLoCo on a wider GPT")
    parser.add_argument("--quick", action="store_true", help="one seed, a nearer target, a shorter budget "
                                                             "(~10 minutes; not evidence)")
    parser.add_argument("--out", default=None, help="output folder (default outputs/race-SUITE[-quick])")
    parser.add_argument("--only", default=None, help="comma-separated methods (default: all)")
    parser.add_argument("--links", default=None,
                        help="comma-separated links: Mbit/s, or Mbit/s:one-way delay in ms (default: the "
                             f"suite's, {','.join(map(str, LINKS))}; sharded: 1000,100)")
    parser.add_argument("--seeds", type=whole, default=None,
                        help=f"seeds per run, 1 to {MAX_SEEDS} (default 2, 3 for methods the race names; "
                             "sharded and --quick 1)")
    parser.add_argument("--workers", type=whole, default=WhatIf.workers,
                        help=f"what-if: workers, 2 to {MAX_WORKERS:,} (default {WhatIf.workers})")
    parser.add_argument("--per-node", type=whole, default=WhatIf.per_node,
                        help="what-if: workers per machine, dividing --workers (default 1: each its own)")
    parser.add_argument("--memory-gb", type=decimal, default=WhatIf.memory_gb,
                        help=f"what-if: a worker's memory, GB (default {WhatIf.memory_gb:g})")
    parser.add_argument("--params", default=None,
                        help="what-if: comma-separated model sizes in parameters, e.g. 1.3e9,7e9")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every run")
    args = parser.parse_args(argv)
    race = RACES[args.suite]
    methods = _select(args.only, race)
    whatif = _whatif(args, race, methods)
    links = _links(args.links) if args.links is not None else race.links
    if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds {args.seeds} must be within 1 to {MAX_SEEDS} (each seed is one run per "
                         "method and link); e.g. --seeds 3")
    out = Path(args.out or f"outputs/race-{race.name}{'-quick' if args.quick else ''}")
    target = race.quick_target if args.quick else race.target
    budget = race.quick_budget_s if args.quick else race.budget_s
    entries = [(m, link, seed, out / "runs" / f"{m}-{link.folder}-s{seed}") for m in methods for link in links
               for seed in range(race.seeds_of(m, args.seeds, args.quick))]
    # Other work on the machine: the workers take the cores first (nice=-20; shaped links need root
    # anyway), and the budget counts the clock a loaded machine does not stretch (budget_clock=unloaded;
    # a race on GPUs passes budget_clock=wall)
    # evaluations 4x as often within 15% of the target: the crossing's resolution within 10% of the time
    race_keys = [target, "stop_at_target=true", "eval_near_target=0.15", f"max_train_s={budget:g}",
                 "budget_clock=unloaded", "nice=-20"]
    # A key given on the command line replaces the race's own (nice=10, a longer budget), said once;
    # the links are the race's to set (--links).
    given = {override_key(o) for o in args.overrides}
    link_keys = sorted(given & LINK_KEYS)
    if link_keys:
        raise ValueError(f"{link_keys[0]} is set by the race's links; drop it and pass --links "
                         "MBPS[:DELAY_MS],...")
    race_keys = [k for k in race_keys if override_key(k) not in given]
    jobs: list[Job] = [(run_dir, [*race.base, *race.methods[m], *link.overrides, *race_keys, *args.overrides,
                                  f"seed={seed}"])
                       for m, link, seed, run_dir in entries]
    check_jobs(jobs, out / "runs" / "_check")
    code = run_jobs(jobs, "race")
    if code == INTERRUPTED_EXIT:
        return code
    text = write(out, race, load(entries), args.quick, TARGETS.get(race.name), whatif)
    print(text)
    print(f"race: {out / 'race.md'}, {out / 'race.csv'}, plots in {out / 'plots'}", flush=True)
    return code


def _whatif(args: argparse.Namespace, race: Race, methods: list[str]) -> WhatIf:
    """The what-if's configuration, each flag checked (one ValueError line naming the fix)."""
    n, per = args.workers, args.per_node
    if not 2 <= n <= MAX_WORKERS:
        raise ValueError(f"--workers {n} must be a whole number of workers from 2 to {MAX_WORKERS:,}, "
                         "e.g. --workers 8")
    if per < 1 or n % per:
        raise ValueError(f"--per-node {per} must divide --workers {n} (machines of that many workers "
                         "each), e.g. --per-node 1")
    if not 0 < args.memory_gb <= 1e6:
        raise ValueError(f"--memory-gb {args.memory_gb:g} must be a worker's memory in GB, above 0 and "
                         "at most 1e+06, e.g. --memory-gb 80")
    for m in methods:  # HSDP keeps its groups' size: the workers must make 2 or more of them
        keys = {override_key(o): o.partition("=")[2] for o in (*race.base, *race.methods[m], *args.overrides)
                if "=" in o}
        group = keys.get("sharding.group_size", "node")
        if keys.get("sharding") == "hsdp" and group.isdigit() and (n % int(group) or n // int(group) < 2):
            raise ValueError(f"--workers {n}: method {m} shards in groups of {group} (sharding.group_size) "
                             f"and needs a multiple of {group} from {2 * int(group)}, e.g. --workers "
                             f"{max(2 * int(group), n - n % int(group))}")
    params: tuple[float, ...] = ()
    if args.params is not None:
        try:
            params = tuple(decimal(x) for x in _items(args.params))
        except argparse.ArgumentTypeError:
            params = ()
        if not params or not all(1 <= x <= MAX_PARAMS for x in params):
            raise ValueError(f"--params {args.params} must be a comma-separated list of model sizes in "
                             f"parameters, each from 1 to {MAX_PARAMS:g}, e.g. --params 1.3e9,7e9")
        _once("--params", args.params, list(params))
    return WhatIf(workers=n, per_node=per, memory_gb=args.memory_gb, params=params)


def _select(only: str | None, race: Race) -> list[str]:
    if only is None:
        return list(race.methods)
    wanted = _items(only)
    unknown = [w for w in wanted if w not in race.methods]
    if unknown or not wanted:
        raise ValueError(f"--only {only}: unknown method {', '.join(unknown) or '(an empty item)'}; "
                         f"choose from {', '.join(race.methods)}")
    _once("--only", only, wanted)
    return wanted


def _once(flag: str, text: str, items: list) -> None:
    """A list flag names each item once: a second run of the same method on the same link would
    replace the first's finished folder."""
    twice = next((x for i, x in enumerate(items) if x in items[:i]), None)
    if twice is not None:
        raise ValueError(f"{flag} {text} names {twice} twice; give each once")


def _links(text: str) -> tuple[Link, ...]:
    links: list[Link] = []
    low, high = (1e3 * g for g in RATE_GBPS)  # a shaped link's rates (compbench.network.netem), in Mbit/s
    try:
        for item in _items(text):
            rate, colon, delay = item.partition(":")
            links.append(Link(decimal(rate), decimal(delay) if colon else 0.0))
    except argparse.ArgumentTypeError:
        links = []
    if not links or not all(low <= x.mbps <= high and x.delay_ms >= 0 for x in links):
        raise ValueError(f"--links {text} must be a comma-separated list of links, each a rate in Mbit/s "
                         f"from {low:g} to {high:g} and optionally a one-way delay in ms >= 0 after a colon, "
                         "e.g. --links 10,200:25")
    _once("--links", text, links)
    _once("--links", text, [x.folder for x in links])  # 10 and 10.000001 would share a run's folder
    return tuple(links)


def _items(text: str) -> list[str]:
    """A comma-separated flag's items; an empty one (`10,,100`, a trailing comma) is a mistake, not
    nothing: the list would not be what was meant."""
    items = [x.strip() for x in text.split(",")]
    return [] if "" in items else items
