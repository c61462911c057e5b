"""The model's work off the server's event loop: one thread runs the jobs in order from a
bounded queue, so health checks, refusals and other requests are answered while torch works, and
a flood of chat requests waits in a queue of known size instead of piling up threads.

One thread because the model generates one request at a time anyway (``ChatModel.lock``); a
job whose client left or whose deadline passed while it waited returns at once (its
``ClientWatch``), so a departed client does not hold the queue.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable


class Busy(Exception):
    """The queue is full: the request is answered 503 with ``Retry-After``."""


class Generations:
    """``submit(fn)`` -> a Future of ``fn()``, run on the one worker thread; ``Busy`` when
    ``max_waiting`` jobs already wait. ``close()`` lets the jobs queued finish, then ends."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self._jobs: queue.Queue = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="generations")
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs submitted and not yet begun."""
        return self._waiting

    def submit(self, fn: Callable) -> Future:
        with self._lock:
            if self._closed:
                raise Busy("the server is stopping")
            if self._waiting >= self.max_waiting:
                raise Busy(f"{self._waiting} requests are waiting for the model")
            self._waiting += 1
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            fn, future = item
            with self._lock:
                self._waiting -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 -- handed to the request that asked
                future.set_exception(exc)

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            self._closed = True
        self._jobs.put(None)
        self._thread.join(timeout)
