"""`natural`: natural compression (Horvath et al., 2019), written only as a CompLL spec.

Each value is rounded stochastically to one of its two neighbouring powers of two, sign kept:
|x| in [2^e, 2^(e+1)) becomes 2^(e+1) with probability |x| / 2^e - 1, else 2^e (unbiased; the
variance is at most 1/8 of x^2). The paper sends 9 bits (sign + the 8-bit exponent); compbench
sends 8: the sign and 7 bits of exponent counted down from the tensor's largest, whose |x| travels
as a one-value fp32 header (8 bits per value + 4 bytes per tensor). Values more than 2^126 below
the largest (and fp32 subnormals) are sent as 0.
"""

from compbench.codec.base import Capabilities
from compbench.compll.lang import (
    Code,
    Header,
    Setting,
    Spec,
    abs_,
    exponent,
    let,
    maximum,
    pow2,
    reduce,
    to_int,
    uniform,
    where,
    x,
)

# Encode, per element (the header's largest |x| is Header(0)).
a = let("a", abs_(x))
e = let("e", exponent(a))                         # biased exponent: |x| in [2^(e-127), 2^(e-126))
frac = let("frac", a / pow2(e) - 1.0)             # where |x| sits between its two powers of two
top = let("top", exponent(Header(0)) + 1)         # no value rounds above 2^(top-127)
k = let("k", e + to_int(uniform() < frac) - top + 127)  # rounded up with probability frac; 1..127
magnitude = where((e > 0) & (k >= 1), k, 0)       # 0: zero, subnormal, or too small to send

# Decode, per code.
code = Code()
mag = let("mag", code & 127)
value = let("value", where(mag.eq(0), 0.0, pow2(mag + exponent(Header(0)) + 1 - 127)))

SPEC = Spec(
    name="natural",
    doc="Natural compression: each value rounded stochastically to a power of two, 8 bits each.",
    bits=8,
    header=(maximum(reduce("max", abs_(x)), 0.0),),  # the largest |x| (NaN if any element is)
    code=(to_int(x < 0.0) << 7) | magnitude,
    value=where((code & 128).eq(128), -value, value),
    settings={"seed": Setting(0, int, None, "an integer")},
    caps=Capabilities(unbiased=True),
)
