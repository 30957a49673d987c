"""A foreign device on this CPU: tensors of the placement's device (`PLACED`, reported as `meta`) are
wrappers around plain CPU tensors, so that the training path runs as it would on a GPU and fails where
a GPU would fail, or would wait.

`Placed` is the wrapper subclass; `ForeignDevice` is the dispatch mode that runs every op on the
wrapped tensors and:

- fails on an op that mixes a placed tensor with a non-scalar host tensor (CUDA lets 0-dim CPU tensors
  mix, nothing else), or a draw whose generator is not on the device it draws for: what a hard-coded
  CPU tensor (`device="cpu"`, `.cpu()`, `torch.from_numpy`, a CPU generator) on the device path does
  on a GPU;
- fails on a host read of a placed tensor (`.item()`, `float()`, `bool()`, `.tolist()`, `.numpy()`, a
  copy to the host) inside the compress / comm / decompress phases, except at an allowlisted site;
- counts every host read of a placed tensor per training step (a GPU's host wait), inside a backward
  hook or elsewhere, with its call site in compbench's sources; ops whose output size the data decides
  (nonzero, a boolean mask's index, unique) count too (a GPU reads the count back), never fail.

Why `meta`: `cuda` cannot be reported on a CPU build (autograd aborts), and `cpu:0` is a CPU to the
code (`device.type == "cpu"`), which then takes its host branches (numpy, the C++ kernels) instead of
the device's. With `meta` the code takes the branch a GPU without CuPy takes (the torch twins); the
C++ CPU kernels, CuPy and CompLL's CUDA code are not exercised. Host tensors are plain `cpu`. A site is
`path:function` inside src/compbench (stable while lines move); messages say file:line. Dispatch modes
are thread-local: enter the mode in each rank's thread; `watched_stats()` (once, around the threads)
tells it the phases and steps and wraps what dispatch cannot judge."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import compbench
from compbench.records.stats import StepStats

PLACED = torch.device("meta")  # the placement's device, foreign to plain (host) CPU tensors
SRC = str(Path(compbench.__file__).parent) + "/"
_TORCH = str(Path(torch.__file__).parent) + "/"
_HERE = str(Path(__file__).resolve())
HOT = frozenset({"compress", "comm", "decompress"})  # the phases that must not wait for the device
aten = torch.ops.aten
# Ops whose output's size the data decides: a GPU reads a count back (a host wait) before returning.
_SYNCING = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
            aten.unique_consecutive.default, aten.unique_dim.default, aten.repeat_interleave.Tensor}

# Host-side tensors and reads the device path needs, site (path:function) -> why. Each one is a real
# necessity of its method, never a defect waiting for its fix.
ALLOW: dict[str, str] = {
    "compressors/atomo.py:atomo_probabilities": "ATOMO samples the short singular-value vector in float64 on "
    "the host (its docstring); the kept atoms' count sizes the payload, a read per tensor either way",
    "compressors/atomo.py:_atomo_encode": "the same draw: the singular values read once more for sigma/p",
    "engines/wire.py:parse_headers": "comm=hierarchical: every leader's payload header, in one host read per "
    "exchange (wire.unpack_all); the sizes cut the uneven payloads, so the host must know them",
}

_local = threading.local()  # the mode active in this thread (dispatch modes are thread-local)


class ForeignDeviceError(AssertionError):
    """An op the placement's device would refuse, or a host wait where none may be."""


class Placed(torch.Tensor):
    """A tensor on `PLACED`: a wrapper (no storage of its own) around the CPU tensor `inner`."""

    inner: Tensor

    @staticmethod
    def __new__(cls, inner: Tensor, requires_grad: bool | None = None) -> Placed:
        strided = inner.layout == torch.strided  # a sparse tensor has no strides
        layout = {"strides": inner.stride(), "storage_offset": inner.storage_offset()} if strided else {}
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, inner.shape, dtype=inner.dtype, device=PLACED, layout=inner.layout,
            requires_grad=inner.requires_grad if requires_grad is None else requires_grad, **layout)

    def __init__(self, inner: Tensor, requires_grad: bool | None = None) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # printing reads the values: not a wait of the training path
        return f"Placed({self.inner!r})"

    # .tolist() and .numpy() read a wrapper's storage without reaching dispatch: counted here, then
    # done on the wrapped tensor. Everything else reaches dispatch, where the mode sees it.
    def tolist(self) -> Any:  # type: ignore[override]
        _read("tolist")
        return self.inner.tolist()

    def numpy(self, *, force: bool = False) -> Any:  # type: ignore[override]
        _read("numpy")
        return self.inner.numpy(force=force)

    def untyped_storage(self) -> torch.UntypedStorage:  # the wrapped tensor's memory (aliasing tests)
        return self.inner.untyped_storage()

    def data_ptr(self) -> int:
        return self.inner.data_ptr()

    def new_tensor(self, data: Any, **kwargs: Any) -> Tensor:  # type: ignore[override]
        """Made on the host and moved below dispatch by torch: placed here."""
        return Placed(self.inner.new_tensor(data, **kwargs))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return NotImplemented  # only under ForeignDevice: a placed tensor outside it is an error


def _read(op: str) -> None:
    mode = getattr(_local, "mode", None)
    if mode is not None:
        mode.host_read(op)


class _TrackedGenerator(torch.Generator):
    """torch.Generator that remembers whether it was made for the placement's device (a CPU build
    makes every generator a `cpu` one)."""

    placed: bool

    def __new__(cls, device: Any = "cpu") -> _TrackedGenerator:
        placed = torch.device(device) == PLACED
        gen = super().__new__(cls, device="cpu" if placed else device)
        gen.placed = placed
        return gen


@dataclass
class Step:
    """One training step's host waits: site -> count, inside a backward hook or elsewhere."""

    in_hook: Counter = field(default_factory=Counter)
    elsewhere: Counter = field(default_factory=Counter)


def _site() -> tuple[str, str]:
    """(path:function, path:line) of the innermost frame in compbench's sources (else outside torch)."""
    frame: Any = sys._getframe(1)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(SRC):
            rel = path[len(SRC):]
            return f"{rel}:{frame.f_code.co_name}", f"src/compbench/{rel}:{frame.f_lineno}"
        if fallback is None and not path.startswith(_TORCH) and path != _HERE and "python3" not in path:
            fallback = (f"{Path(path).name}:{frame.f_code.co_name}", f"{path}:{frame.f_lineno}")
        frame = frame.f_back
    return fallback or ("?", "?")


def _draws_where_made(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` (a draw) failing where its generator is not on the device it draws for (dispatch gets a
    fresh Python object for a generator, without our mark: checked before)."""

    def draw(*args: Any, **kwargs: Any) -> Any:
        gen = kwargs.get("generator")
        mode = getattr(_local, "mode", None)
        if gen is not None and mode is not None:
            device = kwargs.get("device")
            on_device = (device is not None and torch.device(device) == PLACED) or any(
                isinstance(t, Placed) for t in (*args, *kwargs.values()))
            if bool(getattr(gen, "placed", False)) != on_device:
                site, line = _site()
                if site not in mode.allow:
                    where = ("a host generator for the placement's device" if on_device
                             else "a device generator on the host")
                    mode.fail(f"{func.__name__} draws with {where}", line, site)
        return func(*args, **kwargs)

    return draw


def _from_data(func: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.tensor(data, device=PLACED)` (and as_tensor) as a placed tensor: torch makes it on the host
    and moves it below dispatch, where the mode would see a real tensor of the device's type (no data)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is None or torch.device(device) != PLACED:
            return func(*args, **kwargs)
        out = func(*args, **{**kwargs, "device": "cpu"})
        return out if isinstance(out, Placed) else Placed(out)

    return make


_DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
          "randn_like", "randint_like")
_PLACED_DRAWS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_",
                 "log_normal_", "cauchy_", "bernoulli")


@contextmanager
def _python_level() -> Iterator[None]:
    """torch's Python functions that dispatch cannot judge, wrapped for the block (module attributes:
    compbench calls them as `torch.X`, in every thread and inside backward hooks, where a function
    mode would be off)."""
    saved = {name: getattr(torch, name) for name in (*_DRAWS, "tensor", "as_tensor")}
    for name in _DRAWS:
        setattr(torch, name, _draws_where_made(saved[name]))
    torch.tensor, torch.as_tensor = _from_data(saved["tensor"]), _from_data(saved["as_tensor"])
    for name in _PLACED_DRAWS:
        setattr(Placed, name, _draws_where_made(getattr(Tensor, name)))
    try:
        yield
    finally:
        for name, func in saved.items():
            setattr(torch, name, func)
        for name in _PLACED_DRAWS:
            delattr(Placed, name)


class ForeignDevice(TorchDispatchMode):
    """Runs ops on `Placed` tensors, fails on what the placement's device would refuse or wait for
    where it must not, and counts host waits per step (`steps`; `uploads`: host tensors copied to
    the device inside the hot phases, legal and counted for the record)."""

    def __init__(self, allow: dict[str, str] | None = None, strict: bool = True) -> None:
        super().__init__()
        self.allow = ALLOW if allow is None else allow
        self.strict = strict  # raise at the op (else only record in `errors`)
        self.phases: list[str] = []
        self.steps: list[Step] = []
        self.in_step = False
        self.errors: list[str] = []
        self.uploads: Counter = Counter()

    def __enter__(self) -> ForeignDevice:
        self._outer = getattr(_local, "mode", None)
        _local.mode = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _local.mode = self._outer
        super().__exit__(*exc)

    @property
    def phase(self) -> str | None:
        return self.phases[-1] if self.phases else None

    def fail(self, what: str, line: str, site: str) -> None:
        message = f"{what} at {line} (phase {self.phase or '-'}; allow as {site!r} only with a reason)"
        self.errors.append(message)
        if self.strict:
            raise ForeignDeviceError(message)

    def host_read(self, op: str, hot_ok: bool = False) -> None:
        """A placed tensor read by the host (a wait for the device): counted; failed in a hot phase
        (unless `hot_ok`: an op whose output size the data decides, which a GPU waits for too, inherent
        to selecting compressors)."""
        site, line = _site()
        if self.in_step and self.steps:
            step = self.steps[-1]
            (step.in_hook if torch._C._current_graph_task_id() != -1 else step.elsewhere)[f"{line} {op}"] += 1
        if self.phase in HOT and site not in self.allow and not hot_ok:
            self.fail(f"host read of a placed tensor ({op}) inside {self.phase}", line, site)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        placed: dict[int, Placed] = {}
        host: list[Tensor] = []

        def unwrap(t: Any) -> Any:
            if isinstance(t, Placed):
                placed[id(t.inner)] = t
                return t.inner
            if isinstance(t, Tensor):
                if t.device == PLACED:
                    raise ForeignDeviceError(f"{func}: a {PLACED} tensor made past the mode, at {_site()[1]}")
                host.append(t)
            return t

        a, k = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        device = k.get("device")
        to_placed = device is not None and torch.device(device) == PLACED
        to_host = device is not None and not to_placed
        if to_placed:
            k["device"] = torch.device("cpu")
        if func is aten._pin_memory.default:  # no pinned memory without CUDA: a plain copy stands in
            return a[0].clone()
        self.check(func, placed, host, to_placed, to_host, a)
        out = func(*a, **k)
        if not (placed or to_placed) or (to_host and func is aten._to_copy.default):
            return out
        if func is aten.copy_.default and id(a[0]) not in placed:
            return out  # a copy to the host
        return tree_map(lambda t: self.wrap(t, placed), out)

    @staticmethod
    def wrap(t: Any, placed: dict[int, Placed]) -> Any:
        if not isinstance(t, Tensor) or isinstance(t, Placed):
            return t
        same = placed.get(id(t))  # in-place and out= ops return their argument
        return Placed(t) if same is None else same

    def check(self, func: Any, placed: dict, host: list[Tensor], to_placed: bool, to_host: bool,
              args: tuple) -> None:
        if func is aten._local_scalar_dense.default and placed:
            return self.host_read("item")
        if placed and (func in _SYNCING or (func is aten.index.Tensor and any(
                i is not None and i.dtype == torch.bool for i in args[1]))):
            name = "index by mask" if func is aten.index.Tensor else func._schema.name.partition("::")[2]
            self.host_read(name, hot_ok=True)
        if placed and ((func is aten._to_copy.default and to_host)
                       or (func is aten.copy_.default and id(args[0]) not in placed)):
            return self.host_read("copy to host")
        if func is aten.copy_.default or (func is aten._to_copy.default and to_placed):
            # into a placed tensor from a host one (a host tensor's own writes are no upload)
            upload = (id(args[0]) in placed and id(args[1]) not in placed if func is aten.copy_.default
                      else not placed)
            if upload and self.phase in HOT:
                self.uploads[_site()[1]] += 1  # host -> device: legal, and counted
            return None
        big = [t for t in host if t.dim() > 0]
        on_device = bool(placed) or to_placed
        site, line = _site()
        if site in self.allow:
            return None
        if on_device and big:
            shapes = ", ".join(str(tuple(t.shape)) for t in big[:3])
            self.fail(f"{func} mixes placed tensors with host tensors of shape {shapes}", line, site)
        return None

    # -- steps and phases, from compbench's StepStats (records/stats.py) ---------------------------

    def begin_step(self) -> None:
        self.steps.append(Step())
        self.in_step = True

    def end_step(self) -> None:
        self.in_step = False


def _kernel(op: Any) -> Callable[..., Any]:
    """compbench's C++ CPU kernel `op` on the wrapped tensors. Its C++ function is registered for every
    dispatch key, so it would get the wrappers themselves (no data); and it runs only where the data
    is on the CPU (a GPU takes CuPy's or a twin), so host arguments (an empty `samples`) are no mix."""

    def call(*args: Any, **kwargs: Any) -> Any:
        placed: dict[int, Placed] = {}

        def unwrap(t: Any) -> Any:
            if isinstance(t, Placed):
                placed[id(t.inner)] = t
                return t.inner
            return t

        out = op(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        return tree_map(lambda t: ForeignDevice.wrap(t, placed), out) if placed else out

    return call


@contextmanager
def _kernels_unwrapped() -> Iterator[None]:
    from compbench.kernels import cpu

    if cpu._load() is not None:  # not built: the twins run, through dispatch
        yield
        return
    space = torch.ops.compbench_cpu
    names = [n.partition("::")[2] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("compbench_cpu::")]
    ops = {n: getattr(space, n) for n in names}
    for n, op in ops.items():
        setattr(space, n, _kernel(op))
    try:
        yield
    finally:
        for n, op in ops.items():
            setattr(space, n, op)


@contextmanager
def watched_stats() -> Iterator[None]:
    """StepStats tells the mode of the thread that books a phase or a step (patched for the block;
    `begin`/`end` are what `time` and the autograd callbacks' spans go through)."""
    saved = (StepStats.begin, StepStats.end, StepStats.begin_step, StepStats.end_step)
    begin, end, begin_step, end_step = saved

    def mode() -> ForeignDevice | None:
        return getattr(_local, "mode", None)

    def b(self: StepStats, phase: str, exposed: bool = False) -> None:
        if (m := mode()) is not None:
            m.phases.append(phase)
        begin(self, phase, exposed)

    def e(self: StepStats, phase: str) -> None:
        end(self, phase)
        if (m := mode()) is not None and m.phases:
            m.phases.pop()

    def bs(self: StepStats) -> None:
        if (m := mode()) is not None:
            m.begin_step()
        begin_step(self)

    def es(self: StepStats) -> None:
        end_step(self)
        if (m := mode()) is not None:
            m.end_step()

    StepStats.begin, StepStats.end, StepStats.begin_step, StepStats.end_step = b, e, bs, es  # type: ignore
    autocast = torch.autocast
    # the placement's device has no autocast of its own: its data's (the CPU's) stands in
    torch.autocast = lambda kind, *a, **k: autocast("cpu" if kind == PLACED.type else kind, *a, **k)  # type: ignore
    # torch's fused optimizer steps run on the wrapped CPU tensors: the device check lets them through
    import torch.optim.optimizer as optimizer

    fused_devices = optimizer._get_fused_kernels_supported_devices
    optimizer._get_fused_kernels_supported_devices = lambda: [*fused_devices(), PLACED.type]  # type: ignore
    generator = torch.Generator
    torch.Generator = _TrackedGenerator  # type: ignore[misc]
    swap = torch.__future__.get_swap_module_params_on_conversion()
    # module.to(PLACED) swaps each parameter for its placed copy (assigning `.data` a wrapper does not
    # hold: the parameter crashes on use)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with _kernels_unwrapped(), _python_level():
            yield
    finally:
        StepStats.begin, StepStats.end, StepStats.begin_step, StepStats.end_step = saved  # type: ignore
        torch.Generator = generator  # type: ignore[misc]
        torch.autocast = autocast  # type: ignore[misc]
        optimizer._get_fused_kernels_supported_devices = fused_devices  # type: ignore
        torch.__future__.set_swap_module_params_on_conversion(swap)
