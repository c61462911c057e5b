"""What recording a TRL ``GRPOTrainer`` run costs: storage.integrations.trl.RecorderCallback's
time per step as a fraction of the step. A script; needs TRL (requirements-trl.txt).

    nice -n 15 .venv/bin/python bench/trl_record.py --steps 6 --rounds 2
    python bench/trl_record.py --device cuda --shape smollm2-135m --tasks 8 --max-new-tokens 256

Work per step as in bench/trl_grpo.py: the ``tiny`` model, LoRA r 16 on all projections, the
search env's first prompt (chat template), ``--tasks`` prompts x G 8 completions of up to
``--max-new-tokens`` tokens, temperature 1, KL 0.001 (so reference logprobs are recorded too),
one optimizer step per batch, one torch thread. ``--shape smollm2-135m`` swaps in a randomly
initialised network of SmolLM2-135M's shape (30 layers, 576 wide; random weights never stop
early, so every completion is full length: the most tokens to record), ``--device cuda`` trains
on the GPU (TRL's own device choice), where steps are short and recording weighs the most.

Two figures per round:
* the callback's own time per step (``RecorderCallback.record_s``: copying TRL's tensors off the
  device, building the rows, the one DuckDB transaction) over the step's wall time (on_step_end
  to on_step_end, recording included);
* the A/B: median step time of a block with the callback against a block without it (same
  seed), which also catches costs the callback cannot time itself (its wrappers, the index
  column riding through TRL's shuffle).
The first step of each block is left out (warm-up). Blocks alternate, the order rotated each
round (with, without; without, with; ...) so that a drift in the machine's load hits both.
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

from bench.trl_grpo import TARGETS, reward_of  # noqa: E402
from core.envs.base import make_env  # noqa: E402
from core.model.policy import load_base_model, load_tokenizer  # noqa: E402


def make_model(shape: str, vocab: int):
    if shape == "tiny":
        return load_base_model("tiny", vocab_size=vocab).requires_grad_(True)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    return LlamaForCausalLM(config)


def block(tok, rows, args, record: bool, seed: int, store: Path) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from storage.integrations.trl import RecorderCallback

    model = make_model(args.shape, len(tok))
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            marks.append(time.perf_counter())

    def reward(completions, **kw) -> list[float]:
        return [reward_of(c[-1]["content"]) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, per_device_train_batch_size=len(rows) * 8, num_generations=8,
            max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            beta=0.001, learning_rate=1e-5, max_steps=args.steps, logging_steps=1,
            report_to="none", save_strategy="no", use_cpu=args.device == "cpu", bf16=False,
            seed=seed,
            shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True)
        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                          bias="none", task_type="CAUSAL_LM")
        data = Dataset.from_list(rows * (args.steps + 1))
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                              processing_class=tok, peft_config=lora)
        recorder = RecorderCallback(store, run_name=f"bench seed {seed}") if record else None
        if recorder:
            trainer.add_callback(recorder)
        trainer.add_callback(Clock())  # after the recorder: its on_step_end is inside the step
        torch.set_num_threads(args.threads)
        marks.append(time.perf_counter())
        trainer.train()
    steps = [b - a for a, b in zip(marks, marks[1:])][1:]
    return steps, (recorder.record_s[1:] if recorder else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per block")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=("tiny", "smollm2-135m"), default="tiny")
    parser.add_argument("--tokenizer", help="a saved tokenizer folder (default: tiny's cached one)")
    args = parser.parse_args()
    env = make_env("search", seed=0)
    tasks = env.tasks("train", args.tasks, 0)
    rows = [{"prompt": [{"role": "system", "content": env.system_prompt},
                        {"role": "user", "content": env.episode(t, seed=0).reset()}]}
            for t in tasks]
    if args.tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    else:
        tok = load_tokenizer("tiny")
    with_cb, without, record = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "trl.duckdb"
        for rnd in range(args.rounds):
            for record_it in ((True, False) if rnd % 2 == 0 else (False, True)):
                steps, rec = block(tok, rows, args, record_it, rnd, store)
                if record_it:
                    with_cb += steps
                    record += rec
                else:
                    without += steps
        from storage import db
        with db.reading(store) as con:
            tokens = con.execute("SELECT count(*) FROM tokens").fetchone()[0]
            trajs = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    fractions = [r / s for r, s in zip(record, with_cb)]
    print(f"{args.shape} model on {args.device}, search prompt, {args.tasks} prompts x G=8, <= {args.max_new_tokens} new "
          f"tokens, kl 0.001, LoRA r16, {args.threads} thread(s); {args.rounds} rounds of "
          f"{args.steps} steps per side (first of each block left out)")
    print(f"recorded {trajs} trajectories, {tokens} token rows "
          f"({tokens / max(trajs, 1):.0f} per trajectory)")
    print(f"step with callback     median {statistics.median(with_cb):.3f} s  (n={len(with_cb)})")
    print(f"step without callback  median {statistics.median(without):.3f} s  (n={len(without)})")
    print(f"callback time per step median {statistics.median(record) * 1000:.1f} ms, "
          f"max {max(record) * 1000:.1f} ms")
    print(f"callback / step        median {statistics.median(fractions):.1%}, "
          f"max {max(fractions):.1%}")
    print(f"A/B step time          {statistics.median(with_cb) / statistics.median(without) - 1:+.1%}")


if __name__ == "__main__":
    main()
