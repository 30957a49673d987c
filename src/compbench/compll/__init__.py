"""CompLL (HiPress): a compression algorithm written once as a spec, its code generated.

`lang` is the language (a `Spec` of expressions over the primitives), `specs/` holds one spec per
file, `gen_torch` / `gen_cpu` / `gen_cuda` generate the torch oracle and compressor class, the C++
operators of the CPU extension and the CUDA RawKernels, `generated` writes the generated files
(and the conf entry of a registered spec), `runtime` runs them, `main` is `compbench gen`.
Tutorial: docs/tutorials/compll.md.
"""
