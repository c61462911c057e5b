"""How a TRL run recorded by storage.integrations.trl.RecorderCallback ends when TRL's
``on_train_end`` never comes, and what the store then says: a status the contract allows
(``failed`` or ``stopped``) and the reason in ``runs.error``.

* An exception leaves ``trainer.train()`` (a reward function raises, CUDA runs out of memory):
  ``failed`` with ``Type: message`` of that exception, the step it ended and its innermost
  frames (``failure_text``). Which exception: the one the interpreter reports as uncaught
  (``sys.last_exc``/``sys.last_value``, set before ``atexit`` handlers run), else the last one
  seen leaving the trainer's wrapped methods (``RunEnd.seen``: a script that catches the error
  and calls ``sys.exit``), else none (the reason says so). ``callback.recording()`` marks the run
  at once, with its own exception, for processes that go on (a notebook). Ctrl-C
  (KeyboardInterrupt) gives ``stopped``, as Ctrl-C does in our own trainer (core/run/trainer.py).
* SIGTERM (a scheduler's preemption, ``kill``, ``timeout``): ``stopped``, "SIGTERM during step N".
  Python's default for SIGTERM is to die at once: no ``atexit``, no ``finally``, the run left
  ``running``. So while TRL trains a handler waits (at most ``DRAIN_S``) for the steps already
  handed to the writer, marks the run, puts the default back and sends itself the signal again:
  the process still dies of SIGTERM (exit status -15, 143 in a shell). A handler already there
  (transformers' ``enable_jit_checkpoint``, the user's own) is called instead and decides; the run
  is then marked when it ends (``stopped`` at ``on_train_end``, with the signal as the reason).
* SIGKILL, the kernel's OOM killer, a power cut: nothing in the process runs. The run stays
  ``running`` and the app shows it as ``interrupted`` once it has been silent for
  storage.queries.STALE_AFTER_S (a derived display state, not a stored status).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from typing import Callable

MAX_MESSAGE_CHARS = 1000   # an exception's message kept in runs.error (a tensor's repr can be MBs)
FRAMES = 3                 # innermost traceback frames kept: enough to name the reward function
DRAIN_S = 10.0             # SIGTERM: wait this long for queued steps (schedulers give 30 s or more)


def failure_text(exc: BaseException, step: int | None) -> str:
    """``"{Type}: {message} (during step {step}; at file:line in function, ...)"``.

    The message is cut to ``MAX_MESSAGE_CHARS`` (the cut says how much was left out) and only the
    ``FRAMES`` innermost frames are named, by file name without its folders: the text is bounded
    (about MAX_MESSAGE_CHARS + FRAMES x 100 characters) whatever the exception holds, and names
    no home directory. NUL and lone surrogates are cleaned by the recorder (clean_text)."""
    try:
        message = str(exc)
    except Exception as str_exc:  # an exception whose __str__ raises still has a type to show
        message = f"<str() raised {type(str_exc).__name__}>"
    if len(message) > MAX_MESSAGE_CHARS:
        message = (message[:MAX_MESSAGE_CHARS]
                   + f"... ({len(message) - MAX_MESSAGE_CHARS} more characters)")
    text = type(exc).__name__ + (f": {message}" if message else "")
    where = [] if step is None else [f"during step {step}"]
    frames = traceback.extract_tb(exc.__traceback__)[-FRAMES:] if exc.__traceback__ else []
    if frames:
        where.append("at " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
                                         for f in reversed(frames)))
    return text + (f" ({'; '.join(where)})" if where else "")


def status_for(exc: BaseException | None) -> str:
    """``stopped`` for a stop someone asked for (Ctrl-C, ``sys.exit(0)``), else ``failed``."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped"
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return "stopped"
    return "failed"


def _uncaught() -> BaseException | None:
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


class RunEnd:
    """The ways out of a run other than ``on_train_end``: armed at ``on_train_begin``, disarmed
    once the run is marked. ``mark(status, reason, drain_s)`` writes the end (the callback's);
    ``step()`` is the step in progress. Handler installed from the main thread only (Python's
    rule); ``SIG_IGN`` is left alone (the user chose to ignore SIGTERM)."""

    def __init__(self, mark: Callable[[str, str, float], None], step: Callable[[], int | None]):
        self._mark = mark
        self._step = step
        self.seen: BaseException | None = None      # the last exception out of TRL's methods
        self.signal: tuple[int, int | None] | None = None  # (signal, step) once one came
        self.ended = False
        self.finishing = False                       # on_train_end is writing the status
        self._pending: int | None = None             # a signal held while it does
        self._previous = None
        self._stale: BaseException | None = None
        self._armed = False

    def arm(self) -> None:
        self._stale = _uncaught()  # an interactive session's earlier error is not this run's
        atexit.register(self._at_exit)
        self._armed = True
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_IGN, None):  # None: set outside Python, keep it
            return
        self._previous = previous
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def disarm(self) -> None:
        if self._armed:
            atexit.unregister(self._at_exit)
            self._armed = False
        if self._previous is not None:
            # transformers' JIT checkpoint callback restores its own previous handler at
            # on_train_end: put ours back only if nobody replaced it since
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self._pending is not None:  # came while on_train_end wrote: deliver it now
            pending, self._pending = self._pending, None
            os.kill(os.getpid(), pending)

    def stop_reason(self) -> str | None:
        """``"SIGTERM during step N"`` once a SIGTERM came, else None."""
        if self.signal is None:
            return None
        signum, step = self.signal
        name = signal.Signals(signum).name
        return name if step is None else f"{name} during step {step}"

    def end(self, exc: BaseException | None = None, drain_s: float = 30.0) -> None:
        """Mark the run (once): stopped by a signal, else by ``exc`` (``status_for``), else failed
        with no exception to show."""
        if self.ended:
            return
        self.ended = True
        step = self._step()
        reason = self.stop_reason()
        if reason is not None:
            status = "stopped"
        elif exc is not None:
            status, reason = status_for(exc), failure_text(exc, step)
        else:
            status = "failed"
            reason = (f"the training process ended{'' if step is None else f' during step {step}'}"
                      " before TRL's on_train_end, with no exception to show (os._exit, "
                      "sys.exit in a callback?)")
        try:
            self._mark(status, reason, drain_s)
        except Exception as mark_exc:  # e.g. the disk is full: say so, the process is ending
            print(f"RecorderCallback could not mark the run {status}: {mark_exc}", file=sys.stderr)
        finally:
            self.disarm()

    def _at_exit(self) -> None:
        exc = _uncaught()
        self.end(exc if exc is not None and exc is not self._stale else self.seen)

    def _on_sigterm(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = (signum, self._step())
        if self.finishing:
            self._pending = signum
            return
        previous = self._previous
        if callable(previous):  # theirs decides (e.g. checkpoint and stop at a step boundary)
            previous(signum, frame)
            return
        self.end(drain_s=DRAIN_S)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
