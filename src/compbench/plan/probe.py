"""The engine probe as one rank of a job: `python -m compbench.plan.probe OUT.json ENGINE_NODE_JSON`
(`compbench plan` starts it through compbench's launcher); rank 0 writes SeCoPa's fitted network lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compbench.catalog import registry
from compbench.schedulers.secopa_fit import lines_to_json, probe_engine


def main(argv: list[str]) -> int:
    out, node = Path(argv[0]), json.loads(argv[1])
    engine = registry.build(node, drop=("np",))
    try:
        lines = probe_engine(engine)
        if engine.rank == 0:
            out.write_text(json.dumps({"world": engine.size, "lines": lines_to_json(lines)}))
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
