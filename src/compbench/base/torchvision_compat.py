"""Make `import torchvision` work when its C++ extension cannot load.

The torchvision 0.28.0 wheel is built against CUDA torch; with the CPU build of torch 2.13.0 its
`_C.so` fails to load (it links libtorch_cuda). torchvision then still registers fake kernels for
`torchvision::nms` and `torchvision::qnms` without checking that the ops exist, so the import itself
fails. compbench uses only torchvision's pure-Python models, datasets and transforms, so declaring
those two op schemas (never called) is enough. Nothing happens when the extension loads.
"""

from __future__ import annotations

import importlib.util
import os


def patch() -> None:
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    lib = os.path.join(os.path.dirname(spec.origin), "_C.so")
    try:
        torch.ops.load_library(lib)
        return  # the real ops are there
    except (OSError, RuntimeError):
        pass
    if hasattr(torch.ops.torchvision, "nms"):
        return
    defs = torch.library.Library("torchvision", "DEF")
    defs.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    defs.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(defs)  # the library object must outlive the import


_KEEP: list[object] = []
patch()
