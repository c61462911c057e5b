"""Record a TRL ``GRPOTrainer`` run into a store while it trains: one line in the user's script.

    from storage.integrations.trl import RecorderCallback
    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...)
    trainer.add_callback(RecorderCallback("runs/trl.duckdb", run_name="my grpo run"))
    trainer.train()

Written against TRL 1.16.0 (requirements-trl.txt); TRL itself is optional, this module needs only
``transformers``. Each optimizer step becomes one recorded step (TRL's ``state.global_step``, the
step its own ``completions_*.parquet`` logs carry), written in one transaction:

* ``trajectories``: every completion of the step's generation batch; a prompt's G completions
  are a group (``s{step}-g{k}``), exactly the rows TRL normalises rewards over. ``advantage`` is
  TRL's, ``reward`` the weighted sum of the reward functions (NaN ones skipped, +-inf kept, as
  TRL's ``nansum`` does; a group holding one is noted and counted: trl_rows.flag_nonfinite).
  ``success`` is ``outcome >= 1`` (the same inference as the TRL importer, storage/ingest/dumps.py).
* ``rewards``: each reward function's raw value under its own name, plus the four contract
  components. A function whose name says what it is (``format_reward`` -> ``format``,
  ``accuracy_reward`` -> ``outcome``; storage.ingest.dumps.standard_component) fills that component with
  its weighted value; ``outcome`` is otherwise the weighted sum of the functions no name maps,
  so outcome + format + cost + process is the reward TRL trained on.
* ``turns``: a text completion is one turn; chat completions give one turn per assistant message
  (tool results are observations, storage.ingest.dumps.chat_turns). A turn followed by an observation
  is a ``tool`` action, the last one the ``answer`` (also the trajectory's ``answer`` unless the
  completion was cut at ``max_completion_length``).
* ``tokens``: prompt tokens (role ``prompt``) and completion tokens (``action``; tool-result
  tokens inside a multi-turn completion are ``observation``) with the ids TRL generated, the loss
  mask TRL applied (``completion_mask`` x ``tool_mask``, truncated completions masked when
  ``mask_truncated_completions``), TRL's advantage on trained tokens, ``ref_logprob`` when
  ``beta`` > 0, and ``logprob``/``entropy``. ``logprob`` is the sampling policy's: vLLM's own
  when TRL gets them, else TRL's old-policy logprobs when it computes them, else the logprobs
  TRL's loss computes on its first pass over the sample, which on-policy (``num_iterations`` 1,
  the default) are the sampling policy's (the weights have not moved since generation).
* ``metrics``: reward/mean, reward/std, reward/group_std_mean, reward/frac_zero_std,
  success/rate, response/length_mean and env/turns_mean from the recorded rows; TRL's logged
  metrics under our names (``METRIC_NAMES``: kl -> policy/kl, entropy -> policy/entropy,
  clip_ratio/region_mean -> policy/clipfrac, grad_norm -> grad/norm, ...) and every numeric one
  also as ``trl/<its name>``; ``reward/nonfinite_count``; ``time/record_s``, the time the
  callback took from the training loop in the previous step, and ``time/record_write_s``, that
  step's database write.

The database write runs on one writer thread, so TRL's next step does not wait for it (DuckDB
works without holding the GIL): measured on an H200 (bench/README.md), recording on the training
thread would have cost 23% of a tiny model's 0.38 s step. Steps are written in order, each in one
transaction; at most ``QUEUE_STEPS`` wait (then the loop waits: memory stays bounded). A write
that fails is raised on the training thread at the next step (or at the end of training).

How it sees what TRL does not hand to callbacks. A ``TrainerCallback`` gets the model and
tokenizer, not the trainer, so on ``on_train_begin`` the callback finds the trainer that calls
it (the caller frame whose ``callback_handler`` holds this callback) and wraps three of its
methods on that instance only: ``_generate_and_score_completions`` (token ids, masks,
advantages, reference logprobs; the texts and per-function rewards TRL just put in ``_logs``),
``_compute_loss`` and ``_get_per_token_logps_and_entropies`` (the policy's per-token logprobs
and entropies). An index column added to the generation batch follows each row through TRL's
shuffle and split, so the loss-time values land on the right completion. Only the main process
records; in a multi-process run the other processes' completions are recorded from TRL's
gathered texts and rewards, their tokens re-tokenized without logprobs. Evaluation batches are
not recorded.

The run is ``running`` while TRL trains and ``finished`` at ``on_train_end``. A run that ends
otherwise is marked on its way out (storage/integrations/trl_end.py): ``failed`` with the
exception that ended it (type, message, step, innermost frames), ``stopped`` for Ctrl-C or
SIGTERM (the process still dies of the signal); only SIGKILL-like deaths leave it ``running``,
which the app shows as ``interrupted`` once it is silent. ``with callback.recording():
trainer.train()`` marks it the moment the exception leaves the block (a notebook goes on).
"""
from __future__ import annotations

import contextlib
import inspect
import math
import queue
import threading
import time

from transformers import TrainerCallback

from storage.integrations.trl_end import RunEnd
from storage.integrations.trl_rows import (Batch, StepRows, derived_metrics, reward_components,
                                           run_config)
from storage.recorder import Recorder

__all__ = ["RecorderCallback", "reward_components"]

METRIC_NAMES = {"reward": "reward/mean", "reward_std": "reward/std",
                "frac_reward_zero_std": "reward/frac_zero_std", "kl": "policy/kl",
                "entropy": "policy/entropy", "clip_ratio/region_mean": "policy/clipfrac",
                "clip_ratio/low_mean": "policy/clipfrac_low",
                "clip_ratio/high_mean": "policy/clipfrac_high", "grad_norm": "grad/norm",
                "completions/mean_length": "response/length_mean", "loss": "policy/loss",
                "learning_rate": "optim/lr", "step_time": "time/step_s",
                # with vLLM, TRL measures the sampler-trainer gap itself: mean |old - sampling
                # logprob| over completion tokens is our mismatch/abs_mean (core/learn/mismatch.py)
                "sampling/sampling_logp_difference/mean": "mismatch/abs_mean"}
INDEX_KEY = "_recorder_index"
QUEUE_STEPS = 2


def _rows(t) -> list[list] | None:
    """A (B, T) tensor as B Python lists (None stays None)."""
    if t is None:
        return None
    return t.detach().float().cpu().tolist() if t.is_floating_point() else t.detach().cpu().tolist()


class RecorderCallback(TrainerCallback):
    """Records a TRL ``GRPOTrainer`` run into the store at ``db_path`` (module docstring)."""

    def __init__(self, db_path, run_name: str | None = None):
        self.recorder = Recorder(db_path)  # a foreign or newer file is refused here, not mid-run
        self.run_name = run_name
        self.trainer = None
        self.run_id: str | None = None
        self._batches: list[Batch] = []
        self._by_index: dict[int, Batch] = {}
        self._next_index = 0
        self._current: list[int] | None = None
        self._held: tuple[int, dict] | None = None   # a step waiting for this step's on_log
        self._cost_s = 0.0                            # this step's recording work so far
        self.record_s: list[float] = []               # per recorded step (bench/trl_record.py)
        self.write_s: list[float] = []                # the writer thread's time per write
        self._step = 0                                # the last step TRL ended
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_STEPS)
        self._queued = 0                              # steps handed to the writer (main thread)
        self._written = 0                             # steps it is done with (writer thread)
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        self._rows = StepRows()
        self._end = RunEnd(self._mark_end, lambda: self._step + 1)

    @contextlib.contextmanager
    def recording(self):
        """``with callback.recording(): trainer.train()``: an exception leaving the block marks
        the run ``failed`` (``stopped`` for Ctrl-C) at once, not when the process exits, for
        processes that go on after an error (a notebook, a sweep catching errors)."""
        try:
            yield self
        except BaseException as exc:
            if self.run_id is not None:
                self._end.end(exc)
            raise

    # -- wiring ----------------------------------------------------------------------------------
    def attach(self, trainer) -> "RecorderCallback":
        """Wrap the trainer's methods (done by ``on_train_begin``; call it yourself only if the
        callback cannot find its trainer, e.g. when an outside loop calls the events)."""
        for name in ("_generate_and_score_completions", "_compute_loss",
                     "_get_per_token_logps_and_entropies"):
            if not callable(getattr(trainer, name, None)):
                raise TypeError(f"RecorderCallback records TRL GRPOTrainer runs (TRL 1.16); "
                                f"{type(trainer).__name__} has no {name}()")
        if self.trainer is trainer:
            return self
        self.trainer = trainer
        generate, loss = trainer._generate_and_score_completions, trainer._compute_loss
        logps = trainer._get_per_token_logps_and_entropies

        def generate_and_score(inputs):
            try:  # no cost unless it raises (zero-cost try in CPython 3.11)
                output = generate(inputs)
            except BaseException as exc:  # e.g. a reward function's: the run's reason if fatal
                self._end.seen = exc
                raise
            if trainer.model.training:
                t0 = time.perf_counter()
                self._capture(output)
                self._cost_s += time.perf_counter() - t0
            return output

        def compute_loss(model, inputs):
            index = inputs.get(INDEX_KEY)
            self._current = index.tolist() if index is not None else None
            try:
                return loss(model, {k: v for k, v in inputs.items() if k != INDEX_KEY})
            except BaseException as exc:
                self._end.seen = exc
                raise
            finally:
                self._current = None

        def logps_and_entropies(*args, **kwargs):
            result = logps(*args, **kwargs)
            if self._current is not None and kwargs.get("compute_entropy"):
                t0 = time.perf_counter()
                self._capture_policy(self._current, result[0], result[1])
                self._current = None  # later calls of this loss pass are not the policy's
                self._cost_s += time.perf_counter() - t0
            return result

        trainer._generate_and_score_completions = generate_and_score
        trainer._compute_loss = compute_loss
        trainer._get_per_token_logps_and_entropies = logps_and_entropies
        return self

    def _find_trainer(self):
        frame = inspect.currentframe()
        while frame is not None:
            obj = frame.f_locals.get("self")
            handler = getattr(obj, "callback_handler", None)
            if handler is not None and self in getattr(handler, "callbacks", ()):
                return obj
            frame = frame.f_back
        return None

    # -- capture -----------------------------------------------------------------------------------
    def _capture(self, output: dict) -> None:
        trainer = self.trainer
        logs = trainer._logs  # TRL put exactly this generation batch's gathered rows there
        n_local = output["completion_ids"].size(0)
        n_all = n_local * trainer.accelerator.num_processes  # TRL gathers every process's rows
        prompts, completions = list(logs["prompt"])[-n_all:], list(logs["completion"])[-n_all:]
        rewards = {k: list(v)[-n_all:] for k, v in logs["rewards"].items()}
        advantages = list(logs["advantages"])[-n_all:]
        completion_mask = output["completion_mask"]
        tool_mask = output.get("tool_mask")
        loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask
        ids = _rows(output["completion_ids"])
        lengths = self._lengths(ids, _rows(completion_mask))
        eos = set(getattr(trainer, "eos_token_ids", None) or [])
        prompt_ids = [[t for t, m in zip(row, mask) if m]
                      for row, mask in zip(_rows(output["prompt_ids"]), _rows(output["prompt_mask"]))]
        sampling = output.get("sampling_per_token_logps")
        if sampling is None:
            sampling = output.get("old_per_token_logps")
        batch = Batch(
            prompts=prompts, completions=completions, rewards=rewards, advantages=advantages,
            local_start=trainer.accelerator.process_index * n_local, prompt_ids=prompt_ids,
            completion_ids=[row[:n] for row, n in zip(ids, lengths)],
            loss_mask=[row[:n] for row, n in zip(_rows(loss_mask), lengths)],
            tool_mask=None if tool_mask is None else
            [row[:n] for row, n in zip(_rows(tool_mask), lengths)],
            truncated=[not row[:n] or row[n - 1] not in eos for row, n in zip(ids, lengths)],
            sampling_logps=_rows(sampling), ref_logps=_rows(output.get("ref_per_token_logps")),
            index_base=self._next_index)
        # deferred: torch, only when a model runs (importing this module stays torch-free)
        import torch
        output[INDEX_KEY] = torch.arange(self._next_index, self._next_index + n_local)
        for i in range(n_local):
            self._by_index[self._next_index + i] = batch
        self._next_index += n_local
        self._batches.append(batch)

    def _lengths(self, ids: list[list[int]], mask: list[list[int]]) -> list[int]:
        """Each completion's length: its mask's extent, or (a truncated completion TRL masked
        whole) up to the trailing padding."""
        pad = getattr(getattr(self.trainer, "_tokenizer", None), "pad_token_id", None)
        out = []
        for row, m in zip(ids, mask):
            n = max((i + 1 for i, v in enumerate(m) if v), default=0)
            if n == 0:
                n = len(row)
                while n and row[n - 1] == pad:
                    n -= 1
            out.append(n)
        return out

    def _capture_policy(self, index: list[int], logps, entropies) -> None:
        logps, entropies = _rows(logps), _rows(entropies)
        for k, gi in enumerate(index):
            batch = self._by_index.get(gi)
            if batch is not None and gi not in batch.policy:  # the first pass is on-policy
                batch.policy[gi] = (logps[k], entropies[k] if entropies is not None else None)

    # -- events ----------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = self._find_trainer()
            if trainer is None:
                raise RuntimeError("RecorderCallback could not find the trainer calling it; "
                                   "call callback.attach(trainer) before trainer.train()")
            self.attach(trainer)
        if not state.is_world_process_zero or self.run_id is not None:
            return
        self.run_id = self.recorder.start_run(run_config(self.trainer, args, kwargs.get("model")),
                                              name=self.run_name, source="trl")
        self._end.arm()

    def on_step_end(self, args, state, control, **kwargs):
        t0 = time.perf_counter()
        if not state.is_world_process_zero or self.run_id is None:
            self._batches.clear()
            return
        if self._held is not None:  # the previous step's on_log never came
            self._write(*self._held, {})
        self._held = (state.global_step, self._step_tables(state.global_step))
        self._step = state.global_step
        self._cost_s += time.perf_counter() - t0
        if not control.should_log:  # no on_log for this step: write it now
            self._write(*self._held, {})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run_id is None or not state.is_world_process_zero:
            return
        logs = logs or {}
        if self._held is not None and self._held[0] == state.global_step:
            self._write(*self._held, logs)
        elif any(k in logs for k in METRIC_NAMES):  # e.g. a summary after the last step
            self._write(state.global_step, {}, logs)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run_id is None or not state.is_world_process_zero or self._end.ended:
            return
        self._end.finishing = True  # a SIGTERM now waits until the status is written
        try:
            if self._held is not None:
                self._write(*self._held, {})
            self._drain()
            reason = self._end.stop_reason()  # a SIGTERM handler of theirs stopped training
            self.recorder.finish("finished" if reason is None else "stopped", reason)
            self._end.ended = True
        finally:
            self._end.finishing = False
            if self._end.ended:
                self._end.disarm()

    def _mark_end(self, status: str, reason: str, drain_s: float) -> None:
        """RunEnd's way to end the run: the queued steps and the held one written (within
        ``drain_s``), then the status. Safe inside a signal handler: it takes none of the
        queue's locks, which the interrupted main thread may hold."""
        deadline = time.monotonic() + drain_s
        while (self._writer is not None and self._writer.is_alive()
               and self._written < self._queued and time.monotonic() < deadline):
            time.sleep(0.01)
        held, self._held = self._held, None
        if held is not None and self._write_error is None and self._written >= self._queued:
            try:  # a whole step whose TRL logs never came: keep it
                step, tables = held
                self.recorder.record_step(step, metrics=self._metrics(tables, {}),
                                          **{k: v for k, v in tables.items() if v})
            except Exception:
                pass  # the status below matters more
        self.recorder.finish(status, reason)

    # -- the writer thread ---------------------------------------------------------------------
    def _drain(self, timeout: float | None = None) -> None:
        """Wait until every queued step is written; raise a write's error here."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout)
            self._writer = None
        self._raise_write_error()

    def _raise_write_error(self) -> None:
        if self._write_error is not None:
            error, self._write_error = self._write_error, None
            raise RuntimeError(f"RecorderCallback could not write a step to "
                               f"{self.recorder.path}: {type(error).__name__}: {error}") from error

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            step, metrics, tables = item
            t0 = time.perf_counter()
            try:
                if self._write_error is None:  # after a failure nothing later is written
                    self.recorder.record_step(step, metrics=metrics, **tables)
            except BaseException as exc:
                self._write_error = exc
            self.write_s.append(time.perf_counter() - t0)
            self._written += 1

    # -- rows ----------------------------------------------------------------------------------
    def _step_tables(self, step: int) -> dict:
        batches, self._batches = self._batches, []
        for batch in batches:
            for gi in range(batch.index_base, batch.index_base + len(batch.completion_ids)):
                self._by_index.pop(gi, None)
        return self._rows.tables(batches, step, self.trainer)

    def _metrics(self, tables: dict, logs: dict) -> dict:
        metrics = derived_metrics(tables.get("trajectories", []))
        for key, value in logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                metrics[f"trl/{key}"] = float(value)
                if key in METRIC_NAMES:
                    metrics[METRIC_NAMES[key]] = float(value)
        if tables:
            metrics["time/record_s"] = self.record_s[-1] if self.record_s else 0.0
            if self.write_s:
                metrics["time/record_write_s"] = self.write_s[-1]
        return metrics

    def _write(self, step: int, tables: dict, logs: dict) -> None:
        t0 = time.perf_counter()
        metrics = self._metrics(tables, logs)
        self._raise_write_error()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="trl-recorder",
                                            daemon=True)
            self._writer.start()
        if self._held is not None and self._held[0] == step:
            self._held = None
        self._queue.put((step, metrics, {k: v for k, v in tables.items() if v}))
        self._queued += 1
        if tables:
            self._cost_s += time.perf_counter() - t0
            self.record_s.append(self._cost_s)
            self._cost_s = 0.0
