"""`scheduler=layerwise`: one group per tensor, in back-propagation order (reverse registration)."""

from __future__ import annotations

import torch
from torch import nn

from compbench.train.pipeline import GradientPipeline


class Layerwise:
    """Hands each parameter's gradient to the pipeline, then writes back the averaged gradients."""

    def setup(self, model: nn.Module) -> None:
        self.params = [(n, p) for n, p in reversed(list(model.named_parameters())) if p.requires_grad]

    def before_backward(self, pipeline: GradientPipeline) -> None:
        pass  # no overlap: everything is submitted after back-propagation

    def summary(self) -> dict:
        return {"name": "layerwise", "groups": len(self.params)}

    def synchronize(self, pipeline: GradientPipeline) -> None:
        for name, p in self.params:
            if p.grad is None:  # unused this step: every rank must still send it (same collectives everywhere)
                p.grad = torch.zeros_like(p)
            pipeline.submit(name, p.grad)
        by_name = dict(self.params)
        for name, grad in pipeline.collect():
            by_name[name].grad.copy_(grad.view_as(by_name[name].grad))
