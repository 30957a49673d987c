"""The compressor contract and its wire toolkit: the `Compressor` protocol and its declared
`Capabilities` (base.py), bit packing, decoding and the shared random streams (packing.py), output
buffers (buffers.py) and the fused-compensation handle memories pass to compressors (deferred.py).
Compressors, memories, communicators and CompLL's runtime build on it; it imports only kernels/.
"""
