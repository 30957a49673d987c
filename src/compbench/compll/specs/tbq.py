"""TBQ's step (Strom, 2015) as a CompLL spec: the kernel of compressors/tbq.py.

The residual R is the spec's state: R += g; code +1 (1) where R >= tau, -1 (3) where R <= -tau,
else 0; the sent +-tau leaves R (R -= tau * q), in the same pass. Decode: 0, tau, (unused), -tau.
Its kernels keep the hand-written ones' names (`tbq_step`) and parameters, so the launchers and the
parity tests are unchanged.
"""

from compbench.compll.lang import Bound, Code, Param, Setting, Spec, State, let, where, x

tau = Param("tau")
r = let("r", State() + x)                   # the residual with this step's gradient
up = let("up", r >= tau)
down = let("down", r <= -tau)
code = Code()

SPEC = Spec(
    name="tbq",
    doc="TBQ's step: the residual's +-tau as 2-bit codes, what is sent leaving the residual.",
    bits=2,
    code=where(up, 1, where(down, 3, 0)),
    update=r - where(up, tau, where(down, -tau, 0.0)),
    value=where(code.eq(1), tau, where(code.eq(3), -tau, 0.0)),
    settings={"tau": Setting(0.01, float, Bound(">", 0), "a number > 0")},
    register=False,
    encode_name="tbq_step",
)
