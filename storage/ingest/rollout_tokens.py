"""A trainer's token-level rollout (ids, loss mask, logprobs, advantages) as a generic record's
``tokens`` and ``turns`` (storage/interchange.py), shared by the importers of verl's batch
(storage/integrations/verl_batch.py), SkyRL's generator output and verifiers' traces
(storage/ingest/trainer_rollouts.py).

The rules, the same for every trainer:

* The prompt's tokens are role ``prompt``, never trained.
* A response token the loss mask keeps (``mask`` 1) is the model's own: role ``action``,
  ``trained``. One it drops is an ``observation`` (a tool's or an environment's text spliced
  into the response in a multi-turn rollout), never trained -- so the mask lint sees exactly
  what the trainer trained.
* A turn starts at each run of action tokens; the observation tokens after it, up to the next
  action, are that turn's observation. Token rows carry the turn index (the prompt's is -1).
* The sampler's ``logprob``, the trainer's ``train_logprob`` and the ``advantage`` are kept on
  trained tokens only: trainers fill masked positions with zeros or with values nothing
  sampled (verl's agent loop writes 0.0 as the rollout logprob of a tool's tokens), and a
  stored value there would read as a real one in the mismatch colouring.
"""
from __future__ import annotations

from typing import Sequence


def rollout_tokens(prompt_texts: Sequence[str], prompt_ids: Sequence[int],
                   texts: Sequence[str], ids: Sequence[int], mask: Sequence,
                   logprobs: Sequence[float] | None = None,
                   train_logprobs: Sequence[float] | None = None,
                   advantages: Sequence[float] | None = None) -> tuple[list[dict], list[dict]]:
    """(``tokens``, ``turns``) of one rollout: the prompt (``prompt_texts``/``prompt_ids``), then
    its response (``texts``/``ids``, each with its loss ``mask`` and, per response position,
    the optional sampler ``logprobs``, trainer ``train_logprobs`` and ``advantages``)."""
    tokens = [{"text": t, "role": "prompt", "trained": False, "token_id": int(i), "turn": -1}
              for t, i in zip(prompt_texts, prompt_ids)]
    turns: list[dict] = []
    previous_trained = False
    for j, (text, tid) in enumerate(zip(texts, ids)):
        trained = bool(mask[j])
        if trained and not previous_trained:
            turns.append({"action": "", "observation": ""})
        if not turns:  # observation before any action (a response that opens with a tool's
            turns.append({"action": "", "observation": ""})  # text): an empty first action
        row = {"text": text, "role": "action" if trained else "observation", "trained": trained,
               "token_id": int(tid), "turn": len(turns) - 1}
        if trained:
            turns[-1]["action"] += text
            for name, values in (("logprob", logprobs), ("train_logprob", train_logprobs),
                                 ("advantage", advantages)):
                if values is not None:
                    row[name] = float(values[j])
        else:
            turns[-1]["observation"] += text
        tokens.append(row)
        previous_trained = trained
    return tokens, turns or [{"action": "", "observation": ""}]


def first_trained(tokens: list[dict], name: str) -> float | None:
    """``name`` (``advantage``) of the first trained token: the trajectory's, under outcome
    estimators (GRPO, RLOO: every trained token gets the same value)."""
    return next((t[name] for t in tokens if t["trained"] and name in t), None)
