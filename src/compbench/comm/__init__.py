"""Communicators: one file each (file name = config name = registry name), one protocol for all.

A gradient (or fused group) goes in with its memory; a handle to the averaged dense gradient comes
out (`reduce`). The memory -> compress -> update step is `base.encode`, shared by every communicator.
Adding a communicator = its file here + `conf/comm/NAME.yaml`; what it accepts is its `traits`,
which the config check (compbench.compose.compat) reads.
"""
