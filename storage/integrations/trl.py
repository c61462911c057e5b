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
  TRL's, ``reward`` the weighted sum of the reward functions (NaN ones skipped, as TRL does).
  ``success`` is ``outcome >= 1`` (the same inference as the TRL importer, storage/dumps.py).
* ``rewards``: each reward function's raw value under its own name, plus the four contract
  components. A function whose name says what it is (``format_reward`` -> ``format``,
  ``accuracy_reward`` -> ``outcome``; storage.dumps.standard_component) fills that component with
  its weighted value; ``outcome`` is otherwise the weighted sum of the functions no name maps,
  so outcome + format + cost + process is the reward TRL trained on.
* ``turns``: a text completion is one turn; chat completions give one turn per assistant message
  (tool results are observations, storage.dumps.chat_turns). A turn followed by an observation
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
  also as ``trl/<its name>``; ``time/record_s``, the time the callback took from the training
  loop in the previous step, and ``time/record_write_s``, that step's database write.

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

The run is ``running`` while TRL trains and ``finished`` at ``on_train_end``; a process that
exits before (a crash, Ctrl-C) marks it ``failed`` with that reason on its way out.
"""
from __future__ import annotations

import atexit
import inspect
import math
import queue
import threading
import time

from transformers import TrainerCallback

from storage.integrations.trl_rows import Batch, StepRows, derived_metrics, reward_components
from storage.recorder import Recorder

__all__ = ["RecorderCallback", "reward_components"]

METRIC_NAMES = {"reward": "reward/mean", "reward_std": "reward/std",
                "frac_reward_zero_std": "reward/frac_zero_std", "kl": "policy/kl",
                "entropy": "policy/entropy", "clip_ratio/region_mean": "policy/clipfrac",
                "clip_ratio/low_mean": "policy/clipfrac_low",
                "clip_ratio/high_mean": "policy/clipfrac_high", "grad_norm": "grad/norm",
                "completions/mean_length": "response/length_mean", "loss": "policy/loss",
                "learning_rate": "optim/lr", "step_time": "time/step_s"}
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
        self._done = False
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_STEPS)
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        self._rows = StepRows()

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
            output = generate(inputs)
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
        self.run_id = self.recorder.start_run(self._config(args, kwargs.get("model")),
                                              name=self.run_name, source="trl")
        atexit.register(self._at_exit)

    def on_step_end(self, args, state, control, **kwargs):
        t0 = time.perf_counter()
        if not state.is_world_process_zero or self.run_id is None:
            self._batches.clear()
            return
        if self._held is not None:  # the previous step's on_log never came
            self._write(*self._held, {})
        self._held = (state.global_step, self._step_tables(state.global_step))
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
        if self.run_id is None or not state.is_world_process_zero:
            return
        if self._held is not None:
            self._write(*self._held, {})
        self._drain()
        self.recorder.finish("finished")
        self._done = True
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        if not self._done and self.run_id is not None:
            try:
                self._drain(timeout=30.0)
            except BaseException:
                pass  # the run is marked failed below either way
            try:
                self.recorder.finish("failed", "the training process ended before TRL's "
                                               "on_train_end (crash or interrupt)")
            except Exception:
                pass

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

    # -- rows ----------------------------------------------------------------------------------
    def _config(self, args, model) -> dict:
        trainer = self.trainer
        config = getattr(model, "config", None)
        names = list(getattr(trainer, "reward_func_names", []))
        weights = getattr(trainer, "reward_weights", None)
        try:
            import trl
            version = trl.__version__
        except ImportError:
            version = None
        keep = ("num_generations", "beta", "learning_rate", "temperature", "top_p", "top_k",
                "max_completion_length", "loss_type", "scale_rewards", "epsilon", "epsilon_high",
                "num_iterations", "per_device_train_batch_size", "gradient_accumulation_steps",
                "steps_per_generation", "max_steps", "seed", "use_vllm",
                "mask_truncated_completions")
        return {"env": "trl", "model": getattr(config, "_name_or_path", None)
                or type(model).__name__, "algo": getattr(args, "loss_type", None) or "grpo",
                "trainer": "trl.GRPOTrainer", "trl_version": version,
                "reward_funcs": names,
                "reward_weights": weights.tolist() if weights is not None else None,
                **{k: getattr(args, k, None) for k in keep}}
    def _step_tables(self, step: int) -> dict:
        batches, self._batches = self._batches, []
        for batch in batches:
            for gi in range(batch.index_base, batch.index_base + len(batch.completion_ids)):
                self._by_index.pop(gi, None)
        return self._rows.tables(batches, step, self.trainer)

    def _write(self, step: int, tables: dict, logs: dict) -> None:
        t0 = time.perf_counter()
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
        self._raise_write_error()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="trl-recorder",
                                            daemon=True)
            self._writer.start()
        self._queue.put((step, metrics, {k: v for k, v in tables.items() if v}))
        if self._held is not None and self._held[0] == step:
            self._held = None
        if tables:
            self._cost_s += time.perf_counter() - t0
            self.record_s.append(self._cost_s)
            self._cost_s = 0.0
