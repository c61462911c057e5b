"""An environment behind a deadline and a size cap, so a user's env cannot hang or flood the
trainer. Both episode loops (core/rollout/engine.py, core/run/collection.py) talk to their episodes only
through a ``Guard``: they map its ``EnvError`` to a trajectory ended as ``env_error``.

Every call into one episode (``env.episode``, ``reset``, ``state_key``, ``step``, ``render``,
``outcome``) runs on that episode's own worker thread and is waited for at most ``timeout_s``
(``--env-step-timeout``). One thread per episode, not any free one, because objects an episode
makes are often tied to the thread that made them (a ``sqlite3`` connection refuses any other
thread: the apps env's world is one); an object the env's factory made in the main thread and
shares between episodes still meets a worker thread here. The episodes are called one at a time,
in order, as without the guard.

A Python thread cannot be killed. A call past its deadline is abandoned: the trajectory ends as
``env_error`` naming the deadline, the run goes on, and the worker stays stuck in the env's code
until that returns (if ever), holding its episode. Such a worker is never given another call;
it ends when the call returns. At most ``MAX_STUCK`` abandoned calls may still be running at
once: the next one that times out raises ``EnvStuck`` naming the env, which fails the run (a
daemon thread does not keep the process alive at exit). A call stuck in C code that holds the
GIL would stall every thread; nothing in-process can bound that.

What comes back is checked before the loop uses it (``EnvError`` otherwise): a ``StepResult``
with a text observation and a finite real ``reward``; an ``Outcome`` with a finite real ``score``
and ``process``, a bool ``success``, text or None ``answer`` and a dict ``info``. The
observation is cut to ``max_obs_bytes`` of UTF-8 before anyone tokenises or stores it, the cut
recorded in the step's info as ``observation_cut_bytes``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from core.envs.base import Outcome, StepResult

DEFAULT_TIMEOUT_S = 120.0
"""``--env-step-timeout``'s default (fixed in the project's contracts)."""
OBS_BYTES_PER_TOKEN = 128
"""``max_obs_bytes = OBS_BYTES_PER_TOKEN * max_obs_tokens``: no SmolLM2 token is longer than 81
bytes of UTF-8 and ordinary text runs 3-4 bytes a token (search observations 3.0, Python 3.6),
so the kept bytes hold far more than ``max_obs_tokens`` tokens and the token cut still decides
what the model sees; the byte cut only keeps a 40 MB observation from being tokenised whole
(tokenising 4 MB took 360 MB and 3.3 s)."""
MAX_STUCK = 64
"""Abandoned calls that may still be running at once before the run is stopped: enough for an
env that hangs now and then over a long run, few enough that the stuck threads and the
episodes they hold stay small."""
CUT_KEY = "observation_cut_bytes"
"""The step info key recording how many bytes of the observation were cut."""
_MAX_IDLE = 256
"""Idle workers kept for the next episodes (one rollout batch's worth); more end."""


class EnvError(Exception):
    """One call into the env failed: it raised, ran past its deadline or returned something
    unusable. Ends that trajectory only (``env_error``). ``text`` is the error as recorded on
    the turn; ``info()`` is what ``trajectories.info.env_error`` keeps."""

    def __init__(self, env: str, call: str, text: str):
        super().__init__(f"environment {env}: {call}: {text}")
        self.env, self.call, self.text = env, call, text

    def info(self) -> dict[str, str]:
        return {"env": self.env, "call": self.call, "error": self.text}


class EnvStuck(RuntimeError):
    """Too many calls into the env are still running past their deadline: the run stops."""


def obs_byte_cap(max_obs_tokens: int) -> int:
    """The byte cap on one observation: ``OBS_BYTES_PER_TOKEN * max_obs_tokens``."""
    return OBS_BYTES_PER_TOKEN * max_obs_tokens


def env_name(env: Any) -> str:
    name = getattr(env, "name", None)
    return name if isinstance(name, str) and name else type(env).__name__


# -- workers ---------------------------------------------------------------------------------------
class _Worker:
    """A daemon thread running the calls it is given, one at a time, in order."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name="env-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.calls.get()
            if job is None:
                return
            fn, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the env's, whatever it is: the caller decides
                    future.set_exception(exc)
            # drop the result before waiting: a 40 MB observation must not outlive its call
            del fn, future, job
            if self.abandoned:  # never reused: it may have left the env in any state
                return

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self.calls.put((fn, future))
        return future


_lock = threading.Lock()
_idle: list[_Worker] = []
_stuck: list[tuple[_Worker, str, str]] = []
"""(worker, env name, call) of every abandoned call, pruned of those that returned."""


def _take() -> _Worker:
    with _lock:
        return _idle.pop() if _idle else _Worker()


def _give_back(worker: _Worker) -> None:
    with _lock:
        if len(_idle) < _MAX_IDLE:
            _idle.append(worker)
            return
    worker.calls.put(None)


def stuck_calls() -> list[tuple[str, str]]:
    """(env name, call) of every abandoned call still running in this process."""
    with _lock:
        _stuck[:] = [s for s in _stuck if s[0].thread.is_alive()]
        return [(env, call) for _, env, call in _stuck]


def _abandon(worker: _Worker, env: str, call: str) -> int:
    """Mark ``worker`` stuck; the number of abandoned calls still running."""
    worker.abandoned = True
    worker.calls.put(None)  # ends it as soon as its call returns, should that ever happen
    with _lock:
        _stuck.append((worker, env, call))
        _stuck[:] = [s for s in _stuck if s[0].thread.is_alive()]
        return len(_stuck)


# -- the guard -------------------------------------------------------------------------------------
class Guard:
    """One rollout's episodes of ``env``: ``open`` each, call them through the ``GuardedEpisode``
    it returns, and leave the ``with`` block (or ``close``) to hand their workers back."""

    def __init__(self, env: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_obs_bytes: int = obs_byte_cap(256), max_prompt_bytes: int | None = None):
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
            raise ValueError(f"env_step_timeout={timeout_s!r}: must be a number of seconds > 0")
        if not (isinstance(max_obs_bytes, int) and max_obs_bytes >= 1):
            raise ValueError(f"max_obs_bytes={max_obs_bytes!r}: must be a whole number >= 1")
        self.env, self.name = env, env_name(env)
        # the most a lock wait takes (about 292 years): a larger deadline would overflow it
        self.timeout_s = min(float(timeout_s), threading.TIMEOUT_MAX)
        self.max_obs_bytes = max_obs_bytes
        self.max_prompt_bytes = max_prompt_bytes
        """The cap on ``reset()``'s text (None: none); a prompt that long ends its trajectory
        as context_full anyway, the cap only keeps it from being tokenised whole."""
        self._open: list[GuardedEpisode] = []

    def open(self, task, seed: int) -> "GuardedEpisode":
        """``env.episode(task, seed)``, made on the episode's own worker. EnvError if it fails."""
        episode = GuardedEpisode(self, _take())
        self._open.append(episode)
        episode.inner = episode.call("episode", lambda: self.env.episode(task, seed=seed))
        return episode

    def is_answer(self, action: str) -> bool:
        """``env.is_answer(action)``, in this thread (the env's, not an episode's: no worker);
        EnvError if it raises."""
        try:
            return bool(self.env.is_answer(action))
        except Exception as exc:
            raise EnvError(self.name, "is_answer", f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        for episode in self._open:
            episode.close()
        self._open.clear()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GuardedEpisode:
    """An episode whose every call runs on its worker with the guard's deadline. After a call
    was abandoned, every later one fails at once (the worker is still busy with it)."""

    def __init__(self, guard: Guard, worker: _Worker):
        self.guard, self.worker, self.inner = guard, worker, None
        self.prompt_cut_bytes = 0
        """Bytes ``reset()``'s text lost to the guard's ``max_prompt_bytes``."""
        self.broken: str | None = None
        """Why the episode can take no more calls (its worker was abandoned), or None."""

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the worker, waited for at most the deadline; EnvError naming ``what``."""
        g = self.guard
        if self.broken is not None:
            raise EnvError(g.name, what, f"not called: {self.broken}")
        future = self.worker.submit(fn)
        try:
            exc = future.exception(timeout=g.timeout_s)  # the caller's Ctrl-C still propagates
        except TimeoutError:
            self.broken = f"{what} did not return within {g.timeout_s:g} s"
            stuck = _abandon(self.worker, g.name, what)
            if stuck >= MAX_STUCK:
                raise EnvStuck(
                    f"environment {g.name}: {stuck} calls into it are still running past their "
                    f"{g.timeout_s:g} s deadline (--env-step-timeout; this one: {what}) in threads "
                    "that cannot be stopped; the run stops here rather than pile up more. "
                    f"Fix what blocks in {g.name}, or give it a longer --env-step-timeout."
                ) from None
            raise EnvError(g.name, what, f"TimeoutError: {what} did not return within the "
                           f"{g.timeout_s:g} s deadline (--env-step-timeout); abandoned, its "
                           "thread is left running") from None
        if exc is not None:
            raise EnvError(g.name, what, f"{type(exc).__name__}: {exc}") from exc
        return future.result()

    def reset(self) -> str:
        first = self.call("reset", self.inner.reset)
        if not isinstance(first, str):
            raise EnvError(self.guard.name, "reset", f"returned {type(first).__name__}, not text")
        if self.guard.max_prompt_bytes is not None:
            first, self.prompt_cut_bytes = cut_utf8(first, self.guard.max_prompt_bytes)
        return first

    def state_key(self) -> str | None:
        """The inner episode's ``state_key()``, None when it has none."""
        key_of = getattr(self.inner, "state_key", None)
        return self.call("state_key", key_of) if callable(key_of) else None

    @property
    def renders(self) -> bool:
        """The inner episode offers ``render()`` (core/envs/render.py)."""
        return callable(getattr(self.inner, "render", None))

    def render(self):
        """``render()`` as the episode returned it (unchecked: core/envs/render.py checks it).
        Like every call, one past the deadline leaves the episode unable to take another."""
        return self.call("render", self.inner.render)

    def step(self, action: str) -> StepResult:
        """``step(action)``, checked (module docstring) and its observation cut to the cap."""
        result = self.call("step", lambda: self.inner.step(action))
        checked = checked_step(result, self.guard.max_obs_bytes)
        if isinstance(checked, str):
            raise EnvError(self.guard.name, "step", checked)
        return checked

    def outcome(self) -> Outcome:
        """``outcome()``, checked (module docstring)."""
        out = checked_outcome(self.call("outcome", self.inner.outcome))
        if isinstance(out, str):
            raise EnvError(self.guard.name, "outcome", out)
        return out

    def close(self) -> None:
        """Hand the worker back (unless it was abandoned); the episode takes no more calls."""
        if self.broken is None:
            self.broken = "the episode was closed"
            _give_back(self.worker)


# -- checks (pure) ---------------------------------------------------------------------------------
def finite_real(value: Any) -> float | None:
    """``float(value)`` for a finite real number (bool, int, float, NumPy's scalars: anything
    ``numbers.Real``), else None (NaN, inf, text, None, ...)."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):  # an int beyond any double
        return None
    return number if math.isfinite(number) else None


def checked_step(result: Any, max_obs_bytes: int) -> StepResult | str:
    """A copy of ``result`` with the observation cut to ``max_obs_bytes`` (the cut in its info
    under ``CUT_KEY``) and the reward as a float; or the reason it is unusable."""
    if not isinstance(result, StepResult):
        return f"step returned {type(result).__name__}, not a StepResult"
    if not isinstance(result.observation, str):
        return (f"step returned an observation of type {type(result.observation).__name__}, "
                "not text")
    reward = finite_real(result.reward)
    if reward is None:
        return f"step returned reward={result.reward!r:.80}: not a finite real number"
    if not isinstance(result.info, dict):
        return f"step returned info of type {type(result.info).__name__}, not a dict"
    kept, cut = cut_utf8(result.observation, max_obs_bytes)
    try:
        kept.encode("utf-8")  # lone surrogates would break the tokenizer and the store
    except UnicodeEncodeError as exc:
        return f"step returned an observation that is not valid text: {exc}"
    info = {**result.info, CUT_KEY: cut} if cut else dict(result.info)
    return dataclasses.replace(result, observation=kept, reward=reward, info=info)


def checked_outcome(out: Any) -> Outcome | str:
    """A copy of ``out`` with ``score``/``process`` as floats and ``success`` a bool; or the
    reason it is unusable (a NaN or wrong-typed score would poison the step's advantages)."""
    if not isinstance(out, Outcome):
        return f"outcome returned {type(out).__name__}, not an Outcome"
    score, process = finite_real(out.score), finite_real(out.process)
    if score is None:
        return f"outcome returned score={out.score!r:.80}: not a finite real number"
    if process is None:
        return f"outcome returned process={out.process!r:.80}: not a finite real number"
    success = out.success
    numpy_bool = type(success).__module__ == "numpy" and type(success).__name__ in ("bool", "bool_")
    if not (isinstance(success, bool) or numpy_bool):
        return f"outcome returned success={success!r:.80}: not a bool"
    if out.answer is not None and not isinstance(out.answer, str):
        return f"outcome returned answer of type {type(out.answer).__name__}, not text or None"
    if not isinstance(out.info, dict):
        return f"outcome returned info of type {type(out.info).__name__}, not a dict"
    return dataclasses.replace(out, score=score, process=process, success=bool(success))


def cut_utf8(text: str, max_bytes: int) -> tuple[str, int]:
    """(the longest prefix of ``text`` whose UTF-8 is at most ``max_bytes`` bytes, the bytes cut).

    Never encodes more than ``max_bytes`` characters at once: a UTF-8 character is 1 to 4 bytes,
    so the first ``max_bytes`` characters hold every character that can be kept, and text of at
    most ``max_bytes // 4`` characters fits whole. A character the cut would split is dropped.
    Lone surrogates are measured as 3 bytes (``surrogatepass``) and kept for the caller to see.
    """
    if len(text) <= max_bytes // 4:
        return text, 0
    head = text[:max_bytes].encode("utf-8", "surrogatepass")
    if len(head) <= max_bytes and len(text) <= max_bytes:
        return text, 0
    end = min(max_bytes, len(head))
    while end < len(head) and end > 0 and (head[end] & 0xC0) == 0x80:  # inside a character
        end -= 1
    kept = head[:end].decode("utf-8", "surrogatepass")
    return kept, utf8_len(text) - end


def utf8_len(text: str, chunk: int = 1 << 20) -> int:
    """len(text.encode("utf-8", "surrogatepass")) without holding the whole encoding at once."""
    if text.isascii():  # O(1) in CPython: one byte per character
        return len(text)
    return sum(len(text[i:i + chunk].encode("utf-8", "surrogatepass"))
               for i in range(0, len(text), chunk))
