"""Rollout on the real search environment with the tiny model.

A random tiny model never writes a tag, so the module fixture first teaches it (40 LoRA steps on
one sequence) to answer its prompt with ``<search>...</search`` followed by the single token
``>.``: the closing tag then ends inside a token, the hardest case for cutting at the tag.
"""
import re

import pytest
import torch

from core.envs.base import make_env
from core.model.policy import load_policy, token_logprobs
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.rollout.transcript import prompt_ids



pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def setup():
    pol = load_policy("tiny", seed=0)
    env = make_env("search", seed=0, topk=2)
    task = env.tasks("train", 1, 0)[0]
    tok = pol.tokenizer
    prompt = prompt_ids(tok, env.system_prompt, env.episode(task, seed=0).reset())
    query = task.prompt.split("?")[0].split(":")[-1].strip()
    target = tok.encode(f"<search>{query}</search", add_special_tokens=False)
    target.append(tok.convert_tokens_to_ids(">."))
    assert tok.decode(target).endswith("</search>.")
    ids = torch.tensor([prompt + target])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, len(prompt):] = True
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=1e-2)
    for _ in range(40):
        loss = -token_logprobs(pol, ids, mask)["logprobs"].sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return pol, env, task, target


def _check_contract(pol, traj, temperature=1.0):
    """Token-level invariants every trajectory must satisfy."""
    tok = pol.tokenizer
    n = len(traj.token_ids)
    assert len(traj.token_text) == len(traj.roles) == len(traj.trained) == len(traj.logprobs) == n
    context = tok.decode(traj.token_ids)
    assert "".join(traj.token_text) == context
    assert traj.roles[0] == "prompt"
    assert all(t == (r == "action") for t, r in zip(traj.trained, traj.roles))
    assert all((lp is not None) == t for lp, t in zip(traj.logprobs, traj.trained))
    # The model conditioned on exactly these ids: a fresh forward pass over them reproduces the
    # logprobs recorded while sampling with the KV cache (no re-tokenisation drift).
    with torch.no_grad():
        fresh = token_logprobs(pol, torch.tensor([traj.token_ids]),
                               torch.tensor([traj.trained]),
                               temperature=temperature or 1.0)["logprobs"][0]
    recorded = torch.tensor([lp if lp is not None else 0.0 for lp in traj.logprobs])
    assert torch.allclose(fresh, recorded, atol=1e-4)
    # per-turn: the action tokens spell the turn's action, the observation tokens its observation
    for turn in traj.turns:
        act = [i for i in range(n) if traj.token_turn[i] == turn.turn and traj.roles[i] == "action"]
        obs = [i for i in range(n) if traj.token_turn[i] == turn.turn and traj.roles[i] == "observation"]
        assert tok.decode([traj.token_ids[i] for i in act]) in (turn.action, turn.action + "<|im_end|>")
        assert "".join(traj.token_text[i] for i in obs) == turn.observation


def _information_spans(traj):
    """Token positions whose text overlaps an <information>...</information> block."""
    context = "".join(traj.token_text)
    starts, pos = [], 0
    for text in traj.token_text:
        starts.append(pos)
        pos += len(text)
    after_prompt = starts[traj.roles.index("action")]  # the system prompt names the tags too
    inside = set()
    for m in re.finditer(r"<information>.*?(</information>|$)", context[after_prompt:], re.DOTALL):
        m_start, m_end = m.start() + after_prompt, m.end() + after_prompt
        inside |= {i for i, s in enumerate(starts)
                   if s < m_end and s + len(traj.token_text[i]) > m_start}
    return inside


def test_generation_stops_at_the_tag_even_inside_a_token(setup):
    pol, env, task, target = setup
    trajs = rollout(pol, env, [task], group_size=2, seed=0, id_prefix="t",
                    sampling=Sampling(max_turns=2, max_new_tokens=32, temperature=0.0))
    tok = pol.tokenizer
    for traj in trajs:
        first = traj.turns[0]
        assert first.action.startswith("<search>") and first.action.endswith("</search>")
        assert first.valid and first.action_type == "search"
        # the sampled '>.' token was replaced by '>': nothing after the tag is in the context
        act = [i for i, (r, t) in enumerate(zip(traj.roles, traj.token_turn)) if r == "action" and t == 0]
        assert traj.token_ids[act[-1]] == tok.convert_tokens_to_ids(">")
        assert target[-1] not in [traj.token_ids[i] for i in act]
        assert traj.roles[act[-1] + 1] == "observation"
        assert first.action_tokens == len(act) == len(target)
        _check_contract(pol, traj)


def test_masks_on_a_real_search_rollout(setup):
    pol, env, task, _ = setup
    greedy = rollout(pol, env, [task], group_size=1, seed=1, id_prefix="g",
                     sampling=Sampling(max_turns=2, max_new_tokens=24, temperature=0.0))
    sampled = rollout(pol, env, [task], group_size=2, seed=1, id_prefix="m",
                      sampling=Sampling(max_turns=2, max_new_tokens=16, temperature=0.7))
    assert _information_spans(greedy[0]), "the taught model searches and gets <information>"
    for traj, temperature in [(greedy[0], 0.0)] + [(t, 0.7) for t in sampled]:
        _check_contract(pol, traj, temperature=temperature)
        info = _information_spans(traj)
        assert all(not traj.trained[i] and traj.roles[i] == "observation" for i in info)
        generated = [i for i, r in enumerate(traj.roles) if r == "action"]
        assert generated and all(traj.trained[i] for i in generated)
        assert sum(t.action_tokens for t in traj.turns) == len(generated)


def test_groups_ids_and_reproducibility(setup):
    pol, env, task, _ = setup
    tasks = env.tasks("train", 2, 3)
    sampling = Sampling(max_turns=2, max_new_tokens=10, temperature=1.0)
    a = rollout(pol, env, tasks, group_size=3, seed=5, id_prefix="s7", sampling=sampling)
    b = rollout(pol, env, tasks, group_size=3, seed=5, id_prefix="s7", sampling=sampling)
    c = rollout(pol, env, tasks, group_size=3, seed=6, id_prefix="s7", sampling=sampling)
    assert [t.traj_id for t in a] == [f"s7-g{g}-r{r}" for g in range(2) for r in range(3)]
    assert len({t.traj_id for t in a}) == 6
    assert [t.group_id for t in a] == ["s7-g0"] * 3 + ["s7-g1"] * 3
    assert all(t.task.task_id == tasks[int(t.group_id[-1])].task_id for t in a)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]


def test_limits_are_enforced_and_recorded(setup):
    pol, env, task, _ = setup
    tok = pol.tokenizer
    # observation budget: the taught search's <information> block is cut to 8 tokens
    trajs = rollout(pol, env, [task], group_size=1, seed=0, id_prefix="o",
                    sampling=Sampling(max_turns=1, max_new_tokens=32, max_obs_tokens=8,
                                      temperature=0.0))
    turn = trajs[0].turns[0]
    assert turn.obs_truncated
    assert sum(r == "observation" for r in trajs[0].roles) == 8
    assert turn.observation == tok.decode(tok.encode(turn.observation, add_special_tokens=False))
    assert trajs[0].finish_reason == "max_turns"
    # token budget per turn: a random model stopped at max_new_tokens
    trajs = rollout(pol, env, env.tasks("heldout", 2, 0), group_size=1, seed=0, id_prefix="n",
                    sampling=Sampling(max_turns=1, max_new_tokens=5, temperature=1.0))
    for traj in trajs:
        _check_contract(pol, traj)
        assert all(t.action_tokens <= 5 for t in traj.turns)
        assert any(t.action_truncated for t in traj.turns) or traj.turns[0].action_tokens < 5
    # context budget: the episode ends as context_full without exceeding it
    limit = len(prompt_ids(tok, env.system_prompt, env.episode(task, 0).reset())) + 30
    trajs = rollout(pol, env, [task], group_size=2, seed=0, id_prefix="c",
                    sampling=Sampling(max_turns=4, max_new_tokens=32, max_context=limit,
                                      temperature=0.0))
    for traj in trajs:
        assert traj.finish_reason == "context_full"
        assert len(traj.token_ids) <= limit
        _check_contract(pol, traj)


def test_without_cache_reuse_the_same_trajectories(setup):
    """reuse_cache=False (Search-R1's re-encoding of the history each turn, kept for the
    benchmark) conditions on the same tokens, so greedy rollouts are identical."""
    pol, env, task, _ = setup
    sampling = Sampling(max_turns=3, max_new_tokens=16, temperature=0.0)
    kept = rollout(pol, env, [task], group_size=2, seed=0, id_prefix="k", sampling=sampling)
    fresh = rollout(pol, env, [task], group_size=2, seed=0, id_prefix="k", sampling=sampling,
                    reuse_cache=False)
    assert len(kept[0].turns) >= 2, "several turns, so later turns re-encode a history"
    assert [t.token_ids for t in fresh] == [t.token_ids for t in kept]
    for traj in fresh:
        _check_contract(pol, traj)
