"""CompLL specifications, one module per compressor (module name = spec name): each defines `SPEC`.
A module here is the only file a new compressor needs (`compbench.compll.runtime` finds it)."""
