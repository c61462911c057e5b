"""Batched multi-turn rollouts: G trajectories per task, all active ones generating together.

One step's trajectories share a single KV cache for their whole life, across turns:

    turn k:  feed each row's pending tokens (prompt, or last action token + observation)
             -> sample token by token until every row hit a stop tag, EOS or its token budget
             -> env.step(action text) -> observation tokens become the row's next pending tokens
             -> rows whose episode ended leave the batch (and the cache)

Rows have different lengths, so each fed chunk is left-padded; padding and the columns of rows
whose turn already ended are holes in the attention mask, and position ids count real tokens only.
The cache therefore always holds exactly the trajectory's token ids: what is trained is what the
model conditioned on, with no re-tokenisation. The batch and its cache (core/model/kv_cache.py): a row
whose turn ended is no longer computed until the next turn, and rows with the same prompt are
encoded once. Sampling draws one random number for every row of the batch each step
(``sample_next``, core/rollout/draw.py), so which rows are computed does not change what a row
samples.

Stop tags are cut exactly after the first closing tag (Search-R1). When a tag ends inside a token
(``>`` + ``\\n`` sampled as one ``>\\n`` token) that token is replaced by the tokens of its part up
to the cut; the replacement is what the next turn is conditioned on. Its first token's logprob
comes from the same sampling distribution; any further ones are scored by a forward pass.

Chat templates and how a turn's tokens are written into the trajectory (roles, the loss mask,
the cuts to ``max_obs_tokens`` and ``max_context``): core/rollout/transcript.py, shared with the SFT
demonstrations; its names are re-exported here.

The environment is called only through core/envs/guard.py (a deadline on every call, the
observation cut by bytes before it is tokenised, step results and outcomes checked); whatever it
raises there ends that trajectory as ``env_error`` (``step_failed``, ``grade``), and the run goes on.

``final_answer_turn`` (Search-R1): a row still going after ``max_turns`` gets one more generation
in which only an answer (``env.is_answer``) is executed; anything else is recorded unexecuted.

The sampling network is the policy with its LoRA adapter merged into the weights
(``Policy.merged``, core/model/policy.py: one product a linear layer instead of three; the base
weights come back bit-identical). Its float math differs slightly from the unmerged forward the
update scores with; the recorded sampler logprobs against the trainer's show that mismatch, as
for any inference engine the trained weights are synced into.

Roles and the loss mask: prompt and observation tokens are untrained; the model's own tokens are
trained and carry the logprob of the temperature-scaled distribution they were sampled from
(the distribution the loss compares against; top-p truncation is not renormalised in).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from core.envs.base import Environment, Task, observation_role
from core.envs.guard import CUT_KEY, EnvError, GuardedEpisode
from core.model.kv_cache import Batch
from core.model.policy import Policy, token_logprobs, token_texts
from core.rollout.draw import Draw, sample_next
from core.rollout.episode import (execute, final_reason, grade, open_episodes, record_render,
                                  step_failed)
from core.rollout.sampling import Sampling
from core.rollout.transcript import append_tokens, prompt_ids, record_turn
from core.rollout.trajectory import Trajectory, Turn


@dataclass
class _Row:
    traj: Trajectory
    episode: GuardedEpisode
    pending: list[int]
    """Token ids already in the trajectory but not yet fed to the cache."""
    fed: int = 0
    """Real tokens in the cache (the next position id)."""
    done: bool = False
    gen: list[int] = field(default_factory=list)
    gen_lp: list[float | None] = field(default_factory=list)
    gen_ent: list[float | None] = field(default_factory=list)
    text: str = ""
    prev_text: str = ""
    budget: int = 0
    stopped: str | None = None
    """Why this turn's generation ended: tag | eos | max_new_tokens."""
    cut_text: str | None = None
    state_key: str | None = None
    """Key of the state the episode is in now (the next turn's anchor)."""


def decoder(tokenizer):
    """``tokenizer.decode`` as a function of the ids. A fast tokenizer that cleans up no spaces
    decodes exactly what its Rust ``decode`` returns: that is called directly, without
    transformers' wrapper (~half of the time of a call; the rollout decodes every row's action
    at every token)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return tokenizer.decode


def _first_stop(text: str, tags: tuple[str, ...]) -> int | None:
    """End index of the earliest complete stop tag in text, or None."""
    ends = [text.find(t) + len(t) for t in tags if t in text]
    return min(ends) if ends else None


def rollout(policy: Policy, env: Environment, tasks: list[Task], *, group_size: int,
            sampling: Sampling, seed: int, id_prefix: str = "s0",
            split: str = "train", reuse_cache: bool = True,
            merge_adapter: bool = True) -> list[Trajectory]:
    """Roll out ``group_size`` trajectories for each task, all in one batch.

    Trajectory ids are ``{id_prefix}-g{task index}-r{rollout}``; a task's rollouts share
    ``group_id = {id_prefix}-g{task index}``. Deterministic given ``seed``.
    ``reuse_cache=False`` re-encodes each row's whole history at every turn (Search-R1's way),
    for comparison in bench/rollout.py; the trajectories are the same, only slower.
    ``merge_adapter=False`` samples with the unmerged LoRA layers (the comparison's other side).
    """
    tok = policy.tokenizer
    if sampling.final_answer_turn and not callable(getattr(env, "is_answer", None)):
        raise ValueError(f"final_answer_turn needs an environment with an answer action "
                         f"(is_answer); {getattr(env, 'name', env)!r} has none")
    observation_role(env)  # a bad value fails here, not in the middle of a step
    # on the policy's device: sampling draws there (a GPU run samples other tokens than a CPU
    # run of the same seed, each reproducible on its own device)
    generator = torch.Generator(device=policy.device).manual_seed(seed)
    with sampling.guard(env) as guard:  # a failing reset or state_key fails the run, named
        rows: list[_Row] = []
        for ep in open_episodes(guard, tasks, group_size, seed, id_prefix, split):
            ids = prompt_ids(tok, env.system_prompt, ep.first)
            append_tokens(ep.traj, ids, "prompt", turn=-1)
            rows.append(_Row(traj=ep.traj, episode=ep.episode, pending=ids,
                             state_key=ep.state_key))
        for row in rows:
            if len(row.traj.token_ids) >= sampling.max_context:
                _finish(row, "context_full")
        was_training = policy.model.training
        policy.model.eval()
        trajs = [row.traj for row in rows]
        try:
            merged = policy.merged() if merge_adapter else contextlib.nullcontext()
            with merged:  # the adapter folded into the weights while sampling
                with torch.inference_mode():
                    _run_turns(policy, env, [r for r in rows if not r.done], sampling,
                               generator, reuse_cache)
                _fill_missing_logprobs(policy, trajs, sampling.temperature)
        finally:
            policy.model.train(was_training)
        for row in rows:
            if not row.done:
                _finish(row, "max_turns")
    for traj in trajs:
        traj.token_text = token_texts(tok, traj.token_ids)
    return trajs


def _run_turns(policy: Policy, env: Environment, rows: list[_Row], sampling: Sampling,
               generator: torch.Generator, reuse_cache: bool = True) -> None:
    batch = Batch(policy, rows, sampling.precision)
    for turn in range(sampling.max_turns + int(sampling.final_answer_turn)):
        if not batch.rows:
            return
        if turn and not reuse_cache:  # a fresh cache: the whole history is encoded again
            for row in batch.rows:
                row.fed, row.pending = 0, list(row.traj.token_ids)
            batch = Batch(policy, batch.rows, sampling.precision)
        generate_turn(batch, env, sampling, generator)
        for row in batch.rows:
            _act(row, turn, sampling, policy.tokenizer, env, final=turn == sampling.max_turns)
        batch.keep([i for i, row in enumerate(batch.rows) if not row.done])


def generate_turn(batch: Batch, env: Environment, sampling: Sampling,
                  generator: torch.Generator) -> None:
    """One turn's generation for every row of ``batch`` (core/model/kv_cache.py): feed each row's
    pending tokens, then sample token by token; a row whose turn ended (stop tag, EOS, token
    budget) leaves the computation and the others go on until none is left. Stepping the
    environment is the caller's."""
    rows, policy = batch.rows, batch.policy
    eos, tok = policy.eos_ids, policy.tokenizer
    decode = decoder(tok)
    for row in rows:
        row.gen, row.gen_lp, row.gen_ent, row.text, row.prev_text = [], [], [], "", ""
        row.stopped, row.cut_text = None, None
        row.budget = min(sampling.max_new_tokens, sampling.max_context - len(row.traj.token_ids))
    logits = batch.feed([row.pending for row in rows])                      # (B, V)
    for row in rows:
        row.pending = []
    live = batch.live
    while True:
        draw = sample_next(logits, sampling.temperature, sampling.top_p, generator, rows=live,
                           batch_rows=len(rows))
        ended = []
        for i, b in enumerate(live):
            _take(rows[b], draw, i, env.stop_tags, eos, tok, decode)
            if rows[b].stopped is not None:
                ended.append(i)
        if len(ended) == len(live):
            return
        if ended:  # finished rows stop being computed; their cache stays for the next turn
            live = batch.park(ended)
        logits = batch.step([rows[b].gen[-1] for b in live])                # (live, V)


def _take(row: _Row, draw: Draw, i: int, stop_tags: tuple[str, ...], eos: set[int],
          tokenizer, decode) -> None:
    """Add the token sampled for row ``i`` of ``draw`` to the row's action; decide whether its
    turn ends here."""
    token = draw.tokens[i]
    row.gen.append(token)
    row.gen_lp.append(draw.logp[i])
    row.gen_ent.append(draw.entropy[i])
    row.prev_text, row.text = row.text, decode(row.gen)
    if token in eos:
        row.stopped = "eos"
        row.cut_text = row.prev_text
        return
    cut = _first_stop(row.text, stop_tags)
    if cut is not None:
        row.stopped = "tag"
        row.cut_text = row.text[:cut]
        if cut < len(row.text):
            _cut_last_token(row, cut, draw, i, tokenizer)
    elif len(row.gen) >= row.budget:
        row.stopped = "max_new_tokens"
        row.cut_text = row.text


def _cut_last_token(row: _Row, cut: int, draw: Draw, i: int, tokenizer) -> None:
    """The tag ended inside the last token: replace it by the tokens of its part before the cut."""
    if not row.text.startswith(row.prev_text) or cut <= len(row.prev_text):
        return  # a multi-byte character straddles the cut: keep the sampled token as it is
    head = row.text[len(row.prev_text):cut]
    repl = tokenizer.encode(head, add_special_tokens=False)
    if not repl or tokenizer.decode(row.gen[:-1] + repl) != row.text[:cut]:
        return
    entropy = row.gen_ent[-1]
    row.gen[-1:] = repl
    row.gen_lp[-1:] = [draw.logp_of(i, repl[0])] + [None] * (len(repl) - 1)
    row.gen_ent[-1:] = [entropy] + [None] * (len(repl) - 1)
    row.text = row.text[:cut]


def _act(row: _Row, turn: int, sampling: Sampling, tok, env: Environment,
         final: bool = False) -> None:
    """Append the action, step the env, append the (truncated) observation. In the final-answer
    turn only an answer is executed; either way the episode ends there."""
    traj, tok_start = row.traj, len(row.traj.token_ids)
    ent = traj.info.setdefault("token_entropy", [])
    ent.extend([None] * (tok_start - len(ent)))
    ent.extend(row.gen_ent)
    action = row.cut_text if row.cut_text is not None else row.text
    truncated = row.stopped == "max_new_tokens"
    t0 = time.perf_counter()
    try:
        result = execute(row.episode, action, final, row.state_key)
    except EnvError as exc:  # an env bug ends this trajectory, not the run
        append_tokens(traj, row.gen, "action", turn, logprobs=row.gen_lp)
        traj.turns.append(step_failed(traj, exc, Turn(
            turn=turn, action=action, observation="", valid=False, action_tokens=len(row.gen),
            action_truncated=truncated, state_key=row.state_key,
            latency_s=time.perf_counter() - t0)))
        _finish(row, "env_error")
        return
    obs_ids, reason = record_turn(traj, tok, turn, action, row.gen, row.gen_lp, result, sampling,
                                  latency=time.perf_counter() - t0, action_truncated=truncated,
                                  state_key=row.state_key, role=observation_role(env))
    if CUT_KEY in result.info:  # cut by bytes before the token cut could see it
        traj.turns[-1].obs_truncated = True
    record_render(traj, row.episode, turn)
    row.state_key = result.state_key
    row.pending = _unfed(row, obs_ids)
    reason = final_reason(reason, final)
    if reason is not None:
        _finish(row, reason)


def _unfed(row: _Row, obs_ids: list[int]) -> list[int]:
    """Tokens of this turn the cache has not seen: the action's tail after the last fed token."""
    fed_in_turn = row.fed - (len(row.traj.token_ids) - len(obs_ids) - len(row.gen))
    return row.gen[fed_in_turn:] + obs_ids


def _finish(row: _Row, reason: str) -> None:
    row.done = True
    grade(row.traj, row.episode, reason)


def _fill_missing_logprobs(policy: Policy, trajs: list[Trajectory], temperature: float) -> None:
    """Score trained tokens that were not sampled (a cut token's tail) with a forward pass."""
    temp = temperature if temperature > 0 else 1.0
    for traj in trajs:
        ent = traj.info.setdefault("token_entropy", [])
        ent.extend([None] * (len(traj.token_ids) - len(ent)))
        missing = [i for i, (t, lp) in enumerate(zip(traj.trained, traj.logprobs)) if t and lp is None]
        if not missing:
            continue
        ids = torch.tensor([traj.token_ids])
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[0, missing] = True
        with torch.no_grad():
            out = token_logprobs(policy, ids, mask, temperature=temp)
        for i in missing:
            traj.logprobs[i] = float(out["logprobs"][0, i])
            ent[i] = float(out["entropy"][0, i])
