"""1-bit SGD's step (Seide et al., 2014) as a CompLL spec: the kernel of compressors/onebit.py.

Bit = x < 0 (zero and NaN: 0); the header holds the mean of the negative elements and the mean of
the others (0 for an empty side; NaN in any element makes both NaN, as the torch twin's clamped
sums do). The codes read no header, so the generated kernel reduces and packs in one read.
Its CPU operator keeps the hand-written one's name (`onebit_pack`).
"""

from compbench.compll.lang import Code, Header, Spec, maximum, minimum, numel, reduce, to_int, where, x

negatives = reduce("count", x < 0.0)
code = Code()

SPEC = Spec(
    name="onebit",
    doc="1-bit SGD: the sign bit of each value and the means of both signs' halves.",
    bits=1,
    code=to_int(x < 0.0),
    header=(reduce("sum", minimum(x, 0.0)) / maximum(negatives, 1),
            reduce("sum", maximum(x, 0.0)) / maximum(numel() - negatives, 1)),
    value=where(code.eq(1), Header(0), Header(1)),
    register=False,
    encode_name="onebit_pack",
)
