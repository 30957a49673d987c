"""Schedulers: when and on what the compression pipeline runs (grouping, selection, partitioning)."""
