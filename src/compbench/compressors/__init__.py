"""Gradient compressors: one file each; file name = config name = registry name."""

from __future__ import annotations

from typing import Any

from compbench.base.values import KeyRange
from compbench.codec.base import Compressor, CompressorBase, Ctx, make_ctx, payload_nbytes

# Keys of a compressor's config that say *which* tensors it compresses (pipeline policy shared by
# every compressor), not how: they are split off before the compressor is built.
SELECTION_KEYS = ("min_dims", "compress_threshold", "dense_steps")
# Their ranges (compbench.compose.checks reads them with each compressor's own KEY_RANGES).
SELECTION_RANGES = {"min_dims": KeyRange(0, what="dimensions a tensor needs to be compressed"),
                    "compress_threshold": KeyRange(0, what="elements below which a tensor is sent dense"),
                    "dense_steps": KeyRange(0, what="steps sent dense before compressing")}


def build_compressor(name: str, **overrides: Any) -> Compressor:
    """Build compressor `name` from its config file, with keyword overrides (tests, scripts, bench)."""
    from compbench.catalog import registry

    cfg = {**registry.option_config("compressor", name), **overrides}
    return registry.build(cfg, drop=SELECTION_KEYS)


__all__ = ["Compressor", "CompressorBase", "Ctx", "make_ctx", "payload_nbytes", "build_compressor",
           "SELECTION_KEYS"]
