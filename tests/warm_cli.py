"""The CLI for the tests, started warm: `run(args, cwd, timeout)` is `python -m compbench ARGS` less
the interpreter's start and torch's import (1-1.5 s of each of the suite's commands on a
2-core machine: a bad input's whole run is 2 s, of which its own work is 0.4 s).

One server process (started on first use, ended with the test session) imports what every command
imports first (torch, as compbench.cli.main does, and the CLI's modules) and nothing else: no
config composed, no op run, no thread started but the one numpy's BLAS starts (which forks
cleanly). For each command it forks a child that takes the test's working folder, environment,
/dev/null for stdin and files for stdout and stderr, runs `compbench.cli.main.main(ARGS)` and exits
as `python -m compbench` does (sys.exit: atexit handlers and the interpreter's finalization run).
The child is a process of its own, as a fresh one would be: its own Hydra state, signals as the
suite's (inherited as a subprocess's would be), workers started by its launcher.

Not for commands whose test sets environment variables (the server's imports have read the
environment it started in): tests.helpers.compbench runs those in a fresh interpreter, as the tests
that watch the start-up itself (Ctrl-C during the imports) start theirs (tests.helpers.start_compbench).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_SERVER = r"""
import json, os, sys
import torch  # noqa: F401  - as compbench.cli.main imports it before a command that needs it
import compbench.cli.commands  # noqa: F401
from compbench.cli.main import main

requests, replies = sys.stdin, sys.stdout
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY),
                                (2, job["stderr"], os.O_WRONLY)):
            os.dup2(os.open(path, flags), fd)
        sys.argv = [sys.argv[0], *job["args"]]
        sys.exit(main(job["args"]))
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
"""

_server: subprocess.Popen | None = None


def run(args: list[str], cwd: Path | None, timeout: float) -> subprocess.CompletedProcess:
    """`compbench ARGS` in a child of the warm server, as subprocess.run(capture_output=True, text=True)
    would return it (subprocess.TimeoutExpired after `timeout` seconds, the child killed)."""
    server = _started()
    with tempfile.TemporaryDirectory(prefix="compbench-warm-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch()
        err.touch()
        job = {"args": list(args), "cwd": str(cwd or Path.cwd()), "env": dict(os.environ),
               "stdout": str(out), "stderr": str(err)}
        assert server.stdin is not None
        server.stdin.write((json.dumps(job) + "\n").encode())
        pid = _reply(server, 120)["pid"]  # the first waits for the server's imports
        try:
            code = _reply(server, timeout)["returncode"]
        except subprocess.TimeoutExpired as late:
            os.kill(pid, signal.SIGKILL)
            _reply(server, 30)
            raise subprocess.TimeoutExpired(["compbench", *args], timeout, out.read_text(),
                                            err.read_text()) from late
        return subprocess.CompletedProcess(["compbench", *args], code, out.read_text(), err.read_text())


def _reply(server: subprocess.Popen, timeout: float) -> dict:
    """The server's next line: read from its pipe unbuffered (a buffered reader could hold both of
    a fast command's lines while select waits for the second)."""
    assert server.stdout is not None
    fd, line = server.stdout.fileno(), b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("compbench", timeout)
        byte = os.read(fd, 1)
        assert byte, f"the warm CLI server ended (exit {server.poll()})"
        line += byte
    return json.loads(line)


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, bufsize=0)
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        assert server.stdin is not None
        server.stdin.close()  # its loop ends
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
