"""`compbench report DIR`: tables, plots and what-if scaling of a run or a sweep."""
