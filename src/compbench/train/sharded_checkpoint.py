"""A sharded run's model and optimizer in a checkpoint (`sharding=fsdp|hsdp`, compbench.sync.sharded):
written by every worker through torch.distributed.checkpoint (DCP) into a folder beside checkpoint.pt,
read back by as many workers as wrote it or, under sharding=fsdp, by another number (DCP reads each
worker's part of every tensor from whichever workers' files hold it: resharding on load).

The folder holds the model's state dict (FSDP2's DTensors: each worker writes its shard) and the
optimizer's tensor state, keyed by parameter name: each state tensor shaped as the worker's shard
(Adam's moments, SGD's momentum) is saved as a DTensor of its parameter's mesh, placements, global
shape and stride (`DTensor.from_local`, an uneven last shard included). What a reader needs without
the tensors goes into checkpoint.pt (`record`): the folder's name, the layout, every state entry's
global shape, the optimizer's parameter groups (by name) and its scalar state (Adam's `step`).

checkpoint.py calls `save` and `load` where the run's synchronizer is a ShardedSync, and does the
rest (the atomic swap, the per-rank state, the refusals).
"""

from __future__ import annotations

import shutil
import warnings
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from compbench.sync.sharded import ShardedSync

SUFFIX = ".dcp"  # checkpoint.<tag>.dcp: one folder per checkpoint written (see checkpoint.py's swap)
TMP = ".tmp"  # a folder still being written
METADATA = ".metadata"  # DCP's index of the folder, written last by the coordinating worker
# A shard's saved state: the per-parameter optimizer state in the folder, as dtype names.
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float64, torch.float32, torch.float16,
                                                      torch.bfloat16, torch.int64, torch.int32, torch.uint8)}


def _params(sync: ShardedSync) -> dict[str, tuple[nn.Parameter, nn.Parameter]]:
    """name -> (FSDP's DTensor parameter, the shard view's local parameter)."""
    assert sync.view is not None, "setup first"
    return {name: (p, view) for name, p, view in sync.view.pairs}


def _group_names(optimizer: torch.optim.Optimizer, sync: ShardedSync) -> list[list[str]]:
    """The optimizer's parameter groups as the names of their view parameters."""
    assert sync.view is not None, "setup first"
    name_of = {id(view): name for name, _, view in sync.view.pairs}
    try:
        return [[name_of[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    except KeyError:
        raise ValueError("a sharded checkpoint saves an optimizer over the shard view's parameters; this "
                         "one holds another tensor") from None


def _as_dtensor(local: Tensor, p: nn.Parameter) -> DTensor:
    """`local` (this worker's part, shaped as its shard of `p`) as a DTensor laid out as `p`."""
    assert isinstance(p, DTensor)
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                              stride=p.stride())


def save(model: nn.Module, optimizer: torch.optim.Optimizer, sync: ShardedSync,
         folder: Path) -> dict[str, Any]:
    """Collective: write the model and the optimizer's tensor state into `folder` (DCP; every
    worker its part, the coordinating worker the metadata last: on return every worker's files and
    the metadata are written, fsynced). Returns the record for checkpoint.pt (`dcp` left to the
    caller, which names the folder it renames `folder` to)."""
    params = _params(sync)
    names = _group_names(optimizer, sync)
    scalars: dict[str, dict[str, Any]] = {}
    dtypes: dict[str, dict[str, str]] = {}
    tensors: dict[str, dict[str, DTensor]] = {}
    for name in chain(*names):
        p, view = params[name]
        for key, value in optimizer.state.get(view, {}).items():
            if isinstance(value, Tensor) and value.dim() > 0:
                if value.shape != view.shape:
                    raise ValueError(f"the optimizer's {key} of {name} is of shape {list(value.shape)}, not "
                                     f"its shard's {list(view.shape)}: a sharded checkpoint saves "
                                     "elementwise state")
                tensors.setdefault(name, {})[key] = _as_dtensor(value, p)
                dtypes.setdefault(name, {})[key] = str(value.dtype).removeprefix("torch.")
            else:  # Adam's step (the same on every worker): rank 0's goes into checkpoint.pt
                scalars.setdefault(name, {})[key] = value
    model_state = model.state_dict()
    dcp.save({"model": model_state, "optimizer": tensors}, checkpoint_id=folder)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": group}
              for g, group in zip(optimizer.param_groups, names, strict=True)]
    return {"layout": sync.record(), "shapes": {k: list(t.shape) for k, t in model_state.items()},
            "optimizer": {"param_groups": groups, "state": scalars, "sharded": dtypes}}


def load(model: nn.Module, optimizer: torch.optim.Optimizer, sync: ShardedSync, record: dict[str, Any],
         folder: Path) -> None:
    """Collective: the model and the optimizer as `save` wrote them into `folder` (`record`: what it
    returned), on this run's workers whatever their number (DCP reads each worker's part of every
    tensor, resharding); `record`'s tensors are on this worker's device already."""
    params = _params(sync)
    saved = record["optimizer"]
    names = _group_names(optimizer, sync)
    if [g["params"] for g in saved["param_groups"]] != names:
        raise ValueError(f"{folder}: the checkpoint's optimizer groups other parameters than this run's; "
                         "pass another checkpoint or start a new run")
    local: dict[str, dict[str, Tensor]] = {}  # the optimizer's tensors, filled through `targets`
    targets: dict[str, dict[str, DTensor]] = {}
    for name, keys in saved["sharded"].items():
        p, view = params[name]
        for key, dtype in keys.items():
            t = torch.zeros(view.shape, dtype=_DTYPES[dtype], device=view.device)
            local.setdefault(name, {})[key] = t
            targets.setdefault(name, {})[key] = _as_dtensor(t, p)
    model_state = model.state_dict()  # FSDP2's parameters as DTensors: loaded in place
    dcp.load({"model": model_state, "optimizer": targets}, checkpoint_id=folder)
    model.load_state_dict(model_state)  # a no-op where DCP loaded in place (the documented pattern)
    index = {name: i for i, name in enumerate(chain(*names))}
    state = {index[name]: {**saved["state"].get(name, {}), **local.get(name, {})}
             for name in index if name in saved["state"] or name in local}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in saved["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def check_record(record: Any, model: nn.Module | None, folder: Path | None) -> str | None:
    """What is wrong with a checkpoint's `sharded` record (a file edited or cut by hand), as the
    end of a sentence, else None: `model` (this run's, on the meta device) gives the names and
    shapes; `folder` (where the record says the DCP folder is) must hold DCP's metadata."""
    if not (isinstance(record, dict) and isinstance(record.get("dcp"), str)
            and isinstance(record.get("shapes"), dict) and isinstance(record.get("optimizer"), dict)):
        return "sharded record has no folder, shapes and optimizer"
    name = record["dcp"]
    if Path(name).name != name or not name.endswith(SUFFIX):
        return f"sharded folder {name!r} is not a folder's name beside it"
    optimizer = record["optimizer"]
    groups = optimizer.get("param_groups")
    if not (isinstance(groups, list) and groups and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("sharded"), dict)):
        return "optimizer state has no parameter groups"
    shapes = record["shapes"]
    if not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return "optimizer's parameter groups name no parameters"
    named = [*chain(*(g["params"] for g in groups)), *optimizer["state"], *optimizer["sharded"]]
    unknown = [n for n in named if n not in shapes]
    if unknown:
        return f"optimizer holds {unknown[0]}, which its model has not"
    if any(not isinstance(keys, dict) or any(d not in _DTYPES for d in keys.values())
           for keys in optimizer["sharded"].values()):
        return "optimizer's sharded state names no tensor type"
    if model is not None:
        want = model.state_dict()
        for key, t in want.items():
            if key not in shapes:
                return f"model has no {key}"
            if list(shapes[key]) != list(t.shape):
                return f"model's {key} is of shape {list(shapes[key])} where this model's is {list(t.shape)}"
        extra = [k for k in shapes if k not in want]
        if extra:
            return f"model holds {extra[0]}, which this model has not"
    if folder is not None and not (folder / METADATA).is_file():
        return f"sharded folder {folder} is missing or holds no DCP metadata"
    return None


def remove_others(run_dir: Path, keep: str) -> None:
    """Every checkpoint folder in `run_dir` but `keep` (the one checkpoint.pt names): the previous
    checkpoint's, and any a crash left half written."""
    for path in run_dir.glob(f"checkpoint.*{SUFFIX}*"):
        if path.name != keep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def read_full(folder: Path) -> dict[str, Tensor]:
    """A sharded checkpoint's tensors whole, read in this process without workers: `model.NAME`
    and `optimizer.NAME.KEY` (e.g. `optimizer.tok.weight.exp_avg`), as DCP flattens them."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(folder)).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype, device="cpu")
             for k, m in meta.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():  # DCP's note that it reads in one process: that is the intent
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=folder, no_dist=True)
    return state
