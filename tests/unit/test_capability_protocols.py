"""The flags that promise a method are derived from the class: over every registered option of every
group, each such flag is set exactly when the class implements its Protocol; a class that declares
one without the method is refused where it is defined (or, for a plugin class outside the bases,
where the registry reads it); a class that has the method gets the flag."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from torch import Tensor

from compbench.catalog import registry
from compbench.codec.base import (
    PROMISES,
    Capabilities,
    CompressorBase,
    Ctx,
    SparseEntries,
    SplitsPayload,
    derive,
    implements,
    make_ctx,
)
from compbench.comm.base import CommBase, CommTraits, ReducesMany, SparseResults
from compbench.compressors import build_compressor
from compbench.memory.base import MemoryTraits
from compbench.schedulers import SchedulerTraits
from compbench.sync import SyncTraits

GROUPS = ("compressor", "memory", "comm", "scheduler", "sync")
OPTIONS = [(g, n) for g in GROUPS for n in registry.options(g)]


def _promised(record: object, flag: str) -> bool:
    value = getattr(record, flag)
    return value == "vote" if isinstance(value, str) else bool(value)


@pytest.mark.parametrize("group, name", OPTIONS, ids=[f"{g}={n}" for g, n in OPTIONS])
def test_each_flag_that_promises_a_method_is_set_exactly_when_the_class_implements_it(group, name):
    cls = registry.component_class(group, name)
    record = registry.declared(group, name)
    on_class = getattr(cls, registry.DECLARATIONS[group])
    assert record == on_class, f"{group}={name}: the class's record is already the derived one"
    for flag, proto in PROMISES.get(type(record), {}).items():
        assert _promised(record, flag) == implements(cls, proto), f"{group}={name}: {flag}, {proto.__name__}"


@pytest.mark.parametrize("name", registry.options("compressor"))
def test_a_built_compressor_keeps_the_derived_flags(name):
    comp = build_compressor(name)
    cls = registry.component_class("compressor", name)
    for flag, proto in PROMISES[Capabilities].items():
        assert _promised(comp.caps, flag) == implements(cls, proto), f"{name}: {flag}"
        if _promised(comp.caps, flag):
            assert isinstance(comp, proto), f"{name}: {flag}"


def test_every_method_flag_has_a_protocol():
    # The records whose flags promise members, and the flags that do; the others promise none.
    assert set(PROMISES[Capabilities]) == {"sparse", "shared_indices", "collective", "decodes_into",
                                           "sparse_average", "fuses_memory", "random_sample",
                                           "split_unit", "combine"}
    assert PROMISES[CommTraits] == {"sparse_results": SparseResults, "packs": ReducesMany}
    for record in (MemoryTraits, SchedulerTraits, SyncTraits):
        assert record not in PROMISES
    for record, promises in PROMISES.items():
        assert set(promises) <= {f.name for f in fields(record)}


def test_a_compressor_that_declares_a_flag_without_its_method_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match=r"declares sparse=True but has no sent_indices\(payload, ctx\)"):
        class Liar(CompressorBase):  # noqa: F841 - defining it is the test
            caps = Capabilities(sparse=True)
    with pytest.raises(TypeError, match=r"declares split_unit=8 but has no split\(payload, ctx, bounds"):
        class Unsplit(CompressorBase):  # noqa: F841
            caps = Capabilities(split_unit=8)
    with pytest.raises(TypeError, match=r"declares combine='vote' but has no server_compress"):
        class NoServer(CompressorBase):  # noqa: F841
            caps = Capabilities(combine="vote")


def test_a_method_without_the_parameters_its_flag_promises_is_not_the_method():
    with pytest.raises(TypeError, match="declares decodes_into=True"):
        class NoOut(CompressorBase):  # noqa: F841 - decompress_all without `out`
            caps = Capabilities(decodes_into=True)


def test_a_compressor_that_has_the_method_gets_the_flag():
    class Entries(CompressorBase):
        def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
            return [x.reshape(-1)], make_ctx(x, name)

        def sent_indices(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
            return torch.arange(ctx.numel)

        def sparse_entries(self, payload: list[Tensor], ctx: Ctx) -> tuple[Tensor, Tensor]:
            return torch.arange(ctx.numel), payload[0]

    assert Entries.caps.sparse and isinstance(Entries(), SparseEntries)
    assert not Entries.caps.decodes_into and not Entries.caps.fuses_memory


def test_a_count_the_method_cannot_give_must_be_declared():
    with pytest.raises(TypeError, match="has split.* but declares split_unit=0"):
        class Splits(CompressorBase):  # noqa: F841
            def split(self, payload: list[Tensor], ctx: Ctx, bounds: list[tuple[int, int]],
                      names: list[str]) -> list[tuple[list[Tensor], Ctx]]:
                return []
    assert implements(type("S", (), {"split": lambda self, payload, ctx, bounds, names: []}), SplitsPayload)


def test_a_communicator_flag_is_derived_and_refused_the_same_way():
    with pytest.raises(TypeError, match=r"declares packs=True but has no reduce_many"):
        class NoMany(CommBase):  # noqa: F841
            traits = CommTraits(packs=True)

    class Sparse(CommBase):
        sparse_names: frozenset[str] = frozenset()

    assert Sparse.traits.sparse_results and not Sparse.traits.packs


def test_a_plugin_class_outside_the_bases_is_derived_and_refused_by_the_registry(monkeypatch):
    class Plugin:  # a compressor written without CompressorBase: the registry derives its record
        caps = Capabilities()

        def sampled_reads(self, numel: int) -> int:
            return 1

    class Liar:
        caps = Capabilities(fuses_memory=True)

    monkeypatch.setattr(registry, "component_class", lambda group, name: Plugin)
    assert registry.declared("compressor", "plugin").random_sample
    monkeypatch.setattr(registry, "component_class", lambda group, name: Liar)
    refused = r"compressor=liar: .*fuses_memory=True but has no compress_deferred\("
    with pytest.raises(ValueError, match=refused):
        registry.declared("compressor", "liar")


def test_derive_leaves_a_record_without_promises_alone():
    record = MemoryTraits(feeds_back=True)
    assert derive(record, object) is record
