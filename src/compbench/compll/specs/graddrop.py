"""GradDrop's selection (Aji and Heafield, 2017) as a CompLL spec: the kernels of compressors/graddrop.py.

The threshold is the ceil(m * r)-th largest |x| of m elements drawn uniformly with torch's generator
(the draw stays on the host, in the generated glue, so the payloads are those of the hand-written
code it replaced); every element with |x| >= threshold passes the filter, at most 2k are sent
(the largest).
"""

from compbench.compll.lang import Select, abs_, threshold, x

SPEC = Select(
    name="graddrop",
    doc="GradDrop's selection: a threshold from a uniform sample, then every |x| above it.",
    key=abs_(x),
    keep=abs_(x) >= threshold(),
    sample="random",
)
