"""Run as every rank of a local 2-rank job: after joining the process group, every socket this
process listens on is bound to the loopback; exits non-zero otherwise."""

import os
import sys
from pathlib import Path

from compbench.catalog import registry

LOOPBACK = ("0100007F", "00000000000000000000000001000000")  # 127.0.0.1 and ::1 as /proc writes them


def listening_addresses() -> list[str]:
    """Local addresses of the TCP sockets this process listens on (/proc/self/fd -> /proc/net/tcp)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(cols[1].split(":")[0])
    return found


def main(engine_name: str) -> None:
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    engine.barrier()
    addresses = listening_addresses()
    engine.barrier()
    engine.shutdown()
    if any(a not in LOOPBACK for a in addresses):
        sys.exit(f"rank {engine.rank} listens on {addresses}")


if __name__ == "__main__":
    main(sys.argv[1])
