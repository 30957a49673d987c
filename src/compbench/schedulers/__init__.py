"""Schedulers: when and on what the compression pipeline runs (grouping, selection, partitioning).

A scheduler has four methods, called by the trainer (and by `wrap_compress_optimizer`):
- `setup(model)`: once, before training;
- `before_backward(pipeline)`: each step, before `loss.backward()` (overlapping schedulers arm
  their gradient hooks here and `pipeline.submit` groups as soon as they are complete);
- `synchronize(pipeline)`: each step, after back-propagation: submit what is left, then
  `pipeline.collect()` and write the averaged gradients into `p.grad`;
- `summary() -> dict`: what it decided (written to results.json).
Every rank must submit the same groups in the same order.
"""
