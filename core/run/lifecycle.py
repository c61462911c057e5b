"""What a run does around its steps, the same for a training run (core/run/trainer.py) and an endpoint
collection (core/run/collection.py): Ctrl-C stops it after the current step, and the command line
(``python -m core.train``) turns how it ended into an exit status. Torch-free.
"""
from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass
from typing import Callable

from tqdm import tqdm

from storage.db import StoreError


@dataclass
class StopFlag:
    """What Ctrl-C tells a run's loop: stop after the current step; and what the run tells the
    handler: the final status is being written."""
    stop_requested: bool = False
    finishing: bool = False


@contextlib.contextmanager
def stop_on_sigint(run, unit: str = "step"):
    """While the block runs: the first Ctrl-C sets ``run.stop_requested`` (the loop finishes the
    current ``unit``, records it and stops), the second raises KeyboardInterrupt (stop at once,
    resumable from the last checkpoint), and once ``run.finishing`` is true Ctrl-C is ignored
    (the final status write is short, and must not leave the run marked 'running'). Outside the
    main thread no handler can be installed: Ctrl-C behaves as usual."""
    def handler(signum, frame):
        if getattr(run, "finishing", False):
            return
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop_requested = True
        tqdm.write(f"stopping after the current {unit} (Ctrl-C again to stop now)")
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def record_and_exit(db: str, open_recorder: Callable, go: Callable, failed: str,
                    told: tuple[tuple[type, str], ...] = (), announce: bool = True,
                    close: Callable[[], None] = lambda: None) -> int:
    """Open the store (``open_recorder()``), record the run (``go(recorder)`` returns its id),
    close both and say how it went, as the exit status of ``python -m core.train``:

    - 2: the store cannot be opened (a foreign, unreadable or newer store: refused, untouched);
    - 1: the run failed: "error: {failed} failed: Type: message", except for the errors ``told``
      lists as (type, prefix), which already say what to do: "error: {prefix}message";
    - 0: recorded; "run ID recorded in DB" when ``announce``.

    ``close`` runs after the recorder is closed, whether the run failed or not (torchrun's ranks).
    """
    try:
        recorder = open_recorder()
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_id = go(recorder)
    except Exception as exc:
        prefix = next((p for kind, p in told if isinstance(exc, kind)), None)
        print(f"error: {prefix}{exc}" if prefix is not None
              else f"error: {failed} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        recorder.close()
        close()
    if announce:
        print(f"run {run_id} recorded in {db}")
    return 0
