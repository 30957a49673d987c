"""CompLL (HiPress): a compression algorithm written once as a spec, its code generated.

`lang` is the language (a `Spec` of expressions over the primitives), `specs/` holds one spec per
file (a plugin's `compll/` folder more: `catalog`), `lower` lowers a spec's expressions to typed
nodes, `printer` prints them for every target, `gen_torch` / `gen_cpu` / `gen_cuda` fill the
templates (`skeleton`, `templates/`) of the torch oracle and compressor class, the C++ operators of
the CPU extension and the CUDA RawKernels, `generated` writes the generated files (and the conf
entry of a registered spec) and hands the kernel sources to the kernel layer, `runtime` runs them,
`main` is `compbench gen`. Tutorial: docs/tutorials/compll.md.
"""
