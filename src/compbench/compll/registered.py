"""The compressors of the registered CompLL specs, by spec name: the `_target_` of their generated
conf entries (`compbench.compll.registered.NAME`). Each is the `Compressor` class of the spec's
generated torch module (`gen_torch`), built on first access."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from compbench.compll import gen_torch, runtime

    if name.startswith("__"):
        raise AttributeError(name)
    try:
        s = runtime.spec(name)
    except ValueError as e:
        raise AttributeError(str(e)) from None
    if not s.register:
        raise AttributeError(f"CompLL spec {name} is a kernel of a hand-written compressor, not a compressor")
    return gen_torch.module(s).Compressor
