"""`efsignsgd`: EF-SignSGD (Karimireddy et al., ICML 2019), scaled sign with error feedback."""

from __future__ import annotations

from compbench.compressors.signsgd import SignSGD


class EFSignSGD(SignSGD):
    """The `signsgd` encoding (packed signs + mean |x|, ceil(n/8) + 4 bytes) meant to run with
    residual memory: the error feedback is what makes scaled sign compression converge like SGD
    (EF-SignSGD). The memory is chosen by the `memory` config group; use `memory=residual`."""

    name = "efsignsgd"
