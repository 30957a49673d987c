"""What a rank's server threads share (sync=quorum_diloco's synchronizer, sync=halos's parameter
servers): one queue of events that the rank's own worker (`submit`) and the receiver threads feed, one
queue of replies to the rank's own worker (`wait_reply`), a lock for what a checkpoint or summary
reads, and a thread's failure kept for the training thread, which raises it at its next call (an error
in a thread is lost otherwise, and the training thread would wait for a reply that never comes)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

_POLL_S = 1.0  # how often the training thread, while it waits, looks whether a thread failed

E = TypeVar("E")  # an event
R = TypeVar("R")  # a reply to the rank's own worker


class ServerThreads(Generic[E, R]):
    """The threads `loops` (name, function), started at once; `what` names the server in a failure."""

    def __init__(self, what: str, loops: Sequence[tuple[str, Callable[[], None]]]) -> None:
        self.what = what
        self.events: queue.Queue[E] = queue.Queue()
        self.mine: queue.Queue[R] = queue.Queue()
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._guard, args=(loop,), name=name, daemon=True)
                        for name, loop in loops]
        for t in self.threads:
            t.start()

    def _guard(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as e:  # kept for the training thread (see the module)
            self.error = e

    def submit(self, event: E) -> None:
        self.raise_failure()
        self.events.put(event)

    def wait_reply(self) -> R:
        while True:
            self.raise_failure()
            try:
                return self.mine.get(timeout=_POLL_S)
            except queue.Empty:
                continue

    def raise_failure(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"{self.what} failed: {self.error!r}") from self.error

    def join(self) -> None:
        for t in self.threads:
            while t.is_alive():
                t.join(timeout=_POLL_S)
                self.raise_failure()
        self.raise_failure()
