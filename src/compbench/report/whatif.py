"""What-if scaling of a run: its measured phases plus the node-aware alpha-beta model of
`cost_model.py` (assumptions below)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compbench.comm.cost_model import Fit, Shape, features, pattern

ASSUMPTIONS = """Assumptions of the model (`comm/cost_model.py`):
- N workers, L per machine (`--per-node`, default 1: every worker its own machine), each machine one
  link of G Gbit/s each way; collectives as Gloo runs them: ring allreduce and ring allgather (ranks
  in machine order, so a machine link carries one chunk per round) and an all-to-all that posts every
  message at once (a machine link carries L * (N-L) of them); comm=hierarchical sends one payload
  per machine between machines and the dense gradients to and from the machine's leader inside it;
- per step: a cost per collective (for those a blocking communicator waits for one by one, per
  peer; for those an asynchronous one starts together, a fixed one), a latency per message round,
  the busiest link's bytes at G (times a link factor) and the bytes all workers send at the
  machine's copy rate;
  with `--fit FILE` (fit.json of scripts/whatif_cluster.py) the five are the ones fitted on an
  emulated cluster, else `--latency-us` per round and nothing else;
- one collective per communicated group per step (as the run's scheduler did); dense (uncompressed)
  groups go through ring allreduce;
- compute, encode and optimizer times are the run's measured medians and do not change with N;
  decoding grows linearly with the number of payloads decoded (allgather decodes N, ring and PS
  about a constant amount);
- no overlap of communication with back-propagation (an upper bound on the step time);
- the payload size per rank does not depend on N (true for every compressor here).
"""


def break_even_workers(dense_bytes: float, sparse_bytes: float) -> float:
    """Largest N for which N * S_sparse < 2(N-1)/N * S_dense (allgather beats a dense allreduce).

    inf when the payload is so small that it wins for every N; 1 when it never wins.
    """
    if sparse_bytes <= 0:
        return math.inf
    d, s = dense_bytes, sparse_bytes
    disc = d * d - 2 * s * d  # from s N^2 - 2 d N + 2 d < 0
    if disc < 0:
        return 1.0
    upper = (d + math.sqrt(disc)) / s
    n = math.ceil(upper) - 1  # strict inequality
    return float(max(1, n))


@dataclass
class RunProfile:
    """What the model needs from one run (medians per step, per rank)."""

    comm: str
    world_size: int
    compute_ms: float
    compress_ms: float
    decompress_ms: float
    optimizer_ms: float
    compressed_bytes: float  # on the run's communicator
    dense_bytes: float  # uncompressed groups through allreduce
    compressed_calls: int
    dense_calls: int
    gradient_bytes: float = 0.0  # fp32 size of all gradients (comm=hierarchical's traffic inside a machine)


def default_fit(alpha_us: float) -> Fit:
    """The model without a fit: `alpha_us` per message round, links at their rate, no other cost."""
    return Fit(ms_per_waited=0.0, ms_per_queued=0.0, ms_per_round=alpha_us * 1e-3, link_factor=1.0,
               machine_gb_per_s=math.inf)


def load_fit(path: str) -> Fit:
    """A fit.json written by scripts/whatif_cluster.py; one-line ValueError when it is not one."""
    import json
    from pathlib import Path

    try:
        return Fit(**json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"--fit {path}: not a fit.json of scripts/whatif_cluster.py ({e}); "
                         f"run `python scripts/whatif_cluster.py --fit` or leave --fit out") from None


def predict_step_ms(p: RunProfile, n: int, gbps: float, model: Fit, per_node: int = 1) -> float:
    """The run's step time with N workers, `per_node` of them per machine, on links of `gbps`."""
    comm = p.comm
    shape = Shape(nodes=max(1, n // max(1, per_node)), workers=n, gbps=gbps)
    row = {"comm": comm, "bytes_sent_per_step": p.compressed_bytes + p.dense_bytes,
           "bytes_allreduce_per_step": p.dense_bytes, "bytes_dense_per_step": p.gradient_bytes,
           "compressed_calls_per_step": p.compressed_calls, "dense_calls_per_step": p.dense_calls}
    comm_ms = model.comm_ms(features(row, shape)) if n > 1 else 0.0
    decode = p.decompress_ms * (n / p.world_size if pattern(comm) == "allgather" else 1.0)
    return p.compute_ms + p.compress_ms + decode + p.optimizer_ms + comm_ms


def profile_from_results(results: dict) -> RunProfile:
    s, cfg = results["summary"], results["config"]
    sent = s.get("bytes_sent_per_step") or 0.0
    dense = s.get("bytes_allreduce_per_step")
    calls_c, calls_d = s.get("compressed_calls_per_step"), s.get("dense_calls_per_step")
    if dense is None:  # older results: assume every byte went through the run's communicator
        dense, calls_c, calls_d = 0.0, 1, 0
    return RunProfile(
        comm=cfg.get("choices", {}).get("comm", "allgather"), world_size=results["environment"]["world_size"],
        compute_ms=s.get("compute_ms") or 0.0, compress_ms=s.get("compress_ms") or 0.0,
        decompress_ms=s.get("decompress_ms") or 0.0, optimizer_ms=s.get("optimizer_ms") or 0.0,
        compressed_bytes=max(0.0, sent - dense), dense_bytes=dense,
        compressed_calls=int(calls_c or 0), dense_calls=int(calls_d or 0),
        gradient_bytes=s.get("bytes_dense_per_step") or 0.0,
    )
