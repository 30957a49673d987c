"""Datasets (offline only: shipped with a package, synthetic, or from a local root) and sharding."""
