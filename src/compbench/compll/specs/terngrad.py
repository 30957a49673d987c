"""TernGrad's codes (Wen et al., 2017) as a CompLL spec: the kernel of compressors/terngrad.py.

q = +1 where x > U*s, -1 where x < -U*s, else 0 (U: the counter-based stream), as 2-bit codes
1, 3, 0; s (max |x|, clipped) is computed by the compressor and handed in as the kernel's input.
Decode: 0, s, (unused), -s. Its kernels keep the names the hand-written ones had
(`terngrad_codes`), so the launchers and the parity tests are unchanged.
"""

from compbench.compll.lang import Code, Header, Input, Spec, uniform, where, x

thr = uniform() * Input(0)
code = Code()

SPEC = Spec(
    name="terngrad",
    doc="TernGrad's stochastic ternary codes, 2 bits each, against the scale handed in.",
    bits=2,
    inputs=1,
    code=where(x > thr, 1, where(x < -thr, 3, 0)),
    # The decode table of packing.ternary_values: [0, s, 0, -s] (the compressor sends s itself).
    value=where(code.eq(1), Header(0), where(code.eq(3), -Header(0), 0.0)),
    header=(Input(0),),
    register=False,
    encode_name="terngrad_codes",
)
