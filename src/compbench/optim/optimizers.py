"""Optimizers (SGD, Adam, AdamW, Muon with AdamW: optim.muon) and the trainer's parameter groups.

The learning rate is for the global batch: it is not scaled by the number of workers, so the same
config trained on 1 worker with batch 2b or 2 workers with batch b takes the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

from compbench.base.values import show
from compbench.kernels import cpu, cuda_kernels_enabled
from compbench.optim.clip import CLIP_KEY
from compbench.optim.muon import Muon, matrices, tag_groups
from compbench.optim.schedule import SCHEDULE_KEYS

# Settings of the `optim` group that shape the learning-rate schedule, whatever the optimizer.


def _flat_entries(p: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """(flat int64 indices into p, values) of a sparse .grad, for the one-pass kernels."""
    sparse = grad.coalesce()  # a no-op for the pipeline's updates (built coalesced)
    indices = sparse.indices()
    # p's strides as Python scalars: a tensor of them would be a blocking copy to a GPU per parameter
    flat = torch.zeros(indices.shape[1], dtype=torch.int64, device=indices.device)
    for dim, stride in enumerate(p.stride()):
        flat.add_(indices[dim], alpha=stride)
    return flat, sparse.values().contiguous()


def _plus_one(step: float) -> float:
    """`step + 1` rounded as the float32 step tensor torch keeps (exact up to 2**24 steps, then as
    stuck as the tensor)."""
    return float(np.float32(step) + np.float32(1))


def _sparse_params(self: Any) -> set[Tensor]:
    """The parameters whose step takes a sparse .grad (a coalesced COO tensor: the averaged sparse
    payload) straight into its one-pass update, without a dense decode first (comm=allgather hands
    them over so: `GradientPipeline.sparse_names`). `SGD.sparse_params`, `Adam.sparse_params`."""
    return {p for group in self.param_groups if self._one_pass(group) for p in group["params"]
            if one_pass_kernels(p) is not None}


def one_pass_kernels(p: Tensor) -> ModuleType | None:
    """The compiled one-pass steps for parameter `p`'s device: `kernels.cpu` (contiguous fp32 on the
    CPU, built), `kernels.ops` (CUDA with CuPy: extensions/cuda/optim.cu), else None (the twin: the
    dense decode and torch's step). On a GPU torch's own fused step rounds as its kernel does: the
    one-pass step matches it within float rounding, not bit for bit (docs: what stays exact)."""
    if cpu.enabled(p):
        return cpu
    if cuda_kernels_enabled(p) and p.dtype == torch.float32 and p.is_contiguous():
        from compbench.kernels import ops

        return ops
    return None


def _fma_tail(kernels: ModuleType, p: Tensor) -> int:
    """torch's fused CPU kernel rounds its scalar tail differently (`kernels.cpu.fused_sgd_tail`)."""
    return cpu.fused_sgd_tail(p.numel()) if kernels is cpu else 0


@runtime_checkable
class ChecksOwnOptions(Protocol):
    """An optimizer class that checks its own keys before any worker starts (optim=muon's two halves):
    `check_options` takes the optim group's keys it names and raises ValueError (one line)."""

    @staticmethod
    def check_options(**options: Any) -> None: ...


class SGD(torch.optim.SGD):
    """torch's SGD plus one param-group option for memory=dgc, `dgc = {"weight_decay": wd,
    "momentum": m, "nesterov": bool}`: DGC's SGD (Lin et al.; synxlin/deep-gradient-compression,
    dgc/optim/sgd.py), whose momentum applies to the weight-decay term only, because the gradient
    already carries its momentum (the memory's momentum correction, before compression):

        m_wd = m * m_wd + wd * p          (first step: m_wd = wd * p)
        p   -= lr * (grad + m_wd)         (nesterov: lr * (grad + wd * p + m * m_wd))

    Such a group must have momentum 0 and weight_decay 0 for torch's part of the step: the decay
    term (with its momentum, state `decay_buffer`) is added to `p.grad` first and torch's step
    (fused kernel included) then applies p -= lr * grad. Groups without the option are torch's SGD.

    One pass (CPU fp32 with the compiled kernels, `kernels.cpu.sgd_step`): in every group whose
    update the kernel spells (no dampening, not maximizing; DGC's groups and torch's SGD with
    momentum, Nesterov and weight decay) a parameter of a `dgc` group, or one with a sparse .grad (a
    coalesced COO tensor: the averaged sparse payload, decoded nowhere else), is stepped in one pass
    over it and its buffer, with the same bytes as the code below and torch's step, its twin
    (which COMPBENCH_KERNELS=0 selects). A dense .grad in torch's own groups stays with torch's
    step (its fused kernel is one pass already). Without weight decay and momentum a sparse .grad
    touches only the entries it carries.
    """

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            dgc = group.get("dgc")
            assert not dgc or (group["momentum"] == 0 and group["weight_decay"] == 0), \
                "a dgc group carries its momentum and weight decay in `dgc`"

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:  # the gradients the decay term is added to come from the closure
            with torch.enable_grad():
                loss = closure()
        consumed: list[tuple[Tensor, Tensor]] = []  # stepped in one pass: hidden from torch's step
        for group in self.param_groups:
            dgc = group.get("dgc")
            one_pass = self._one_pass(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                # A dense .grad of torch's own rule is left to torch's step (its fused kernel is one
                # pass already); DGC's groups and sparse .grads are stepped here.
                kernels = one_pass_kernels(p) if one_pass else None
                dense_dgc = dgc and one_pass_kernels(p.grad) is kernels
                if kernels is not None and (p.grad.is_sparse or dense_dgc):
                    self._step_in_one_pass(p, group, kernels)
                    consumed.append((p, p.grad))
                    p.grad = None
                    continue
                if p.grad.is_sparse:  # the twin of the one-pass step: the dense decode it replaces
                    p.grad = p.grad.to_dense()
                if not dgc or not dgc["weight_decay"]:
                    continue
                wd, m = float(dgc["weight_decay"]), float(dgc["momentum"])
                decay = p.mul(wd)
                if m:
                    state = self.state[p]
                    buf = state.get("decay_buffer")
                    if buf is None:
                        buf = state["decay_buffer"] = decay.clone()
                    else:
                        buf.mul_(m).add_(decay)
                    decay = decay.add(buf, alpha=m) if dgc["nesterov"] else buf
                # In place: the averaged gradient is the optimizer's input, read by nothing after the step.
                p.grad.add_(decay)
        super().step()
        for p, grad in consumed:
            p.grad = grad  # the averaged gradient stays readable after the step, as with torch's
        return loss

    @staticmethod
    def _one_pass(group: dict[str, Any]) -> bool:
        """Whether the group's update is the compiled one-pass step's (`kernels.cpu.sgd_step`): plain
        float settings, no dampening, not maximizing (else torch's step, with the twin's decay term)."""
        return (not group.get("maximize") and not group.get("dampening") and not group.get("differentiable")
                and isinstance(group["lr"], float | int))

    def _step_in_one_pass(self, p: Tensor, group: dict[str, Any], kernels: ModuleType) -> None:
        """The decode (a sparse .grad: the averaged sparse payload) and the step in one pass over p and
        its buffer; the same bytes as the dense decode, the decay term and torch's step."""
        dgc = group.get("dgc")
        wd = float(dgc["weight_decay"] if dgc else group["weight_decay"])
        m = float(dgc["momentum"] if dgc else group["momentum"])
        nesterov = bool(dgc["nesterov"] if dgc else group["nesterov"])
        state = self.state[p]
        key = "decay_buffer" if dgc else "momentum_buffer"  # the names of the twin's (and torch's) state
        buf = state.get(key)
        first = buf is None
        if m and (wd or not dgc) and first:
            buf = state[key] = torch.empty_like(p, memory_format=torch.contiguous_format)
        grad = p.grad
        assert grad is not None
        if grad.is_sparse:
            indices, values = _flat_entries(p, grad)
            dense = _EMPTY
        else:
            dense, indices, values = grad, _EMPTY_LONG, _EMPTY
        tail = _fma_tail(kernels, p) if group.get("fused") and not dgc else 0
        kernels.sgd_step(p, _EMPTY if buf is None else buf, dense, indices, values, float(group["lr"]), wd, m,
                         nesterov, first, dgc is not None, tail)

    sparse_params = _sparse_params


class _OnePassAdam(torch.optim.Optimizer):
    """The one-pass step of `Adam` and `AdamW` (their docstrings).

    The kernels take the step count as a number (their bias corrections are computed on the host, in
    double, as the twin's), while the state keeps torch's float32 step tensor on p's device (torch's
    fused step shares it; checkpoints hold it as before). Reading that tensor per parameter and step
    would be a host wait on a GPU: the host keeps its own count of each parameter's steps
    (`_host_steps`), read from the tensor once (a parameter's first one-pass step after the
    optimizer was built or loaded) and advanced with every step torch's or this one takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host_steps: dict[Tensor, float] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._host_steps = {}  # a copy's counts are read from its state again

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._host_steps.clear()  # the loaded step tensors are the counts now

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        consumed: list[tuple[Tensor, Tensor]] = []  # stepped in one pass: hidden from torch's step
        for group in self.param_groups:
            one_pass = self._one_pass(group)
            for p in group["params"]:
                if p.grad is None or not p.grad.is_sparse:
                    continue  # a dense .grad is torch's (its fused kernel is one pass already)
                kernels = one_pass_kernels(p) if one_pass else None
                if kernels is not None:
                    self._step_in_one_pass(p, group, kernels)
                    consumed.append((p, p.grad))
                    p.grad = None
                else:  # the twin of the one-pass step: the dense decode it replaces
                    p.grad = p.grad.to_dense()
        super().step()
        for group in self.param_groups:  # torch's step advanced the step tensors of these
            for p in group["params"]:
                if p.grad is not None and p in self._host_steps:
                    self._host_steps[p] = _plus_one(self._host_steps[p])
        for p, grad in consumed:
            p.grad = grad  # the averaged gradient stays readable after the step, as with torch's
        return loss

    @staticmethod
    def _one_pass(group: dict[str, Any]) -> bool:
        """Whether the group's update is the compiled one-pass step's (`kernels.cpu.adam_step`):
        torch's fused CPU kernel (`fused: true`), amsgrad off, not maximizing, plain float settings
        (else the dense decode and torch's step)."""
        return (bool(group.get("fused")) and not group["amsgrad"] and not group["maximize"]
                and not group["capturable"] and not group["differentiable"]
                and all(isinstance(v, float | int) for v in (group["lr"], *group["betas"])))

    def _step_in_one_pass(self, p: Tensor, group: dict[str, Any], kernels: ModuleType) -> None:
        """The decode (a sparse .grad: the averaged sparse payload) and the step in one pass over p and
        its moments; the same bytes as the dense decode and torch's fused step (its state, too)."""
        state = self.state[p]
        if not state:  # torch's fused initialization: a float32 step count on p's device, zero moments
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self._host_steps[p] = 0.0
        if p not in self._host_steps:  # once after a load: the one read of this tensor's count
            self._host_steps[p] = float(state["step"])
        step = self._host_steps[p] = _plus_one(self._host_steps[p])
        state["step"].add_(1)
        assert p.grad is not None
        indices, values = _flat_entries(p, p.grad)
        beta1, beta2 = group["betas"]
        kernels.adam_step(p, state["exp_avg"], state["exp_avg_sq"], _EMPTY, indices, values,
                          float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                          float(group["weight_decay"]), step,
                          bool(group.get("decoupled_weight_decay")), _fma_tail(kernels, p))

    sparse_params = _sparse_params


class Adam(_OnePassAdam, torch.optim.Adam):
    """torch's Adam; with `fused: true` (compbench's optim=adam), amsgrad off and not maximizing, a
    parameter with a sparse .grad (a coalesced COO tensor: the averaged sparse payload, decoded
    nowhere else) is stepped in one pass over it and its two moments (CPU fp32 with the compiled
    kernels, `kernels.cpu.adam_step`), with the same bytes and state as the dense decode and torch's
    fused step, its twin (which COMPBENCH_KERNELS=0 selects). A dense .grad stays with torch's fused
    step (one pass already); other groups get the dense decode and torch's step."""


class AdamW(_OnePassAdam, torch.optim.AdamW):
    """torch's AdamW (decoupled weight decay), stepped in one pass from a sparse .grad as `Adam` is."""


# The optimizers that step from a sparse .grad in one pass (`sparse_params`).
ONE_PASS = (SGD, Adam, AdamW)


_EMPTY = torch.empty(0)
_EMPTY_LONG = torch.empty(0, dtype=torch.int64)


_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "muon": Muon}


def optimizer_class(name: Any) -> type[torch.optim.Optimizer]:
    """`optim.name`'s class: sgd, adam, adamw or muon, or "package.module.Class" (a torch.optim.Optimizer
    of a user's package, taking the optim group's other keys as keyword arguments); ValueError (one
    line, naming the key) for anything else."""
    if name in _OPTIMIZERS:
        return _OPTIMIZERS[name]
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"optim.name={show(name)} is unknown; use sgd, adam, adamw or package.module.Class "
                         "(a torch.optim.Optimizer of your own)")
    from compbench.catalog import registry

    cls = registry.locate(name)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"optim.name={name} is not a torch.optim.Optimizer class; name one, or use sgd, "
                         "adam or adamw")
    return cls


def param_groups(model: nn.Module, memory_owns_momentum: bool,
                 compressed: Callable[[Tensor], bool], optim: dict[str, Any]) -> list[dict[str, Any]]:
    """The trainer's parameter groups. With a memory that applies momentum itself (memory=dgc: momentum
    correction before compression) the tensors it sees (`compressed`) get DGC's SGD: no momentum on the
    gradient, momentum on the weight-decay term (see `SGD`); the others keep the optimizer's ordinary
    update. Summed over both, momentum is linear: this equals DGC's reference, whose memory also applies
    the momentum of dense tensors. The rule is per tensor: with scheduler=mergecomp and
    compress_threshold > 0 a small tensor fused into a compressed group is an approximation."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not memory_owns_momentum:
        return model_groups(model, [{"params": params}], optim)
    if optim["name"] != "sgd":
        raise ValueError(f"memory=dgc applies momentum itself, with DGC's SGD; optim={optim['name']} would "
                         f"apply its own on top: use optim=sgd (or memory=residual)")
    dgc = {"weight_decay": float(optim.get("weight_decay", 0.0)),
           "momentum": float(optim.get("momentum", 0.0)), "nesterov": bool(optim.get("nesterov", False))}
    return [{"params": [p for p in params if not compressed(p)]},
            {"params": [p for p in params if compressed(p)], "momentum": 0.0, "nesterov": False,
             "weight_decay": 0.0, "dgc": dgc}]


def model_groups(model: nn.Module, groups: list[dict[str, Any]],
                 optim: dict[str, Any]) -> list[dict[str, Any]]:
    """`groups` as the optimizer takes them for `model`: optim=muon's split into the hidden weight
    matrices (Muon) and the rest (AdamW), `optim.muon.matrices`; the groups unchanged otherwise."""
    if optim.get("name") != "muon":
        return groups
    picked = matrices(model)
    return tag_groups(groups, lambda p: p in picked)


def build_optimizer(param_groups: list[dict[str, Any]], name: str, **kwargs: Any) -> torch.optim.Optimizer:
    for key in (*SCHEDULE_KEYS, CLIP_KEY):  # the trainer's, not the optimizer class's
        kwargs.pop(key, None)
    if kwargs.get("lr", 1) <= 0:
        raise ValueError(f"optim={name}: lr={kwargs['lr']} must be > 0")
    return optimizer_class(name)(param_groups, **kwargs)


def optimizer_over(model: nn.Module, params: Sequence[Tensor],
                   optim: dict[str, Any]) -> torch.optim.Optimizer:
    """The `optim` group's optimizer over `params` of `model` in one group, with optim=muon's split
    taken from the model (`model_groups`): every mode that builds its own optimizer goes through here,
    so that none hands Muon the embeddings or the output layer."""
    return build_optimizer(model_groups(model, [{"params": list(params)}], optim), **optim)


def plain_optimizer(model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
    """The `optim` group's optimizer over every trainable parameter, in one group."""
    return optimizer_over(model, [p for p in model.parameters() if p.requires_grad], optim)
