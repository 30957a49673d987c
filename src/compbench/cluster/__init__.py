"""An emulated multi-machine cluster on this machine: `compbench cluster` (main.py), built by nodes.py."""
