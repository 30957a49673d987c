"""compbench: config-driven experiments with gradient compression in data-parallel training."""

from typing import Any

from compbench.base import kernel_sources

__version__ = "0.1.0"
__all__ = ["wrap_compress_optimizer"]


def __getattr__(name: str) -> Any:
    # Lazy: `import compbench` stays cheap (the CLI's argument errors come back at once).
    if name == "wrap_compress_optimizer":
        from compbench.compose.wrap import wrap_compress_optimizer

        return wrap_compress_optimizer
    raise AttributeError(name)


def _compll_kernel_sources() -> kernel_sources.GeneratedSources:
    # Imported when the kernels first ask (they stand below CompLL and never import it).
    from compbench.compll.generated import sources_for_kernels

    return sources_for_kernels()


kernel_sources.provide(_compll_kernel_sources)
