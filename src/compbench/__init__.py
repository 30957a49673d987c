"""compbench: config-driven experiments with gradient compression in data-parallel training."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["wrap_compress_optimizer"]


def __getattr__(name: str) -> Any:
    # Lazy: `import compbench` stays cheap (the CLI's argument errors come back at once).
    if name == "wrap_compress_optimizer":
        from compbench.wrap import wrap_compress_optimizer

        return wrap_compress_optimizer
    raise AttributeError(name)
