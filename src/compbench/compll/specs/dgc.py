"""DGC's selection (Lin et al., 2018) as a CompLL spec: the kernels of compressors/dgc.py's encode.

The threshold is the ceil(m * r)-th largest |x| of a strided sample from a random start (drawn
with torch's generator on the host, in the generated glue); the filter keeps |x| >= threshold;
while fewer than 0.8k pass, the threshold is lowered by 0.8 (at most 10 times); at most k are sent,
the largest. memory=dgc's momentum correction stays hand-written (memory/dgc.py).
"""

from compbench.compll.lang import Select, abs_, threshold, x

SPEC = Select(
    name="dgc",
    doc="DGC's selection: a threshold from a strided sample, adapted by 0.8 until 0.8k pass.",
    key=abs_(x),
    keep=abs_(x) >= threshold(),
    sample="strided",
    adapt=(0.8, 10),
)
