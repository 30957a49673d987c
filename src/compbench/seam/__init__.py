"""The compression seam's core: the gradient pipeline (memory -> compressor -> communicator, with its
fusion, phase timing and byte booking), the selection of which tensors it compresses, and the builders
of the components from the composed config. Schedulers and synchronizers drive it; it knows neither.
"""
