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
* The tokens are columns (storage/token_columns.py): the roles, turns and values come from
  array operations, the turns' texts from one slice of the texts' bytes per run of tokens,
  never a dict or a string per token.
* The sampler's ``logprob``, the trainer's ``train_logprob`` and the ``advantage`` are kept on
  trained tokens only: trainers fill masked positions with zeros or with values nothing
  sampled (verl's agent loop writes 0.0 as the rollout logprob of a tool's tokens), and a
  stored value there would read as a real one in the mismatch colouring.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from storage.ingest.door import token_ids
from storage.interchange import LineError
from storage.token_columns import (ACTION, OBSERVATION, PROMPT, TokenColumns, joiner,
                                   texts_array)


def response_turns(role: np.ndarray, n_prompt: int) -> np.ndarray:
    """Each response token's turn: a turn starts at each run of action tokens, and a response
    that opens with observation tokens has an empty first action (turn 0 is theirs)."""
    action = role[n_prompt:] == ACTION
    starts = action & ~np.concatenate(([False], action[:-1]))
    turn = np.cumsum(starts, dtype=np.int32) - 1
    if len(action) and not action[0]:
        turn += 1
    return turn


def rollout_columns(texts: Sequence[str] | pa.Array, ids: Sequence[int], n_prompt: int,
                    mask: Sequence, logprobs=None, train_logprobs=None, advantages=None,
                    with_turns: bool = True) -> tuple[TokenColumns, list[dict]]:
    """(tokens as ``TokenColumns``, ``turns``) of one rollout: ``ids`` and their ``texts``, the
    first ``n_prompt`` the prompt, the rest its response with its loss ``mask`` and, per
    response position, the optional sampler ``logprobs``, trainer ``train_logprobs`` and
    ``advantages`` (kept on trained tokens only). ``turns`` ([] unless ``with_turns``) holds
    each turn's action and observation text."""
    ids = token_ids(ids, "token ids")  # a float, a boolean or 2^70 is no token id
    n = len(ids)
    for name, values in (("mask", mask), ("logprobs", logprobs),
                         ("train_logprobs", train_logprobs), ("advantages", advantages)):
        if values is not None and len(values) != n - n_prompt:
            raise LineError(f"{name} has {len(values)} entries for {n - n_prompt} response "
                            "tokens")
    role = np.full(n, OBSERVATION, np.int8)
    role[:n_prompt] = PROMPT
    trained = np.zeros(n, bool)
    trained[n_prompt:] = np.asarray(mask, np.float64) != 0
    role[trained] = ACTION
    turn = np.full(n, -1, np.int32)
    turn[n_prompt:] = response_turns(role, n_prompt)
    text = texts if isinstance(texts, pa.Array) else texts_array(texts)
    cols = TokenColumns(text, role, turn, ids)
    for name, values in (("logprob", logprobs), ("train_logprob", train_logprobs),
                         ("advantage", advantages)):
        if values is not None:
            full = np.zeros(n, np.float64)
            full[n_prompt:] = np.asarray(values, np.float64)
            cols.set_values(name, full, trained)
    turns = _turns(joiner(text), role, turn, n_prompt) if with_turns else []
    return cols, turns


def _turns(joined, role: np.ndarray, turn: np.ndarray, n_prompt: int) -> list[dict]:
    """Each turn's action and observation text: one slice of the texts' bytes per run of
    same-role tokens (``joined``: storage/token_columns.py ``joiner``)."""
    if len(turn) <= n_prompt:
        return [{"action": "", "observation": ""}]
    turns = [{"action": "", "observation": ""} for _ in range(int(turn[-1]) + 1)]
    cuts = np.flatnonzero(np.diff(role[n_prompt:])) + 1 + n_prompt
    starts = np.concatenate(([n_prompt], cuts)).tolist()
    for a, b, code, k in zip(starts, np.concatenate((cuts, [len(role)])).tolist(),
                             role[starts].tolist(), turn[starts].tolist()):
        if a < b:
            turns[k]["action" if code == ACTION else "observation"] += joined(a, b)
    return turns
