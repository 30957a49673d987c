"""`compbench gen SPEC --target torch|cpu|cuda`: print the code CompLL generates from a spec."""

from __future__ import annotations

from compbench.base.args import ArgumentParser

TARGETS = ("torch", "cpu", "cuda", "conf")


def main(argv: list[str]) -> int:
    from compbench.compll import gen_cpu, gen_cuda, gen_torch, runtime

    parser = ArgumentParser(prog="compbench gen",
                            description="print the code generated from a CompLL spec "
                                        "(compbench/compll/specs/, a plugin's compll/)")
    parser.add_argument("spec", help=f"a spec: {', '.join(sorted([*runtime.specs(), *runtime.selects()]))}")
    parser.add_argument("--target", default="torch",
                        help="torch (the oracle and the compressor class), cpu (the C++ operators), cuda "
                             "(the RawKernels) or conf (the generated Hydra option)")
    args = parser.parse_args(argv)
    if args.target not in TARGETS:
        raise ValueError(f"--target {args.target}: choose one of {', '.join(TARGETS)}")
    s = runtime.spec(args.spec)
    if args.target == "conf":
        if not s.register:
            raise ValueError(f"spec {s.name} is a kernel of a hand-written compressor: it has no conf entry "
                             f"(conf/compressor/{s.name}.yaml is its option)")
        text = runtime.conf_text(s)
    else:
        text = {"torch": gen_torch.source, "cpu": gen_cpu.source, "cuda": gen_cuda.source}[args.target](s)
    print(text, end="" if text.endswith("\n") else "\n")
    return 0
