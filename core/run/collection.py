"""Collect and evaluate with an OpenAI-compatible server as the policy (``--model openai:URL``).

    python -m core.train --env search --model openai:http://127.0.0.1:8000/v1 --model-name NAME \\
        --steps 3 --group-size 4 --tasks-per-step 2 --db runs/endpoint.duckdb

Nothing is trained. ``--steps N`` is N collection rounds: each draws ``tasks_per_step`` train tasks
(the trainer's schedule, core/run/schedule.py) and plays ``group_size`` episodes of each, recorded
with split ``collect`` as step 1..N; held-out evaluation (split ``eval``, metric ``eval/success``)
runs at step 0 and then as for training (``eval_every``, and at the end). Flags that only training
reads (``--algo``, learning rates, LoRA, SFT, ``--resume``, ...) are refused (``check``).

One episode: the env's system prompt and first message, then per turn one chat completion (the
conversation so far, the env's stop tags as ``stop``) -> the action (with its stop tag restored,
core/endpoint/client.py) -> ``env.step`` -> the observation as the next user message (an ``inline``
env's observation too: the chat protocol has no way to continue the model's own message). The
episodes' requests run concurrently on ``endpoint_concurrency`` threads; the environments are
stepped one call at a time, as in our own rollouts, through the same guard (core/envs/guard.py:
a deadline per call, observations cut by bytes, results checked; a failure ends the trajectory
as ``env_error``, the error in ``trajectories.info.env_error``).

The record is the trainer's (core/run/step_rows.py), a transaction per step: prompt and observation
text as whitespace-led pieces without token ids, each action as the server's own tokens with the
logprob it reported (``tokens.logprob``; the rest as pieces without one), ``trained`` false
everywhere (no update used them). ``turns.info.endpoint`` keeps each request's latency,
attempts, finish reason, usage and (``endpoint_top_logprobs``) the top alternatives. A request that
fails for good ends its trajectory only: finish reason ``endpoint_error``, the error in
``trajectories.info.endpoint_error``; the run goes on. 401/403/404 stop the run ('failed').
"""
from __future__ import annotations

import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from tqdm import tqdm

from core.config import ConfigError, Environments, TrainConfig
from core.credit.scoring import score_all
from core.endpoint.client import (PREFIX, ChatClient, EndpointError, EndpointRefused, Reply,
                                  action_pieces, api_key, pieces, restore_stop)
from core.envs.guard import CUT_KEY, EnvError
from core.rollout.diagnostics import rollout_metrics
from core.rollout.episode import (Opened, end_reason, execute, final_reason, grade, open_episodes,
                                  record_render, step_failed)
from core.rollout.sampling import Sampling
from core.rollout.trajectory import Trajectory, Turn
from core.run.lifecycle import record_and_exit, stop_on_sigint
from core.run.step_rows import step_tables
from core.run.schedule import Schedule, eval_sampling_seed
from storage.recorder import Recorder

FINISH = "endpoint_error"
SPLIT = "collect"
TRAINING_FIELDS = (
    "algo", "sft_steps", "resume", "init_from", "lr", "sft_lr", "sft_batch_size", "kl_coef",
    "kl_reference", "clip_eps_low", "clip_eps_high", "clip_mode", "dual_clip", "loss_agg", "ppo_epochs",
    "minibatches", "max_grad_norm", "min_abs_advantage", "starpo_keep", "gigpo_weight",
    "gigpo_gamma", "gamma", "lam", "vf_coef", "kl_abort", "max_bad_steps", "lora_rank",
    "lora_alpha", "lora_dropout", "lora_targets", "sft_env_options", "checkpoint_every",
    "checkpoint_dir", "rl_moments", "adapter_every")
"""Flags only training reads: given with an endpoint policy, they are refused."""


def check(cfg: TrainConfig, given: set[str] = frozenset()) -> None:
    """ConfigError naming the first flag an endpoint run cannot honour."""
    for name in TRAINING_FIELDS:
        if name in given:
            raise ConfigError(f"{name}: an endpoint policy (--model {PREFIX}URL) collects and "
                              "evaluates, it does not train; drop --" + name.replace("_", "-"))
    if cfg.sft_steps:
        raise ConfigError(f"sft_steps={cfg.sft_steps}: an endpoint policy does not train")
    if cfg.resume:
        raise ConfigError(f"resume={cfg.resume!r}: an endpoint run cannot be resumed; start a "
                          "new one (rounds are recorded as they finish)")


@dataclass
class _Episode:
    traj: Trajectory
    episode: object
    messages: list[dict]
    state_key: str | None
    turn: int = 0
    done: bool = False
    stats: dict = field(default_factory=lambda: {"requests": 0, "retries": 0, "latency_s": 0.0,
                                                 "completion_tokens": 0})


def client_from_config(cfg: TrainConfig) -> ChatClient:
    return ChatClient(cfg.model[len(PREFIX):], cfg.model_name, api_key(),
                      timeout=cfg.endpoint_timeout, retries=cfg.endpoint_retries,
                      backoff=cfg.endpoint_backoff, logprobs=cfg.endpoint_logprobs,
                      top_logprobs=cfg.endpoint_top_logprobs)


def collect(cfg: TrainConfig, recorder, progress: bool = True,
            client: ChatClient | None = None) -> str:
    """Record one endpoint run (rounds and evaluations, module docstring); return its run id.
    ``cfg`` is validated by whoever built it (``core.config.validate``), as for ``train``."""
    check(cfg)
    client = client or client_from_config(cfg)
    client.check()  # unreachable, or the key refused: say so before a run is started
    return _Collection(cfg, recorder, client, progress).go()


class _Collection:
    def __init__(self, cfg: TrainConfig, recorder, client: ChatClient, progress: bool):
        self.cfg, self.recorder, self.client, self.progress = cfg, recorder, client, progress
        envs = Environments(cfg)  # no SFT here: the endpoint policy is not trained
        self.env, self.eval_env = envs.train, envs.eval
        self.schedule = Schedule(cfg, self.env, self.env, self.eval_env)
        self.sampling = Sampling.from_config(cfg)
        self.eval_sampling = Sampling.from_config(cfg, eval=True)
        self.stop_requested, self.run_id = False, ""

    def go(self) -> str:
        cfg = self.cfg
        self.run_id = self.recorder.start_run(config=cfg.to_dict(), name=cfg.name or None,
                                              source="endpoint")
        status, error = "finished", None
        bar = tqdm(total=cfg.steps, disable=not self.progress, unit="round")
        try:
            with stop_on_sigint(self, "round"):  # core/run/lifecycle.py
                if self.schedule.eval_on():
                    self.write(0, *self.evaluate(0))
                for step in range(1, cfg.steps + 1):
                    trajs, metrics = self.round(step)
                    if self.schedule.eval_due(step):
                        extra, eval_metrics = self.evaluate(step)
                        trajs, metrics = trajs + extra, {**metrics, **eval_metrics}
                    self.write(step, trajs, metrics)
                    bar.update(1)
                    bar.set_postfix({"success": f"{metrics.get('success/rate', 0):.3g}",
                                     "errors": int(metrics.get("endpoint/errors", 0))})
                    if self.stop_requested:
                        status = "stopped"
                        break
        except KeyboardInterrupt:
            status = "stopped"
        except Exception as exc:
            error = f"{type(exc).__name__}: {self.client.scrub(exc)}"
            if not isinstance(exc, EndpointRefused):
                error += "\n" + self.client.scrub(traceback.format_exc(limit=8))
            self.recorder.finish("failed", error=error)
            raise
        finally:
            bar.close()
        self.recorder.finish(status)
        return self.run_id

    # -- rounds -----------------------------------------------------------------------------------
    def round(self, step: int) -> tuple[list[Trajectory], dict]:
        t0 = time.perf_counter()
        trajs = self.play(self.env, self.schedule.rl_tasks(step), self.cfg.group_size,
                          self.sampling, self.schedule.seed(step), f"s{step}", SPLIT)
        rollout_s = time.perf_counter() - t0
        metrics = {**_metrics(trajs, rollout_s), "time/rollout_s": rollout_s,
                   "time/step_s": time.perf_counter() - t0}
        return trajs, metrics

    def evaluate(self, step: int) -> tuple[list[Trajectory], dict]:
        t0 = time.perf_counter()
        trajs = self.play(self.eval_env, self.schedule.eval_tasks, 1, self.eval_sampling,
                          eval_sampling_seed(self.cfg), f"e{step}", "eval")
        m = _metrics(trajs, time.perf_counter() - t0)
        metrics = {"eval/success": m["success/rate"], "eval/reward_mean": m["reward/mean"],
                   "eval/turns_mean": m["env/turns_mean"],
                   "eval/valid_action_ratio": m["env/valid_action_ratio"],
                   "eval/tasks": float(len(trajs)), "eval/endpoint_errors": m["endpoint/errors"],
                   "time/eval_s": time.perf_counter() - t0}
        if self.progress:
            tqdm.write(f"step {step}: eval/success {metrics['eval/success']:.3f} on "
                       f"{len(trajs)} held-out tasks ({int(m['endpoint/errors'])} endpoint errors)")
        return trajs, metrics

    def write(self, step: int, trajs: list[Trajectory], metrics: dict) -> None:
        tables = step_tables(trajs)
        # Nothing was trained, so Trajectory.response_tokens (its trained tokens) is 0; the
        # column counts the action's stored pieces instead (the server's tokens where it sent them).
        tables["trajectories"]["response_tokens"] = [_action_len(t) for t in trajs]
        self.recorder.record_step(step, metrics=metrics, **tables)

    def play(self, env, tasks: list, group_size: int, sampling: Sampling, seed: int,
             prefix: str, split: str) -> list[Trajectory]:
        """``group_size`` episodes of each task, requests concurrent, env steps here."""
        with sampling.guard(env) as guard:
            eps = [_start(env, opened)
                   for opened in open_episodes(guard, tasks, group_size, seed, prefix, split)]
            self._requests(env, eps, sampling)
        trajs = [ep.traj for ep in eps]
        score_all(trajs, self.cfg)
        failed = [t for t in trajs if t.finish_reason == FINISH]
        if failed:  # said where the user looks: a wrong setting fails every episode alike
            first = failed[0].info["endpoint_error"]
            tqdm.write(f"{prefix}: {len(failed)} of {len(trajs)} episodes ended as {FINISH} "
                       f"(first: {first['kind']}"
                       + (f", HTTP {first['status']}" if first.get("status") else "")
                       + f", {first['attempts']} attempts: {first['detail'][:200]})")
        return trajs

    def _requests(self, env, eps: list[_Episode], sampling: Sampling) -> None:
        """Every episode's turns: requests concurrent, each reply acted on as it comes."""
        pending: dict = {}
        with ThreadPoolExecutor(max_workers=self.cfg.endpoint_concurrency) as pool:
            def submit(ep: _Episode) -> None:
                seed_of = ep.traj.info["episode_seed"] + ep.turn
                pending[pool.submit(self.client.complete, list(ep.messages),
                                    stop=env.stop_tags, max_tokens=sampling.max_new_tokens,
                                    temperature=sampling.temperature, top_p=sampling.top_p,
                                    seed=seed_of)] = ep
            for ep in eps:
                submit(ep)
            try:
                while pending:
                    finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                    for future in finished:
                        ep = pending.pop(future)
                        try:
                            reply = future.result()
                        except EndpointRefused:
                            raise
                        except EndpointError as exc:
                            _failed(ep, exc)
                            continue
                        if _act(ep, env, reply, sampling):
                            submit(ep)
            except BaseException:
                for future in pending:  # stop what has not started; the running ones end
                    future.cancel()
                raise


def _start(env, opened: Opened) -> _Episode:
    """The episode as chat messages, its prompt recorded as text pieces."""
    messages = ([{"role": "system", "content": env.system_prompt}] if env.system_prompt else [])
    messages.append({"role": "user", "content": opened.first})
    _append(opened.traj, [(p, None) for p in pieces("\n\n".join(m["content"] for m in messages)
                                                    + "\n\n")], "prompt", -1)
    return _Episode(opened.traj, opened.episode, messages, opened.state_key)


def _append(traj: Trajectory, rows: list[tuple[str, float | None]], role: str, turn: int) -> None:
    traj.token_ids.extend([None] * len(rows))  # not our tokenizer's ids: stored NULL
    traj.token_text.extend(text for text, _ in rows)
    traj.roles.extend([role] * len(rows))
    traj.trained.extend([False] * len(rows))
    traj.logprobs.extend(lp for _, lp in rows)
    traj.token_turn.extend([turn] * len(rows))


def _act(ep: _Episode, env, reply: Reply, sampling: Sampling) -> bool:
    """Record the reply as the turn's action, step the env; True while the episode goes on."""
    traj, turn = ep.traj, ep.turn
    final = sampling.final_answer_turn and turn == sampling.max_turns
    _count(ep, reply)
    action = restore_stop(reply.text, reply.finish_reason, env.stop_tags, reply.stop_reason)
    rows = action_pieces(action, reply.tokens)
    info = {"latency_s": round(reply.latency_s, 4), "attempts": reply.attempts,
            "finish_reason": reply.finish_reason, "usage": reply.usage,
            "restored_stop": action[len(reply.text):] or None}
    if reply.cut_chars or reply.cut_tokens:  # a server that ignored max_tokens: what was cut
        info.update(cut_chars=reply.cut_chars, cut_tokens=reply.cut_tokens)
    if reply.top:
        info["top_logprobs"] = reply.top[:len(rows)]
    t0 = time.perf_counter()
    try:
        result = execute(ep.episode, action, final, ep.state_key)
    except EnvError as exc:  # an env bug ends this trajectory, not the run
        _append(traj, rows, "action", turn)
        traj.turns.append(step_failed(traj, exc, Turn(
            turn=turn, action=action, observation="", valid=False, action_tokens=len(rows),
            action_truncated=reply.finish_reason == "length", state_key=ep.state_key,
            latency_s=time.perf_counter() - t0, info={"endpoint": info})))
        return _finish(ep, "env_error")
    obs = result.observation
    _append(traj, rows, "action", turn)
    _append(traj, [(p, None) for p in pieces(f"\n\n{obs}\n\n" if obs else "")], "observation",
            turn)
    traj.turns.append(Turn(
        turn=turn, action=action, observation=obs, valid=result.valid,
        action_type=result.action_type, parsed=result.parsed, error=result.error,
        state_diff=result.state_diff, action_truncated=reply.finish_reason == "length",
        obs_truncated=CUT_KEY in result.info,
        latency_s=time.perf_counter() - t0, step_reward=result.reward, action_tokens=len(rows),
        state_key=ep.state_key, info={**(result.info or {}), "endpoint": info}))
    record_render(traj, ep.episode, turn)
    ep.state_key = result.state_key
    if result.done:
        return _finish(ep, final_reason(end_reason(result), final))
    ep.turn += 1
    if ep.turn >= sampling.max_turns + int(sampling.final_answer_turn):
        return _finish(ep, "max_turns")
    ep.messages.append({"role": "assistant", "content": action})
    ep.messages.append({"role": "user", "content": obs})
    return True


def _count(ep: _Episode, reply: Reply) -> None:
    s = ep.stats
    s["requests"] += 1
    s["retries"] += reply.attempts - 1
    s["latency_s"] += reply.latency_s
    s["completion_tokens"] += int(reply.usage.get("completion_tokens") or 0)
    ep.traj.info["endpoint"] = s


def _failed(ep: _Episode, exc: EndpointError) -> None:
    ep.stats["requests"] += 1
    ep.stats["retries"] += exc.attempts - 1
    ep.traj.info["endpoint"] = ep.stats
    ep.traj.info["endpoint_error"] = {**exc.as_info(), "turn": ep.turn}
    _finish(ep, FINISH)


def _finish(ep: _Episode, reason: str) -> bool:
    ep.done = True
    grade(ep.traj, ep.episode, reason)
    return False


def _action_len(traj: Trajectory) -> int:
    return sum(role == "action" for role in traj.roles)


def _metrics(trajs: list[Trajectory], seconds: float) -> dict:
    m = rollout_metrics(trajs) if trajs else {
        "success/rate": 0.0, "reward/mean": 0.0, "env/turns_mean": 0.0,
        "env/valid_action_ratio": 0.0}
    n = max(len(trajs), 1)
    stats = [t.info.get("endpoint", {}) for t in trajs]
    requests = sum(s.get("requests", 0) for s in stats)
    lengths = [_action_len(t) for t in trajs]
    actions = [lp for t in trajs for lp, r in zip(t.logprobs, t.roles) if r == "action"]
    completion = sum(s.get("completion_tokens", 0) for s in stats)
    m.update({
        "response/length_mean": sum(lengths) / n,
        "response/length_max": float(max(lengths, default=0)),
        f"env/finish/{FINISH}": sum(t.finish_reason == FINISH for t in trajs) / n,
        "endpoint/errors": float(sum(t.finish_reason == FINISH for t in trajs)),
        "endpoint/requests": float(requests),
        "endpoint/retries": float(sum(s.get("retries", 0) for s in stats)),
        "endpoint/latency_mean_s": sum(s.get("latency_s", 0.0) for s in stats) / max(requests, 1),
        "endpoint/completion_tokens": float(completion),
        "endpoint/logprob_coverage": (sum(lp is not None for lp in actions) / len(actions)
                                      if actions else 0.0),
        "perf/tokens_per_s": completion / max(seconds, 1e-9),
    })
    return m


def main(cfg: TrainConfig, args, ranks=None) -> int:
    """``python -m core.train``'s path for ``--model openai:URL``: its exit statuses (0 recorded,
    2 bad configuration or store, 1 the run failed, e.g. the endpoint refused the key)."""
    try:
        if ranks is not None:
            ranks.close()
            raise ConfigError("model: an endpoint run is one process; start it without torchrun")
        check(cfg, set(vars(args)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return record_and_exit(
        cfg.db, lambda: Recorder(cfg.db),
        lambda recorder: collect(cfg, recorder, progress=not getattr(args, "quiet", False)),
        "collection", told=((EndpointRefused, "the endpoint refused the request: "),
                            # the check before the run: nothing recorded
                            (EndpointError, "")))
