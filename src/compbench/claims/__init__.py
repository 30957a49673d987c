"""`compbench claims`: published findings on gradient compression, written as experiments with a check.

`findings.py` is the data: the runs (named override lists) and the claims (which runs, what the paper
found, a check over the runs' results.json summaries). `runner.py` runs every run of the suite through
`compbench train`, skips the finished ones, and writes the table and a plot per claim.
"""
