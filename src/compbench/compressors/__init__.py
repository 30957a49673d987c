"""Gradient compressors: one file each; file name = config name = registry name."""

from __future__ import annotations

from typing import Any

from compbench.codec.base import Compressor, CompressorBase, Ctx, make_ctx, payload_nbytes

# Keys of a compressor's config that say *which* tensors it compresses (pipeline policy shared by
# every compressor), not how: they are split off before the compressor is built.
SELECTION_KEYS = ("min_dims", "compress_threshold", "dense_steps")


def build_compressor(name: str, **overrides: Any) -> Compressor:
    """Build compressor `name` from its config file, with keyword overrides (tests, scripts, bench)."""
    from compbench import registry

    cfg = {**registry.option_config("compressor", name), **overrides}
    return registry.build(cfg, drop=SELECTION_KEYS)


__all__ = ["Compressor", "CompressorBase", "Ctx", "make_ctx", "payload_nbytes", "build_compressor",
           "SELECTION_KEYS"]
