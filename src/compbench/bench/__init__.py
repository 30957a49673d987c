"""`compbench bench`: micro-benchmark of the compressors' encode, decode and error-feedback update at
given sizes, each time also given against floors measured in the same run (one read pass, one copy,
a zero fill, exact `torch.topk`). `main.py` checks the config and prints the table; `micro.py`
measures, in a child process whose threads and allocator are set before torch starts."""
