"""Datasets (offline only: shipped with a package, synthetic, or from a local root) and sharding."""

import compbench._torchvision_compat  # noqa: F401  (before torchvision is imported)
