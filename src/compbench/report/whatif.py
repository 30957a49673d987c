"""What-if scaling with the alpha-beta network model of ALGORITHMS.md (assumptions below)."""

from __future__ import annotations

import math
from dataclasses import dataclass

ASSUMPTIONS = """Assumptions of the model:
- alpha (latency per message) and B (bandwidth per worker link) are the same for every link; the
  collective algorithms are ring allreduce, direct allgather and PS (all-to-all + all-gather);
- one collective per communicated group per step (as the run's scheduler did), each paying its
  latency term; dense (uncompressed) groups go through ring allreduce;
- compute, encode and optimizer times are the run's measured medians and do not change with N;
  decoding grows linearly with the number of payloads decoded (allgather decodes N, ring and PS
  about a constant amount);
- no overlap of communication with back-propagation (an upper bound on the step time);
- the payload size per rank does not depend on N (true for every compressor here);
- comm=hierarchical: N counts nodes (one payload per node), the copies inside a node are free.
"""


def ring_allreduce_s(n: int, nbytes: float, alpha_s: float, bytes_per_s: float) -> float:
    """2(N-1) alpha + 2(N-1)/N * S/B."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / bytes_per_s


def allgather_s(n: int, nbytes: float, alpha_s: float, bytes_per_s: float) -> float:
    """(N-1) alpha + (sum over the N-1 peers of S_j)/B, every rank sending S."""
    if n <= 1:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) * nbytes / bytes_per_s


def ps_s(n: int, nbytes: float, alpha_s: float, bytes_per_s: float) -> float:
    """All-to-all of S/N shards, then all-gather of the compressed S/N shards."""
    if n <= 1:
        return 0.0
    shard = nbytes / n
    return 2 * ((n - 1) * alpha_s + (n - 1) * shard / bytes_per_s)


# hierarchical: N counts nodes (one payload per node crosses the network, as an allgather among the
# leaders); its copies inside a node are not modelled.
COMM_MODELS = {"allreduce": ring_allreduce_s, "allgather": allgather_s, "ps": ps_s, "ring": ring_allreduce_s,
               "hierarchical": allgather_s}


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


def predict_step_ms(p: RunProfile, n: int, gbps: float, alpha_us: float) -> float:
    bytes_per_s = gbps * 1e9 / 8
    alpha = alpha_us * 1e-6
    model = COMM_MODELS.get(p.comm, allgather_s)
    comm_s = 0.0
    if p.compressed_calls:
        comm_s += p.compressed_calls * model(n, p.compressed_bytes / p.compressed_calls, alpha, bytes_per_s)
    if p.dense_calls:
        comm_s += p.dense_calls * ring_allreduce_s(n, p.dense_bytes / p.dense_calls, alpha, bytes_per_s)
    decode = p.decompress_ms * (n / p.world_size if p.comm == "allgather" else 1.0)
    return p.compute_ms + p.compress_ms + decode + p.optimizer_ms + comm_s * 1e3


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
    )
