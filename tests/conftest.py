import os

import pytest
import torch

# One thread per test process: the distributed tier runs 2 ranks on a 2-core machine.
torch.set_num_threads(int(os.environ.get("COMPBENCH_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
