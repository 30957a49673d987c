"""`scheduler=mergecomp`: MergeComp (Wang et al.): gradients fused into a few flat groups in
back-propagation order, balanced by bytes; each group is compensated, compressed and sent as one
tensor as soon as its last gradient is ready (overlap as in `layerwise`).

The first step runs uncompressed and records the ready order (rank 0's, broadcast). `groups=0` is
layer-wise, `groups=1` the whole model in one group, `groups=auto` searches the grouping by timing
real training steps (`PartitionSearch`). Unlike the published code, the user's optimizer is always
used (MergeComp with two or more groups replaced it by plain SGD), and the search is not limited to
one split point: several group counts and group-size profiles, sized by bytes, not tensor counts.
"""

from __future__ import annotations

import math
import statistics
import warnings

from compbench.schedulers import SchedulerTraits
from compbench.schedulers.fusion import balanced_cuts, regroup_state, split
from compbench.schedulers.layerwise import Layerwise
from compbench.seam.pipeline import GradientPipeline

Candidate = tuple[int, float]  # (groups, skew); groups 0 = one group per tensor


class PartitionSearch:
    """The `groups=auto` search: a walk over (groups, skew) candidates, each timed on real steps.

    1. group counts 1, 2, 4, ... up to `max_groups`, then layer-wise (0), all balanced by bytes;
    2. the geometric neighbours of the best count (x sqrt 2 and / sqrt 2, rounded);
    3. for the best count (>= 2), skewed sizes: the last group (ready last: nothing hides its
       communication) half the first, or double it; then further in the better direction (x 1/2 or
       x 2) for as long as that keeps winning;
    4. the `confirm` best candidates are timed once more, budget permitting (a busy machine makes
       single trials noisy): the choice is the best median over all of a candidate's timed steps.
    At most `max_trials` trials in all. Every rank runs the same walk on rank 0's times (the
    scheduler broadcasts them), so every rank takes the same groupings at the same steps.
    """

    def __init__(self, num_tensors: int, max_groups: int, max_trials: int, confirm: int = 2) -> None:
        self.limit = max(1, min(max_groups, num_tensors))
        self.max_trials, self.confirm = max_trials, confirm
        counts = [1 << e for e in range(int(math.log2(self.limit)) + 1)]
        self.queue: list[Candidate] = [(g, 1.0) for g in counts] + [(0, 1.0)]
        # the confirmation takes its trials from the walk's budget, never from the first sweep
        self.walk_trials = max(max_trials - confirm, min(max_trials, len(self.queue)))
        self.stage = 1
        self.trials = 0
        self.samples: dict[Candidate, list[float]] = {}
        self.finalists: list[Candidate] | None = None  # set when the walk is over

    @property
    def times(self) -> dict[Candidate, float]:
        return {c: statistics.median(s) for c, s in self.samples.items()}

    def best(self) -> Candidate:
        times = self.times
        return min(times, key=lambda c: (times[c], c))

    def report(self, candidate: Candidate, samples: list[float]) -> None:
        self.samples.setdefault(candidate, []).extend(samples)
        self.trials += 1

    def next(self) -> Candidate | None:
        """The next candidate to time, or None when the search is over (then take `best()`)."""
        if self.finalists is None:
            candidate = self._walk() if self.trials < self.walk_trials else None
            if candidate is not None:
                return candidate
            times = self.times
            ranked = sorted(times, key=lambda c: (times[c], c))
            self.finalists = ranked[: self.confirm] if len(ranked) > 1 else []
        if self.finalists and self.trials < self.max_trials:
            return self.finalists.pop(0)
        return None

    def _walk(self) -> Candidate | None:
        while True:
            self.queue = [c for c in self.queue if c not in self.samples]
            if self.queue:
                return self.queue.pop(0)
            more = self._more()
            if more is None:
                return None
            self.queue = more

    def _more(self) -> list[Candidate] | None:
        """Candidates of the next stage (None: the walk is over)."""
        if not self.samples:
            return None
        groups, skew = self.best()
        self.stage += 1
        if self.stage == 2:
            near = {round(groups * math.sqrt(2)), round(groups / math.sqrt(2))}
            return [(g, 1.0) for g in sorted(near) if 1 <= g <= self.limit] if groups >= 1 else []
        if self.stage == 3:
            return [(groups, 0.5), (groups, 2.0)] if groups >= 2 else []
        further = (groups, skew / 2 if skew < 1 else skew * 2)
        if skew == 1.0 or further in self.samples or not 1 / 16 <= further[1] <= 16:
            return None
        return [further]

    def state_dict(self) -> dict:
        """The walk so far as plain data (candidates as [groups, skew] lists)."""
        return {"queue": [list(c) for c in self.queue], "stage": self.stage, "trials": self.trials,
                "samples": [[g, s, list(ms)] for (g, s), ms in self.samples.items()],
                "finalists": None if self.finalists is None else [list(c) for c in self.finalists]}

    def load_state_dict(self, state: dict) -> None:
        self.queue = [_candidate(c) for c in state["queue"]]
        self.stage, self.trials = int(state["stage"]), int(state["trials"])
        self.samples = {_candidate((g, s)): [float(x) for x in ms] for g, s, ms in state["samples"]}
        finalists = state["finalists"]
        self.finalists = None if finalists is None else [_candidate(c) for c in finalists]


class MergeComp(Layerwise):
    """MergeComp's fused groups over the overlap machinery of `Layerwise` (see the module docstring).

    Error-feedback and compressor state follows a change of grouping (it is re-cut, not reset), so
    the search costs only its slower steps. Members with fewer than `min_dims` dimensions travel in
    a dense part of their group; `compress_threshold` and `dense_steps` apply to each group.
    """

    name = "mergecomp"
    traits = SchedulerTraits(fuses=True)

    def __init__(self, groups: int | str = 4, overlap: bool = True, max_groups: int = 16,
                 trial_steps: int = 4, search_steps: int = 60, confirm: int = 2) -> None:
        super().__init__(overlap)
        if groups != "auto" and (isinstance(groups, bool) or not isinstance(groups, int) or groups < 0):
            raise ValueError(f"scheduler.groups={groups!r} must be an integer >= 0 (0: layer-wise) or auto")
        if trial_steps < 2:
            raise ValueError(f"scheduler.trial_steps={trial_steps} must be >= 2 (a warm-up step, then timed)")
        if max_groups < 1 or confirm < 0 or search_steps < trial_steps:
            raise ValueError(f"scheduler.max_groups={max_groups} must be >= 1, confirm={confirm} >= 0 and "
                             f"search_steps={search_steps} >= trial_steps={trial_steps}")
        self.requested, self.max_groups = groups, int(max_groups)
        self.trial_steps, self.search_steps, self.confirm = int(trial_steps), int(search_steps), int(confirm)

    def setup(self, model) -> None:
        super().setup(model)
        self.search: PartitionSearch | None = None
        self.tried: dict[Candidate, list[float]] = {}  # the search's timed steps (rank 0's), for the summary
        self.current: Candidate = (0, 1.0)
        self.trial: list[float] = []
        self.search_used = 0  # steps spent on trials
        self.search_end_step: int | None = None
        self.dense_step = True  # the first step runs uncompressed (it records the ready order)

    def on_order_recorded(self, pipeline: GradientPipeline) -> None:
        self.dense_step = False
        if self.requested == "auto":
            trials = self.search_steps // self.trial_steps
            self.search = PartitionSearch(len(self.params), self.max_groups, trials, self.confirm)
            self.tried = self.search.samples
            self._use(pipeline, self.search.next() or (4, 1.0))
        else:
            n = len(self.params)
            assert not isinstance(self.requested, str)  # "auto" is handled above
            if self.requested > n:
                warnings.warn(f"scheduler.groups={self.requested} > {n} tensors: using {n}", stacklevel=2)
            self._use(pipeline, (int(self.requested), 1.0))

    def _use(self, pipeline: GradientPipeline, candidate: Candidate) -> None:
        """Regroup for `candidate` from the next step on; state follows the new groups."""
        groups, skew = candidate
        if groups == 0:
            runs = [[i] for i in self.order]
        else:
            nbytes = [self.params[i][1].numel() * self.params[i][1].element_size() for i in self.order]
            runs = split(self.order, balanced_cuts(nbytes, groups, skew))
        old = self.groups
        self.current = candidate
        self.set_runs(runs)
        self._build(pipeline)
        regroup_state(pipeline, old, self.groups)

    @property
    def searching(self) -> bool:
        """The `groups=auto` search is on: its steps are timed to the end of their work."""
        return self.search is not None

    def after_step(self, pipeline: GradientPipeline, ms: float) -> None:
        if self.search is None or not self.order_recorded or self.steps == 0:
            return
        if pipeline.step < pipeline.selection.dense_steps or pipeline.dense_now:
            return  # warm-up steps are not compressed: nothing to learn from their times
        self.trial.append(ms)
        self.search_used += 1
        if len(self.trial) < self.trial_steps:
            return
        mine = self.trial[1:]  # the first step of a trial pays for new buffers and names
        self.trial = []
        rank0 = pipeline.engine.broadcast_object(mine if pipeline.engine.rank == 0 else None, 0)
        self.search.report(self.current, rank0)
        nxt = self.search.next()
        if nxt is None:
            self._use(pipeline, self.search.best())
            self.search, self.search_end_step = None, pipeline.step + 1
            if pipeline.engine.rank == 0:
                self._print_choice()
        else:
            self._use(pipeline, nxt)

    def state_dict(self) -> dict:
        """Layerwise's order and grouping, plus the grouping's candidate, whether the dense first step
        is still to come, and the `groups=auto` search (the walk, the current trial's times, the steps
        spent): a resumed run neither repeats its dense step nor its search. Plain data only."""
        return {**super().state_dict(), "current": list(self.current), "trial": list(self.trial),
                "search_used": self.search_used, "search_end_step": self.search_end_step,
                "tried": [[g, s, list(ms)] for (g, s), ms in self.tried.items()],
                "search": None if self.search is None else self.search.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.current = _candidate(state["current"])
        self.trial = [float(x) for x in state["trial"]]
        self.search_used = int(state["search_used"])
        end = state["search_end_step"]
        self.search_end_step = None if end is None else int(end)
        self.tried = {_candidate((g, s)): [float(x) for x in ms] for g, s, ms in state["tried"]}
        self.search = None
        if state["search"] is not None:
            self.search = PartitionSearch(len(self.params), self.max_groups,
                                          self.search_steps // self.trial_steps, self.confirm)
            self.search.load_state_dict(state["search"])
            self.tried = self.search.samples  # one record, as in on_order_recorded

    def _print_choice(self) -> None:
        tried = ", ".join(f"{_label(c)} {statistics.median(ms):.1f}" for c, ms in sorted(self.tried.items()))
        print(f"scheduler=mergecomp: groups=auto chose {_label(self.current)} after {self.search_used} steps "
              f"(ms per backward+sync: {tried})", flush=True)

    def summary(self) -> dict:
        sizes = [g.nbytes for g in self.groups]
        return {
            "name": self.name,
            "requested": self.requested,
            "groups": len(self.groups),
            "layerwise": self.current[0] == 0,
            "skew": self.current[1],
            "overlap": self.overlapping,
            "group_tensors": [len(g.members) for g in self.groups],
            "group_mb": [round(b / 2**20, 3) for b in sizes],
            "search": [{"groups": c[0], "skew": c[1], "ms": round(statistics.median(ms), 3), "steps": len(ms)}
                       for c, ms in self.tried.items()],
            "search_steps": self.search_used,
            "search_end_step": self.search_end_step,
        }


def _candidate(c: list | tuple) -> Candidate:
    """A candidate read back from plain data ([groups, skew])."""
    groups, skew = c
    return int(groups), float(skew)


def _label(c: Candidate) -> str:
    groups, skew = c
    name = "layerwise" if groups == 0 else f"{groups} group{'s' if groups > 1 else ''}"
    return name if skew == 1.0 else f"{name} skew {skew:g}"
