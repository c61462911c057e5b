"""Seconds per optimizer step: this project's GRPO step against TRL's ``GRPOTrainer``. A script.

TRL is not a dependency of the project. Install it out of the way of the pinned environment:

    .venv/bin/pip install --no-deps --target /tmp/trl_pkgs trl==1.16.0 datasets==5.2.0 \\
        dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
    PYTHONPATH=/tmp/trl_pkgs nice -n 15 .venv/bin/python bench/trl_grpo.py --steps 3 --rounds 2

Same work on both sides: the ``tiny`` model (the same weights), LoRA r 16 / alpha 32 on all
attention and MLP projections, a single-turn task (the search env's first prompt, chat template),
``--tasks`` prompts x G 8 completions of exactly ``--max-new-tokens`` tokens (the random tiny
model never ends early; both sides count and print the tokens they generated), temperature 1,
no top-k/top-p, the same reward function, GRPO advantages, KL coefficient 0.001 to the
adapter-free reference, one optimizer step per batch, AdamW, one torch thread.

* ours: ``core.rollout.engine.rollout`` -> ``core.credit.assign.assign`` -> ``score_reference`` ->
  ``policy_update`` (what ``core/run/trainer.py`` runs in an RL step, recording excluded).
* TRL: ``GRPOTrainer.train()`` for ``--steps`` steps; a callback times each step.

Blocks of ``--steps`` steps alternate (ours, TRL, ours, TRL, ...) so load on the machine hits both
sides alike; the first step of each block is left out (warm-up).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.config import TrainConfig  # noqa: E402
from core.credit.assign import assign  # noqa: E402
from core.envs.base import make_env  # noqa: E402
from core.model.policy import load_base_model, load_policy, load_tokenizer  # noqa: E402
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.learn.update import make_samples, policy_update, score_reference  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def reward_of(text: str) -> float:
    """Any deterministic score with spread inside a group (so advantages are not all zero):
    the share of letters among the completion's characters."""
    return sum(c.isalpha() for c in text) / max(len(text), 1)


def ours_block(policy, env, tasks, cfg, steps: int, seed: int) -> tuple[list[float], int]:
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.lr, weight_decay=0.0)
    sampling = Sampling.from_config(cfg)
    times, generated = [], 0
    for step in range(steps):
        t0 = time.perf_counter()
        trajs = rollout(policy, env, tasks, group_size=cfg.group_size, sampling=sampling,
                        seed=seed + step)
        for t in trajs:
            t.reward = reward_of(t.turns[0].action if t.turns else "")
        credit = assign(trajs, cfg)
        for t, filtered in zip(trajs, credit.filtered):  # as the trainer does: credit returns it
            t.filtered = filtered
        samples = make_samples(trajs, credit.per_token)
        score_reference(policy, [s for s in samples if not s.traj.filtered], cfg)
        result = policy_update(policy, optimizer, samples, cfg, seed=step)
        assert result.metrics["update/steps"] == 1.0, result.metrics
        times.append(time.perf_counter() - t0)
        generated += sum(t.response_tokens for t in trajs)
    return times[1:], generated // steps


def trl_block(tok, env, tasks, cfg, steps: int, seed: int, threads: int) -> tuple[list[float], int]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = load_base_model("tiny", vocab_size=len(tok))  # the same weights as load_policy's
    model.requires_grad_(True)
    rows = [{"prompt": [{"role": "system", "content": env.system_prompt},
                        {"role": "user", "content": env.episode(t, seed=0).reset()}]}
            for t in tasks]
    data = Dataset.from_list(rows * (steps + 1))
    marks: list[float] = []
    generated = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    def reward(completions, **kw) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        ids = kw.get("completion_ids")  # TRL's own token ids when it passes them
        generated.append(sum(len(i) for i in ids) if ids is not None else
                         sum(len(tok.encode(t, add_special_tokens=False)) for t in texts))
        return [reward_of(t) for t in texts]

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=len(tasks) * cfg.group_size,
            num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens,
            temperature=1.0, top_p=1.0, top_k=0, beta=cfg.kl_coef, learning_rate=cfg.lr,
            max_steps=steps, logging_steps=1, report_to="none", save_strategy="no",
            use_cpu=True, bf16=False, seed=seed, shuffle_dataset=False,
            dataloader_num_workers=0, disable_tqdm=True)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=TARGETS, bias="none", task_type="CAUSAL_LM")
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=tok, peft_config=lora, callbacks=[Clock()])
        torch.set_num_threads(threads)
        marks.append(time.perf_counter())
        trainer.train()
    times = [b - a for a, b in zip(marks, marks[1:])]
    return times[1:], (sum(generated) // len(generated)) if generated else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per block")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per side, alternating")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrainConfig(env="search", model="tiny", algo="grpo", group_size=8,
                      tasks_per_step=args.tasks, max_turns=1, max_new_tokens=args.max_new_tokens,
                      kl_coef=0.001, lr=1e-5, lora_rank=16, lora_alpha=32, temperature=1.0,
                      top_p=1.0)
    env = make_env("search", seed=0)
    tasks = env.tasks("train", args.tasks, 0)
    tok = load_tokenizer("tiny")
    times = {"ours": [], "TRL GRPOTrainer": []}
    tokens = {}
    for rnd in range(args.rounds):
        policy = load_policy("tiny", seed=0)
        policy.model.train()
        t, n = ours_block(policy, env, tasks, cfg, args.steps, seed=rnd)
        times["ours"] += t
        tokens["ours"] = n
        t, n = trl_block(tok, env, tasks, cfg, args.steps, seed=rnd, threads=args.threads)
        times["TRL GRPOTrainer"] += t
        tokens["TRL GRPOTrainer"] = n
    ours_s = statistics.median(times["ours"])
    print(f"tiny model, single-turn search prompt, {args.tasks} prompts x G=8, "
          f"{args.max_new_tokens} new tokens, kl 0.001, LoRA r16; {args.rounds} alternating "
          f"blocks of {args.steps} steps (first of each left out), {args.threads} thread(s)")
    print(f"{'trainer':18s} {'s/step (median)':>16s} {'steps':>6s} {'gen tokens/step':>16s} "
          f"{'vs ours':>8s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:18s} {med:16.2f} {len(ts):6d} {tokens[name]:16d} {med / ours_s:7.2f}x")


if __name__ == "__main__":
    main()
