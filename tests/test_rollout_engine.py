"""The batched rollout engine (core/rollout/engine.py, core/model/kv_cache.py) samples what its definition says.

The definition: at each step of a turn, one generator seeded with the rollout's seed gives one
uniform number u to every row that was in the batch when the turn began, in batch order; a row's
token is the first whose cumulative probability (the policy's distribution given its whole
history) exceeds u; a row keeps its token while its turn goes on. The engine computes less than that (one KV cache across turns, a row whose turn ended
is not computed until the next turn, a group's shared prompt is encoded once), so this test
replays each recorded trajectory through the definition, with a full forward pass of the history
for every token and no cache, and asks for the same tokens and logprobs.

Rows must end their turns at different steps for this to test anything: here a random tiny model
treats ~4% of the vocabulary as end-of-turn (EOS) tokens, in a world that never ends before
``max_turns``, so rows stop early, sit out the rest of the turn, and come back the next one.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from core.envs.base import Outcome, StepResult, Task
from core.model.kv_cache import Batch
from core.model.policy import load_policy
from core.rollout.engine import _Row, rollout
from core.rollout.sampling import Sampling

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Talk:
    """Every action is heard; the episode only ends at max_turns. Tasks differ in prompt length."""
    name, stop_tags, system_prompt = "talk", ("</never-written>",), "Say anything."

    def tasks(self, split, n, seed):
        return [Task(task_id=f"talk-{i}", prompt="tell me " + "more " * (3 * i)) for i in range(n)]

    def episode(self, task, seed):
        return TalkEpisode()


@dataclass
class TalkEpisode:
    def reset(self):
        return "talk"

    def step(self, action):
        return StepResult(f"heard {len(action)} characters", done=False, valid=True,
                          action_type="say")

    def outcome(self):
        return Outcome(score=0.0, success=False)


@pytest.fixture(scope="module")
def pol():
    policy = load_policy("tiny", seed=0)
    # every 25th token id ends the turn (EOS): random rows stop after ~25 tokens, at varied steps
    policy.base.generation_config.eos_token_id = list(range(3, len(policy.tokenizer), 25))
    return policy


def _action_spans(traj, turn):
    return [i for i, (r, t) in enumerate(zip(traj.roles, traj.token_turn))
            if r == "action" and t == turn]


def test_the_engine_samples_what_the_definition_samples(pol):
    env, sampling, seed = Talk(), Sampling(max_turns=3, max_new_tokens=40), 11
    trajs = rollout(pol, env, env.tasks("train", 2, 0), group_size=4, sampling=sampling,
                    seed=seed)
    lengths = [[len(_action_spans(t, turn)) for t in trajs] for turn in range(3)]
    # the case under test: rows end their turn at different steps and come back the next turn
    assert all(len(set(per_turn)) > 2 for per_turn in lengths), lengths
    assert any(n < sampling.max_new_tokens for n in lengths[0])
    generator = torch.Generator().manual_seed(seed)
    checked = 0
    with torch.no_grad():
        for turn in range(3):
            spans = [_action_spans(t, turn) for t in trajs]  # every row is alive every turn
            for k in range(max(len(s) for s in spans)):
                probs, logps = [], []
                for traj, span in zip(trajs, spans):
                    if k >= len(span):  # its turn ended: it still draws, its token is unused
                        probs.append(None)
                        logps.append(None)
                        continue
                    ids = torch.tensor([traj.token_ids[:span[k]]])
                    logits = pol.model(input_ids=ids).logits[0, -1].float()
                    logp = torch.log_softmax(logits, -1)
                    probs.append(logp.exp())
                    logps.append(logp)
                u = torch.rand(len(trajs), generator=generator, dtype=torch.float64)
                for b, (traj, span) in enumerate(zip(trajs, spans)):
                    if k < len(span):
                        token = traj.token_ids[span[k]]
                        cdf = probs[b].double().cumsum(-1)
                        drawn = int((cdf <= u[b] * cdf[-1]).sum())
                        assert drawn == token, (turn, k, traj.traj_id)
                        assert abs(float(logps[b][token]) - traj.logprobs[span[k]]) < 1e-4
                        checked += 1
    assert checked == sum(sum(per_turn) for per_turn in lengths)


def test_parking_rows_moves_their_cache_with_them(pol):
    """Chained swaps (park positions 3 and 1 of 5): each row's cache goes where the row goes."""
    tok = pol.tokenizer
    rows = [_Row(traj=None, episode=None, pending=tok.encode(f"row {i} says " + "hi " * i))
            for i in range(5)]
    batch = Batch(pol, rows)
    with torch.no_grad():
        batch.feed([row.pending for row in rows])
        before = {b: batch.cache.layers[0].keys[i].clone() for i, b in enumerate(batch.order)}
        live = batch.park([3, 1])
        assert live == [0, 4, 2] and batch.n == 3 and sorted(batch.order) == list(range(5))
        layer = batch.cache.layers[0]
        for i, b in enumerate(batch.order):
            assert torch.equal(layer.kbuf[i, :, :layer.length], before[b])
        # the live rows go on; the parked ones get masked holes, then all are put back in order
        batch.step([tok.eos_token_id] * 3)
        new = batch.width - 1
        assert batch.mask[:3, new].tolist() == [1, 1, 1] and batch.mask[3:, new].tolist() == [0, 0]
        batch.keep([0, 1, 2, 3, 4])
        assert batch.order == list(range(5)) and batch.n == 5
        width = before[0].shape[1]
        for b in range(5):
            assert torch.equal(batch.cache.layers[0].kbuf[b, :, :width], before[b])
        assert batch.mask[:, width].tolist() == [1, 0, 1, 0, 1]
