"""`optim=muon`: torch's own `torch.optim.Muon` on the hidden weight matrices and AdamW on every other
parameter, in one optimizer object, as the Muon recipe does (Jordan et al. 2024, "Muon: An optimizer
for hidden layers in neural networks", KellerJordan/Muon; Liu et al. 2025, "Muon is Scalable for LLM
Training", arXiv 2502.16982).

Which parameters Muon steps (`matrices`): the 2-D weights of the model's `nn.Linear` layers, except
the last one registered (the output layer: a language model's head, a classifier's) and any weight
shared with an `nn.Embedding` (a tied head): the recipe keeps embeddings, the output layer, biases and
gains on AdamW. Convolution filters (4-D) stay on AdamW too: torch's Muon takes 2-D parameters only
(the reference flattens them; compbench does not). Where no model is at hand (`Muon` built from bare
parameter groups) every 2-D parameter goes to Muon.

Both halves share one `state` and one `param_groups` list (Muon's groups first), so the trainer's
learning-rate schedule scales both learning rates (`lr` and `adamw_lr`) by the same factor, and
`state_dict`/`load_state_dict` are torch's own: a resume is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from compbench.base.values import is_number, show

ADJUST_LR = (None, "original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn


def matrices(model: nn.Module) -> set[Tensor]:
    """The parameters Muon steps in `model` (see the module)."""
    embedded = {m.weight for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return {m.weight for m in linears[:-1]
            if m.weight.requires_grad and m.weight.ndim == 2 and m.weight not in embedded}


def tag_groups(groups: list[dict[str, Any]], muon: Callable[[Tensor], bool]) -> list[dict[str, Any]]:
    """Each group split in two: {"muon": True} with the parameters `muon` picks, {"muon": False} with
    the rest (empty halves dropped); a group's other keys are kept in both."""
    out = []
    for group in groups:
        for flag in (True, False):
            params = [p for p in group["params"] if muon(p) == flag]
            if params:
                out.append({**group, "params": params, "muon": flag})
    return out


def check_options(lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                  weight_decay: float = 0.0, adjust_lr_fn: str | None = None, adamw_lr: float = 1e-3,
                  adamw_betas: Any = (0.9, 0.999), adamw_eps: float = 1e-8,
                  adamw_weight_decay: float = 0.0, fused: bool = True) -> None:
    """Config-time check of optim=muon's own keys (the common ones are checked with every optimizer)."""
    if not isinstance(ns_steps, int) or isinstance(ns_steps, bool) or ns_steps < 1:
        raise ValueError(f"optim.ns_steps={show(ns_steps)} must be an integer >= 1 (Newton-Schulz "
                         "iterations); e.g. optim.ns_steps=5")
    if adjust_lr_fn not in ADJUST_LR:
        raise ValueError(f"optim.adjust_lr_fn={show(adjust_lr_fn)} is unknown; use null, original or "
                         "match_rms_adamw")
    if not isinstance(adamw_lr, int | float) or not adamw_lr > 0:
        raise ValueError(f"optim.adamw_lr={show(adamw_lr)} must be a number > 0 (AdamW's, for the parameters "
                         "Muon does not step); e.g. optim.adamw_lr=1e-3")
    betas = list(adamw_betas) if isinstance(adamw_betas, list | tuple) else [adamw_betas]
    if len(betas) != 2 or not all(is_number(b) and 0 <= b < 1 for b in betas):
        raise ValueError(f"optim.adamw_betas={show(adamw_betas)} must be two numbers in [0, 1); "
                         "e.g. optim.adamw_betas=[0.9,0.999]")
    for key, value in (("adamw_eps", adamw_eps), ("adamw_weight_decay", adamw_weight_decay)):
        if not is_number(value) or value < 0:
            raise ValueError(f"optim.{key}={show(value)} must be a number >= 0")


class Muon(torch.optim.Optimizer):
    """Muon for the groups tagged {"muon": True} (untagged groups: their 2-D parameters), AdamW for
    the rest; `lr`, `momentum`, `nesterov`, `ns_steps`, `weight_decay`, `adjust_lr_fn` are Muon's,
    the `adamw_` keys and `fused` AdamW's."""

    check_options = staticmethod(check_options)

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, weight_decay: float = 0.0,
                 adjust_lr_fn: str | None = None, adamw_lr: float = 1e-3,
                 adamw_betas: Any = (0.9, 0.999), adamw_eps: float = 1e-8,
                 adamw_weight_decay: float = 0.0, fused: bool = True) -> None:
        check_options(lr, momentum, nesterov, ns_steps, weight_decay, adjust_lr_fn, adamw_lr, adamw_betas,
                      adamw_eps, adamw_weight_decay, fused)
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [h for g in groups
                  for h in ([g] if "muon" in g else tag_groups([g], lambda p: p.ndim == 2))]
        strip = [{k: v for k, v in g.items() if k != "muon"} for g in groups]
        muon_groups = [s for s, g in zip(strip, groups, strict=True) if g["muon"]]
        adamw_groups = [s for s, g in zip(strip, groups, strict=True) if not g["muon"]]
        # Torch's optimizers refuse an empty parameter list: a half without parameters is not built.
        self.muon = torch.optim.Muon(muon_groups, lr=lr, momentum=momentum, nesterov=nesterov,
                                     ns_steps=ns_steps, weight_decay=weight_decay,
                                     adjust_lr_fn=adjust_lr_fn) if muon_groups else None
        self.adamw = torch.optim.AdamW(adamw_groups, lr=adamw_lr, betas=tuple(adamw_betas), eps=adamw_eps,
                                       weight_decay=adamw_weight_decay,
                                       fused=fused) if adamw_groups else None
        self.halves = [o for o in (self.muon, self.adamw) if o is not None]
        self.muon_groups = len(self.muon.param_groups) if self.muon else 0
        # One optimizer over both halves' groups (the same dicts: the schedule's changes reach both).
        super().__init__([g for o in self.halves for g in o.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Both halves step from this object's groups and state (after `load_state_dict` too)."""
        if self.muon is not None:
            self.muon.param_groups = self.param_groups[:self.muon_groups]
            self.muon.state = self.state
        if self.adamw is not None:
            self.adamw.param_groups = self.param_groups[self.muon_groups:]
            self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for half in self.halves:
            half.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # torch rebuilds `state` and `param_groups`
        self._share()
