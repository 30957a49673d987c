"""`compbench bench`: micro-benchmark of the compressors' encode, decode and error-feedback update at
given sizes, each time also given against floors measured in the same run (one read pass, one copy,
a zero fill, exact `torch.topk`). `main.py` checks the config and prints the table; `micro.py`
measures, in a child process whose threads and allocator are set before torch starts.
`mode=e2e`: end-to-end step times of real 2-worker trainings against DDP and Horovod, each phase
against its floor (`e2e.py` runs the matrix, `e2e_table.py` writes its tables and targets)."""
