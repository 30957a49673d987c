"""What the registry declares is checked, over every option of every group (a new option is tested
without new test code): each `_target_` resolves and takes the option's keys; each class satisfies the
Protocol of its seam and declares its traits as the traits type; each compressor capability flag has
the method it promises and tells the truth on data (and a memory's `feeds_back`); config defaults agree
with constructor defaults.

Unbiasedness, and `decodes_into` on two payloads, are checked by test_compressor_contract.py (not here).
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from functools import cache
from typing import Any, Protocol

import pytest
import torch
from omegaconf import OmegaConf

from compbench.catalog import registry
from compbench.codec.base import Capabilities, Compressor
from compbench.comm.base import CommTraits, Communicator, PackingCommunicator
from compbench.comm.ps import split_bounds
from compbench.compressors import SELECTION_KEYS, build_compressor
from compbench.engines.base import Engine
from compbench.memory.base import Memory, MemoryTraits
from compbench.records.stats import StepStats
from compbench.schedulers import Scheduler, SchedulerTraits
from compbench.sync import Synchronizer, SyncTraits
from compbench.sync.build import build_synchronizer
from tests.threaded_engine import ThreadEngine, ThreadWorld

# Groups whose options name a `_target_`, and the keys the builder removes before calling it.
DROPPED = {"compressor": SELECTION_KEYS, "memory": (), "comm": (), "scheduler": (), "sync": (),
           "engine": ("np",), "model": (), "dataset": ()}
OPTIONS = [(g, n) for g in DROPPED for n in registry.options(g)]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{g}={n}" for g, n in cases]


def _names(group: str) -> list[str]:
    return registry.options(group)


# -- Protocols, structurally ------------------------------------------------------------------

def _protocol_members(proto: type) -> tuple[set[str], dict[str, list[str]]]:
    """(data attributes, {method: parameter names after self}) that `proto` declares."""
    data: set[str] = set()
    methods: dict[str, list[str]] = {}
    for klass in proto.__mro__:
        if klass in (object, Protocol) or not issubclass(klass, Protocol) and klass is not proto:
            continue
        data |= set(klass.__dict__.get("__annotations__", {}))
        for name, value in klass.__dict__.items():
            if name.startswith("_"):
                continue
            if isinstance(value, staticmethod | classmethod) or inspect.isfunction(value):
                func = value.__func__ if isinstance(value, staticmethod | classmethod) else value
                # `**options` in a Protocol: the class may name its options (with defaults).
                params = [p.name for p in inspect.signature(func).parameters.values()
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
                methods[name] = params if isinstance(value, staticmethod) else params[1:]
    return data - set(methods), methods


def _self_attributes(cls: type) -> set[str]:
    """Names assigned as `self.NAME` (or `self.NAME: T`) in the methods of `cls` and its bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # a class of C code (torch's), or one built at run time
            continue
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                            and leaf.value.id == "self"):
                        names.add(leaf.attr)
    return names


def protocol_gaps(cls: type, proto: type) -> list[str]:
    """What `cls` lacks of `proto`: a data attribute it neither declares nor assigns, a method it
    lacks, or a method whose parameters do not start with the Protocol's names (in order; any extra
    ones must have defaults). Empty: the class satisfies the Protocol structurally."""
    data, methods = _protocol_members(proto)
    gaps: list[str] = []
    declared = {n for k in cls.__mro__ for n in (*k.__dict__, *k.__dict__.get("__annotations__", {}))}
    assigned = _self_attributes(cls)
    gaps += [f"attribute {n}" for n in sorted(data) if n not in declared and n not in assigned]
    for name, wanted in methods.items():
        method = getattr(cls, name, None)
        if not callable(method):
            gaps.append(f"method {name}")
            continue
        static = isinstance(inspect.getattr_static(cls, name), staticmethod)
        params = list(inspect.signature(method).parameters.values())[0 if static else 1:]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            continue  # takes anything (a wrapper passing *args, **kwargs through)
        names = [p.name for p in params]
        extra = params[len(wanted):]
        if names[:len(wanted)] != wanted or any(p.default is p.empty for p in extra):
            gaps.append(f"{name}({', '.join(names)}) is not {name}({', '.join(wanted)})")
    return gaps


class _Ping(Protocol):
    label: str

    def ping(self, x: int, y: int) -> int: ...


def test_protocol_gaps_finds_what_is_missing():
    class Good:
        def __init__(self) -> None:
            self.label = "g"

        def ping(self, x: int, y: int, z: int = 0) -> int:
            return x

    class Bad:
        def ping(self, y: int, x: int) -> int:
            return x

    assert protocol_gaps(Good, _Ping) == []
    assert protocol_gaps(Bad, _Ping) == ["attribute label", "ping(y, x) is not ping(x, y)"]
    assert protocol_gaps(object, _Ping) == ["attribute label", "method ping"]


# -- every option: its target resolves and takes its keys ------------------------------------

@pytest.mark.parametrize("group, name", OPTIONS, ids=_ids(OPTIONS))
def test_target_resolves_and_takes_every_key(group, name):
    cfg = registry.option_config(group, name)
    assert isinstance(cfg.get("_target_"), str), f"conf/{group}/{name}.yaml has no _target_"
    assert callable(registry.locate(cfg["_target_"]))
    passed = {"comm": ("engine", "compressor", "stats"), "memory": ("world_size",),
              "sync": ("pipeline", "scheduler", "engine", "stats")}.get(group, ())
    registry.check_settings(cfg, f"{group}={name}", drop=DROPPED[group], passed=passed, declared=tuple(cfg))


# -- built instances of the light components ---------------------------------------------------

def _engine() -> ThreadEngine:
    return ThreadEngine(ThreadWorld(1), 0, "torch")


def _resolved(group: str, name: str) -> dict[str, Any]:
    """The option's node with its interpolations resolved against a default net and dataset."""
    root = OmegaConf.create({group: registry.option_config(group, name),
                             "net": registry.option_config("net", "eth10g"),
                             "dataset": registry.option_config("dataset", "synthetic")})
    return OmegaConf.to_container(root, resolve=True)[group]  # type: ignore[index]


def _build(group: str, name: str) -> Any:
    if group == "compressor":
        return build_compressor(name)
    if group == "memory":
        cls = registry.component_class(group, name)
        extra = {"world_size": 2} if "world_size" in inspect.signature(cls).parameters else {}
        return registry.build(_resolved(group, name), **extra)
    if group == "comm":
        return registry.build(_resolved(group, name), engine=_engine(), compressor=build_compressor("none"),
                              stats=StepStats())
    if group == "scheduler":
        return registry.build(_resolved(group, name))
    if group == "sync":
        nodes = {"compressor": registry.option_config("compressor", "none"),
                 "memory": registry.option_config("memory", "none"),
                 "comm": registry.option_config("comm", "allgather"),
                 "scheduler": registry.option_config("scheduler", "layerwise"),
                 "sync": _resolved(group, name)}
        return build_synchronizer(nodes, _engine(), StepStats())
    raise AssertionError(group)


# group -> (Protocol, traits attribute, traits type)
SEAMS: dict[str, tuple[type, str, type]] = {
    "compressor": (Compressor, "caps", Capabilities),
    "memory": (Memory, "traits", MemoryTraits),
    "comm": (Communicator, "traits", CommTraits),
    "scheduler": (Scheduler, "traits", SchedulerTraits),
    "sync": (Synchronizer, "sync_traits", SyncTraits),
}
BUILT = [(g, n) for g in SEAMS for n in _names(g)]


@pytest.mark.parametrize("group, name", BUILT, ids=_ids(BUILT))
def test_component_satisfies_its_protocol_and_declares_its_traits(group, name):
    proto, attr, traits_type = SEAMS[group]
    cls = registry.component_class(group, name)
    assert protocol_gaps(cls, proto) == [], f"{group}={name} ({cls.__qualname__}) vs {proto.__name__}"
    built = _build(group, name)
    assert isinstance(built, proto)
    assert isinstance(getattr(built, attr), traits_type)
    assert isinstance(getattr(cls, attr), traits_type), f"{cls.__qualname__}.{attr}: declared on the class"


@pytest.mark.parametrize("name", _names("comm"))
def test_a_comm_is_a_communicator_never_a_synchronizer(name):
    # The baselines that synchronize by themselves (DDP, Horovod's optimizer) are sync= modes.
    cls = registry.component_class("comm", name)
    assert protocol_gaps(cls, Communicator) == [] and not hasattr(cls, "sync_traits")
    if cls.traits.packs:  # the flag promises reduce_many
        assert protocol_gaps(cls, PackingCommunicator) == []


@pytest.mark.parametrize("name", _names("engine"))
def test_engine_satisfies_the_engine_protocol(name):
    # Building a real engine starts a process group; the class is checked structurally, and the
    # threaded test engine (which shares EngineBase) as an instance.
    assert protocol_gaps(registry.component_class("engine", name), Engine) == []
    assert isinstance(_engine(), Engine)


# -- capability flags: the promised methods, and the truth on data -----------------------------

COMPRESSORS = _names("compressor")


@cache
def _caps(name: str) -> Capabilities:
    return build_compressor(name).caps


def _data(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# flag -> (methods it promises, with their parameter names)
PROMISES: dict[str, dict[str, list[str]]] = {
    "sparse": {"sent_indices": ["payload", "ctx"], "sparse_entries": ["payload", "ctx"]},
    "shared_indices": {"indices": ["numel", "name", "device"]},
    "collective": {"compress_collective": ["x", "name", "allreduce_mean"]},
    "decodes_into": {"decompress_all": ["payloads", "ctx", "out"]},
    "fuses_memory": {"compress_deferred": ["deferred", "name"]},
    "sparse_average": {"decompress_all_sparse": ["payloads", "ctx"]},
    "random_sample": {"sampled_reads": ["numel"]},
    "split_unit": {"split": ["payload", "ctx", "bounds", "names"]},
}


@pytest.mark.parametrize("name", COMPRESSORS)
def test_capability_flags_have_the_methods_they_promise(name):
    comp = build_compressor(name)
    caps = comp.caps
    promised = {m: p for flag, ms in PROMISES.items() if getattr(caps, flag) for m, p in ms.items()}
    if caps.combine == "vote":  # a parameter server sends the vote's sign
        promised["server_compress"] = ["vote", "name"]
    for method, params in promised.items():
        assert callable(getattr(comp, method, None)), f"{name} declares a flag that needs {method}"
        assert list(inspect.signature(getattr(comp, method)).parameters)[:len(params)] == params, method
    assert caps.combine in ("mean", "vote", "sender_mean")
    assert caps.owns <= {"error_feedback", "momentum"}
    if caps.identity:
        assert caps.lossless and caps.summable
    if caps.shared_indices:
        assert caps.sparse
    assert set(caps.recipe) <= {"memory", "optim.lr", "optim.momentum", "optim.warmup_epochs"}


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).shape_layout])
def test_shape_layout_is_the_same_for_any_data(name):
    """`shape_layout`: the payload's tensors, dtypes and shapes follow from the shape alone."""
    comp = build_compressor(name)
    comp.begin_step(20, 0.5)  # past any warm-up (PowerSGD's start_iter)
    for shape in ((40, 25), (64, 96), (100,)):
        a = comp.compress(_data(shape, 1), "a")[0]
        b = comp.compress(_data(shape, 2) * 1e3, "b")[0]
        assert [(t.shape, t.dtype) for t in a] == [(t.shape, t.dtype) for t in b], shape


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).split_unit])
def test_split_payloads_decode_to_the_whole(name):
    """`split_unit`: the parts of a payload (comm=ps's shards) decode to the whole one's pieces."""
    comp = build_compressor(name)
    x = _data((37, 11), 5)  # 407 elements: the last part is short
    payload, ctx = comp.compress(x, "t")
    bounds = split_bounds(x.numel(), 3, comp.caps.split_unit)
    parts = comp.split(payload, ctx, bounds, ["t#0", "t#1", "t#2"])
    assert [c.numel for _, c in parts] == [b - a for a, b in bounds] and bounds[-1][1] == x.numel()
    decoded = torch.cat([comp.decompress(p, c).reshape(-1) for p, c in parts])
    assert torch.equal(decoded, comp.decompress(payload, ctx).reshape(-1))


def _encode_two_ranks(name: str, shape: tuple[int, ...] = (40, 25)):
    comp = build_compressor(name)
    comp.begin_step(3, 0.5)
    a, b = _data(shape, 11), _data(shape, 12)
    pa, ctx = comp.compress(a.clone(), "t")
    pb, _ = comp.compress(b.clone(), "t")
    return comp, a, b, pa, pb, ctx


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).summable])
def test_summable_payloads_sum_then_decode_to_the_mean_of_decodes(name):
    comp, _, _, pa, pb, ctx = _encode_two_ranks(name)
    assert [(t.shape, t.dtype) for t in pa] == [(t.shape, t.dtype) for t in pb], "same layout on every rank"
    mean_of_decodes = (comp.decompress(pa, ctx).double() + comp.decompress(pb, ctx).double()) / 2
    # What comm=allreduce does: average the payload tensors element-wise, decode once.
    averaged = [(ta.double() + tb.double()).div(2).to(ta.dtype) for ta, tb in zip(pa, pb, strict=True)]
    tol = 1e-3 if any(t.dtype in (torch.float16, torch.bfloat16) for t in pa) else 1e-6
    torch.testing.assert_close(comp.decompress(averaged, ctx).double(), mean_of_decodes, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if not (_caps(n).summable or _caps(n).collective)])
def test_what_is_not_summable_says_why(name):
    assert _caps(name).why_not_summable


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).lossless])
@pytest.mark.parametrize("shape", [(1,), (7,), (64, 33)], ids=str)
def test_lossless_decodes_to_its_input(name, shape):
    comp = build_compressor(name)
    comp.begin_step(0, 0.0)
    x = _data(shape, 5)
    payload, ctx = comp.compress(x.clone(), "t")
    torch.testing.assert_close(comp.decompress(payload, ctx), x, rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if not _caps(n).lossless])
def test_what_is_not_lossless_loses_something(name):
    comp = build_compressor(name)
    comp.begin_step(1000, 100.0)  # past every warm-up (PowerSGD's start_iter, DGC's warm-up epochs)
    x = _data((64, 64), 6)
    payload, ctx = comp.compress(x.clone(), "t")
    assert not torch.equal(comp.decompress(payload, ctx), x), f"{name} is lossless: declare it"


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).identity])
def test_identity_sends_the_tensor_itself(name):
    comp = build_compressor(name)
    x = _data((8, 9), 7)
    payload, ctx = comp.compress(x, "t")
    assert len(payload) == 1
    torch.testing.assert_close(payload[0].view(x.shape), x, rtol=0, atol=0)
    assert payload[0].dtype == x.dtype and payload[0].numel() == x.numel()


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).sparse])
@pytest.mark.parametrize("shape", [(7,), (64, 33), (131073,)], ids=str)
def test_sparse_entries_scatter_to_the_decode(name, shape):
    comp = build_compressor(name)
    comp.begin_step(1000, 100.0)
    x = _data(shape, 8)
    payload, ctx = comp.compress(x.clone(), "t")
    indices, values = comp.sparse_entries(payload, ctx)
    scattered = torch.zeros(math.prod(shape)).index_add_(0, indices.long(), values.float())
    torch.testing.assert_close(scattered.view(shape), comp.decompress(payload, ctx))
    sent = comp.sent_indices(payload, ctx).long()
    assert set(sent.tolist()) == set(indices.long().tolist())
    # Every coordinate the decode sets was sent (DGC's momentum masking relies on it).
    assert set(comp.decompress(payload, ctx).reshape(-1).nonzero().view(-1).tolist()) <= set(sent.tolist())


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).sparse_average])
def test_a_sparse_average_is_the_decoded_average(name):
    comp, _, _, pa, pb, ctx = _encode_two_ranks(name)
    sparse = comp.decompress_all_sparse([pa, pb], ctx)
    assert sparse.is_sparse and sparse.is_coalesced()
    torch.testing.assert_close(sparse.to_dense().reshape(-1), comp.decompress_all([pa, pb], ctx).reshape(-1))


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).shared_indices])
def test_shared_indices_are_the_ones_drawn_again(name):
    comp, _, _, pa, pb, ctx = _encode_two_ranks(name)
    again = comp.indices(ctx.numel, "t", "cpu").long()
    assert torch.equal(comp.sent_indices(pa, ctx).long(), again)
    fresh = build_compressor(name)  # another rank: the same seed and step give the same indices
    fresh.begin_step(3, 0.5)
    assert torch.equal(fresh.indices(ctx.numel, "t", "cpu").long(), again)


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).collective])
def test_collective_on_one_rank_returns_the_shape_it_was_given(name):
    comp = build_compressor(name)
    comp.begin_step(1000, 100.0)
    x = _data((64, 33), 9)
    averaged, sent = comp.compress_collective(x.clone(), "t", lambda t: t)  # one rank: the mean is t
    assert averaged.shape == x.shape and sent > 0


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if _caps(n).decodes_into])
def test_decodes_into_a_buffer_of_one_payload_as_the_allocating_decode(name):
    # test_compressor_contract checks two payloads; one payload is the allgather of a single rank.
    comp, a, _, pa, _, ctx = _encode_two_ranks(name)
    out = torch.full((a.numel(),), float("nan"))
    got = comp.decompress_all([pa], ctx, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.view(a.shape), comp.decompress_all([pa], ctx))



@pytest.mark.parametrize("name", _names("memory"))
def test_memory_feeds_back_as_it_declares(name):
    # feeds_back: what topk dropped at step 1 changes what step 2 compensates (against a fresh memory);
    # otherwise the gradient passes through unchanged.
    mem, comp, g = _build("memory", name), build_compressor("topk"), _data((64, 33), 13)
    comp.begin_step(0, 0.0)
    x = mem.compensate(g.clone(), "w")
    first = x.clone()  # the memory's own buffer may become its residual in update
    payload, ctx = comp.compress(x, "w")
    mem.update(x, "w", comp, payload, ctx)
    again = mem.compensate(g.clone(), "w")
    if mem.traits.feeds_back:
        assert not torch.equal(again, _build("memory", name).compensate(g.clone(), "w"))
    else:
        assert torch.equal(first, g) and torch.equal(again, g)

# -- config defaults agree with constructor defaults -------------------------------------------

# (group, option, key) -> why the YAML deliberately sets another value than the constructor's
# default. The YAML line must carry a comment (checked below), or the value must name the option.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("dataset", "cifar100", "num_classes"): "one builder for cifar10 and cifar100: the option picks the set",
    ("dataset", "mnist", "name"): "one builder for the IDX data sets: the option picks the set",
    ("dataset", "fashion_mnist", "root"): "Debian's package folder; the builder has no default folder",
}


def _agree(yaml_value: Any, default: Any) -> bool:
    if isinstance(default, tuple | list) and isinstance(yaml_value, list):
        return list(default) == yaml_value
    if isinstance(default, bool) or isinstance(yaml_value, bool):
        return type(default) is type(yaml_value) and default == yaml_value
    if isinstance(default, int | float) and isinstance(yaml_value, int | float):
        return float(default) == float(yaml_value)
    return type(default) is type(yaml_value) and default == yaml_value


def _defaults(group: str, name: str) -> list[tuple[str, Any, Any]]:
    """(key, YAML value, constructor default) for every key that both set; interpolated values
    (`${dataset.num_classes}`) follow another group and are left out."""
    cfg = registry.option_config(group, name)
    params = inspect.signature(registry.locate(cfg["_target_"])).parameters
    out = []
    for key, value in cfg.items():
        param = params.get(key)
        if key == "_target_" or param is None or param.default is param.empty:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue
        out.append((key, value, param.default))
    return out


@pytest.mark.parametrize("group, name", OPTIONS, ids=_ids(OPTIONS))
def test_config_defaults_agree_with_constructor_defaults(group, name):
    wrong = [f"{key}: {value!r} in conf/{group}/{name}.yaml, {default!r} in the constructor"
             for key, value, default in _defaults(group, name)
             if not _agree(value, default) and (group, name, key) not in ALLOWED]
    assert not wrong, "one source: align the constructor's default to the YAML (or allow-list it): " + \
        "; ".join(wrong)


@pytest.mark.parametrize("group, name, key", list(ALLOWED), ids=[f"{g}={n}.{k}" for g, n, k in ALLOWED])
def test_allowed_disagreements_are_real_and_commented(group, name, key):
    found = {k: (v, d) for k, v, d in _defaults(group, name)}
    assert key in found and not _agree(*found[key]), "no longer disagrees: remove it from ALLOWED"
    lines = (registry.conf_dir() / group / f"{name}.yaml").read_text().splitlines()
    line = next(ln for ln in lines if ln.startswith(f"{key}:"))
    assert "#" in line, f"conf/{group}/{name}.yaml: say on the {key} line why it is not the default"


def test_agree_compares_values_not_spellings():
    assert _agree(2, 2.0) and _agree([1, 2], (1, 2)) and _agree(None, None) and _agree("a", "a")
    assert not _agree(True, 1) and not _agree(1, 2) and not _agree([256], None) and not _agree("1", 1)

