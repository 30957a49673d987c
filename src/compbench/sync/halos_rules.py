"""The servers' arithmetic and decisions of `sync=halos` (compbench.sync.halos), with no transport.

HALoS (Kim et al., "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for Geo-Distributed
Large Language Model Training", ICML 2025, arXiv 2506.04531; code: github.com/utnslab/halos, commit
4b5bf73). Each rule below names the file and function of utnslab/halos it was read from.

Delayed Nesterov (`DelayedNesterov`; halos `src/halos/opt.py`, `DelayedNesterovOptimizer.step`,
itself after Liu et al. 2024, arXiv 2401.09135). Both servers step their model θ with it, on
"gradients" g that are model differences. Settings: lr γ, momentum β, delay N (the reference's
`buffer_size`), activation c (the reference's `c`, default 0). State: step count t, momentum m
(zeros), buffer Δ (zeros). One step with g:

    Δ ← Δ + g
    if (t + 1) mod N = 0:   m ← β·m + Δ/N;   θ ← θ − γ·(((1 − c·N + c)·β)·m + g/N);   Δ ← 0
    else:                                      θ ← θ − γ·((c·β)·m + g/N)
    t ← t + 1

The scalar factors are multiplied first (as Python evaluates the reference's expression), then
the tensors, in the order written: `delayed_nesterov_step` follows it op by op so that a replay
agrees bit for bit. γ is the reference's optimizer `lr`, which its example (`examples/run_halos.sh`)
sets to the paper's learning rate times N (`_LLR=$(multiply $LLR $LMUD)`): a step that does not
update m moves θ by (η·N)·g/N = η·g. compbench's settings are the paper's η (`local_lr`,
`global_lr`); γ = η·N is formed here (`ServerOptim.gamma`).

Local parameter server (`LocalServer`; halos `src/halos/simulation/exec_halos.py`,
`LocalParameterServer`):
- a worker's update (`on_new_worker_pgrads`, via `ParameterServer.update_model` in
  `src/halos/ps.py`): g = the worker's θ_start − θ_end after its H local steps
  (`src/halos/worker.py`, `Worker.run_local_steps`), one delayed Nesterov step of θ_L (η_l, β_l,
  N_l); v ← v + 1; the worker continues from the new θ_L (`_schedule_worker`).
- when v = v_merged + K (`local_updates_accumulation`), the LPS sends u = θ_merged − θ_L (the change
  since its last merge, `_send_updates_to_gps`) to the GPS. It sends again only after the GPS's
  answer was merged: one exchange in flight per LPS.
- the GPS's answer θ_G (`on_new_global_model`, via `ParameterServer.merge_model`):
  θ_L ← θ_L·(1 − α) + θ_G·α (α: `model_merge_weight`, in place: `θ_L *= 1 − α; θ_L += θ_G·α`);
  θ_merged ← θ_L; v_merged ← v. Worker updates applied while the exchange travelled stay in θ_L
  with weight 1 − α (the reference's argument help says the opposite weighting; its code, followed
  here, weights the global model by α).
- staleness of a worker's update: the updates the LPS applied between sending the worker its θ
  and receiving the worker's g (0: nobody else updated the LPS meanwhile).
- the stop (compbench's, not the reference's, whose simulator ends when the GPS has counted its
  total steps: `HalosSimulator.training_done`): once the LPS has learnt that rank 0's training ended
  (`stop`), it applies no further g: each later delivery is counted (`after_stop`, its compute
  seconds in `discarded_s`) and answered with the stop. Rank 0 has evaluated its last model by
  then, so no update applied after the stop could reach an evaluated model.

Global parameter server (`GlobalServer`; halos `exec_halos.py`, `HalosSimulator.on_new_lps_updates`):
an LPS's u is one delayed Nesterov step of θ_G (η_g, β_g, N_g); the GPS answers that LPS with the
new θ_G.

Initial models: every server and worker starts from the same θ_0 (the reference loads the same
pretrained-architecture model in each; compbench: rank 0's initial parameters, broadcast by the
trainer).

Defaults (`examples/run_halos.sh`, the paper's Pythia-70M setting): H = 8, η_l = 0.2, β_l = 0.9,
N_l = 16, η_g = 0.15, β_g = 0.5, N_g = 2, α = 0.25, K = 32, c = 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class ServerOptim:
    """One server's delayed Nesterov settings, as the paper's η (the step is γ = η·N, see the module)."""

    lr: float
    momentum: float
    delay: int
    activation: float = 0.0

    @property
    def gamma(self) -> float:
        return self.lr * self.delay


class DelayedNesterov:
    """The delayed Nesterov state of one server over flat θ (see the module's equations)."""

    def __init__(self, theta: Tensor, settings: ServerOptim) -> None:
        self.settings = settings
        self.t = 0
        self.m = torch.zeros_like(theta)
        self.buffer = torch.zeros_like(theta)

    @torch.no_grad()
    def step(self, theta: Tensor, g: Tensor) -> None:
        """θ ← one delayed Nesterov step with g, in place."""
        s = self.settings
        self.t = delayed_nesterov_step(theta, g, self.m, self.buffer, self.t, s.gamma, s.momentum, s.delay,
                                       s.activation)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": self.m.clone(), "buffer": self.buffer.clone()}


@torch.no_grad()
def delayed_nesterov_step(theta: Tensor, g: Tensor, m: Tensor, buffer: Tensor, t: int, gamma: float,
                          beta: float, delay: int, c: float) -> int:
    """One delayed Nesterov step on θ, m and the buffer (in place); returns the next t."""
    buffer += g
    if (t + 1) % delay == 0:
        m.copy_(beta * m + buffer / delay)
        theta -= gamma * ((1 - c * delay + c) * beta * m + g / delay)
        buffer.zero_()
    else:
        theta -= gamma * (c * beta * m + g / delay)
    return t + 1


@torch.no_grad()
def merge_global(theta: Tensor, global_theta: Tensor, alpha: float) -> None:
    """θ_L ← θ_L·(1 − α) + θ_G·α, in place, in the reference's two operations."""
    theta *= 1.0 - alpha
    theta += global_theta * alpha


@dataclass
class LocalCounts:
    """What one LPS did (results.json `scheduler.halos.regions`)."""

    updates: int = 0  # worker updates applied
    pushes: int = 0  # accumulated changes sent to the GPS
    merges: int = 0  # global models merged
    staleness_sum: int = 0
    staleness_max: int = 0
    compute_s: float = 0.0  # the workers' compute seconds behind the updates applied
    after_stop: int = 0  # deliveries after the stop: not applied, answered with the stop
    discarded_s: float = 0.0  # their compute seconds

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        out["staleness_mean"] = round(self.staleness_sum / self.updates, 3) if self.updates else 0.0
        out["compute_s"] = round(self.compute_s, 3)
        out["discarded_compute_s"] = round(out.pop("discarded_s"), 3)
        return out


class LocalServer:
    """One region's LPS over flat θ (see the module). `update` returns whether the LPS must now send
    its accumulated change (`push`) to the GPS."""

    def __init__(self, theta: Tensor, optim: ServerOptim, merge_weight: float, accumulation: int) -> None:
        self.theta = theta
        self.optim = DelayedNesterov(theta, optim)
        self.merged = theta.clone()  # θ_merged: θ_L after the last merge (θ_0 at first)
        self.merge_weight, self.accumulation = float(merge_weight), int(accumulation)
        self.version = 0  # v: worker updates applied
        self.merged_version = 0
        self.in_flight = False  # a push awaits the GPS's answer
        self.stopping = False  # rank 0's training ended: no g is applied any more
        self.counts = LocalCounts()

    def update(self, g: Tensor, base: int, compute_s: float = 0.0) -> bool:
        """A worker's g, computed from θ_L at version `base`; after the stop, counted and not applied."""
        if self.stopping:
            self.counts.after_stop += 1
            self.counts.discarded_s += compute_s
            return False
        self.optim.step(self.theta, g)
        staleness = self.version - base
        self.version += 1
        c = self.counts
        c.updates += 1
        c.staleness_sum += staleness
        c.staleness_max = max(c.staleness_max, staleness)
        c.compute_s += compute_s
        return self.version == self.merged_version + self.accumulation

    def stop(self) -> None:
        """Rank 0's training ended: every later delivery is answered with the stop, not applied."""
        self.stopping = True

    def push(self) -> Tensor:
        """u = θ_merged − θ_L, the change since the last merge, to send to the GPS."""
        self.in_flight = True
        self.counts.pushes += 1
        return self.merged - self.theta

    def merge(self, global_theta: Tensor) -> None:
        """The GPS's answer θ_G."""
        merge_global(self.theta, global_theta, self.merge_weight)
        self.merged.copy_(self.theta)
        self.merged_version = self.version
        self.in_flight = False
        self.counts.merges += 1


@dataclass
class GlobalCounts:
    updates: int = 0  # LPS changes applied
    per_region: dict[int, int] = field(default_factory=dict)


class GlobalServer:
    """The GPS over flat θ: each LPS change is one delayed Nesterov step; the answer is θ_G."""

    def __init__(self, theta: Tensor, optim: ServerOptim) -> None:
        self.theta = theta
        self.optim = DelayedNesterov(theta, optim)
        self.counts = GlobalCounts()

    def update(self, region: int, u: Tensor) -> Tensor:
        self.optim.step(self.theta, u)
        self.counts.updates += 1
        self.counts.per_region[region] = self.counts.per_region.get(region, 0) + 1
        return self.theta.clone()
