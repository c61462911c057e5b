"""Issue 50: the trainers' token-level rollouts held as columns (storage/token_columns.py) are
checked under the same rules and messages as the same tokens given as objects, and written in
row-bounded Arrow chunks into a real store."""
from __future__ import annotations

import math

import pytest

from storage import db
from storage.ingest.rollout_tokens import rollout_columns
from storage.interchange import LineError, validate


def _rollout(**spoil):
    """A prompt of 2 tokens and a response of 6 (mask 1 1 0 0 1 1: two turns), with the
    sampler's and trainer's logprobs and advantages; ``spoil`` sets name -> {position: value}
    on the response's inputs."""
    texts = ["Q", "?", "<a>", "x", " tool", " says", "<b>", "y"]
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    values = {"mask": [1, 1, 0, 0, 1, 1], "logprobs": [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4],
              "train_logprobs": [-0.1, -0.25, 0.0, 0.0, -0.3, -0.5],
              "advantages": [0.5] * 6, "ids": ids}
    stored_ids = spoil.pop("stored_ids", {})
    for name, changes in spoil.items():
        for at, value in changes.items():
            values[name][at] = value
    columns, turns = rollout_columns(texts, values["ids"], 2, values["mask"],
                                     logprobs=values["logprobs"],
                                     train_logprobs=values["train_logprobs"],
                                     advantages=values["advantages"])
    for at, value in stored_ids.items():  # rollout_columns refuses such an id (door.token_ids):
        columns.token_id[at] = value       # set on columns made some other way
    rec = {"traj_id": "t", "task_id": "q", "turns": turns, "reward": 1.0}
    return {**rec, "tokens": columns}, {**rec, "tokens": columns.rows()}


def _outcome(rec):
    try:
        out = validate(rec)
    except LineError as exc:
        return f"error: {exc}"
    tokens = out["tokens"]
    return [{k: v for k, v in t.items()} for t in (tokens.rows() if hasattr(tokens, "rows")
                                                    else tokens)]


@pytest.mark.parametrize("spoil, said", [
    ({}, None),
    ({"logprobs": {1: math.nan}}, "field 'tokens[3].logprob' must be a finite number"),
    ({"train_logprobs": {4: math.inf}, "logprobs": {5: math.nan}},
     "field 'tokens[6].train_logprob' must be a finite number"),
    ({"advantages": {0: -math.inf}}, "field 'tokens[2].advantage' must be a finite number"),
    ({"logprobs": {0: 5e-5}}, None),                   # within the slack: stored as 0.0
    ({"train_logprobs": {5: 2e-4}},
     "field 'tokens[7].train_logprob' must be a log-probability (finite and <= 0), got 0.0002"),
    ({"stored_ids": {6: 2**31}}, "field 'tokens[6].token_id' must be between 0 and 2^31-1, "
                                 "got 2147483648"),
    ({"logprobs": {2: math.nan}, "advantages": {3: math.inf}}, None),  # untrained: not kept
])
def test_columns_are_checked_as_the_same_tokens_given_as_objects(spoil, said):
    as_columns, as_objects = _rollout(**spoil)
    got, expected = _outcome(as_columns), _outcome(as_objects)
    assert got == expected
    if said:
        assert got.startswith(f"error: {said}")
    else:
        assert isinstance(got, list) and len(got) == 8
        assert [t["role"] for t in got] == ["prompt"] * 2 + ["action"] * 2 + \
            ["observation"] * 2 + ["action"] * 2
        assert [t["turn"] for t in got] == [-1, -1, 0, 0, 0, 0, 1, 1]
        slack = spoil.get("logprobs", {}).get(0) == 5e-5
        assert "logprob" not in got[4] and got[2]["logprob"] == (0.0 if slack else -0.1)


def test_an_id_no_token_can_have_is_refused_before_columns_are_made():
    with pytest.raises(LineError, match=r"field 'token ids\[6\]' must be a token id between 0 "
                                        r"and 2\^31-1, got 2147483648"):
        _rollout(ids={6: 2**31})


def test_a_recorded_step_keeps_each_bad_rollout_alone_and_writes_the_rest_in_chunks(
        tmp_path, monkeypatch):
    """SkyRL's recorder with the tiny tokenizer: a rollout with a NaN sampler logprob on a
    trained token, one whose loss mask is short and one with an id outside the tokenizer's
    vocabulary fail alone, named; the others are written
    in Arrow chunks of a few rows (ROW_CHUNK made small), every row where it belongs."""
    from core.model.models import load_tokenizer
    from storage.ingest import import_batch
    from storage.integrations.skyrl_output import SkyRLRecorder

    monkeypatch.setattr(import_batch, "ROW_CHUNK", 7)
    tokenizer = load_tokenizer("tiny")
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, answer = ids("What is 2+3?"), ids("<answer>5</answer>")
    good = [-0.5] * len(answer)
    outside = len(tokenizer) + 5  # an id no token of the tokenizer has
    output = {"prompt_token_ids": [prompt] * 5, "response_ids": [answer] * 4 + [[outside]],
              "loss_masks": [[1] * len(answer), [1] * len(answer), [1] * (len(answer) - 1),
                             [1] * len(answer), [1]],
              "rollout_logprobs": [good, [-0.5, math.nan] + good[2:], good,
                                   [5e-5] + good[1:], [-1.0]],
              "rewards": [1.0, 0.0, 0.0, 1.0, 0.0],
              "trajectory_ids": [{"instance_id": "sum", "repetition_id": k} for k in range(5)]}
    store = tmp_path / "sky.duckdb"
    recorder = SkyRLRecorder(store, tokenizer, run_id="sky")
    report = recorder.record(output, step=1)
    recorder.close()
    assert (report.imported, report.failed) == (2, 3)
    errors = " | ".join(str(e) for e in report.errors)
    assert f"field 'tokens[{len(prompt) + 1}].logprob' must be a finite number" in errors
    assert f"mask has {len(answer) - 1} entries for {len(answer)} response tokens" in errors
    assert f"token id {outside} is outside the tokenizer's vocabulary of" in errors
    with db.reading(store) as con:
        rows = con.execute("SELECT traj_id, pos, token_id, role, trained, logprob FROM tokens "
                           "ORDER BY traj_id, pos").fetchall()
    n = len(prompt) + len(answer)
    assert len(rows) == 2 * n > 7  # several chunks
    for k, tid in enumerate(("s1-sum_0", "s1-sum_3")):
        mine = rows[k * n:(k + 1) * n]
        assert [r[0] for r in mine] == [tid] * n and [r[1] for r in mine] == list(range(n))
        assert [r[2] for r in mine] == prompt + answer
        assert [r[5] for r in mine] == [None] * len(prompt) + (good if k == 0 else
                                                                [0.0] + good[1:])


def test_a_verifiers_trace_with_an_id_outside_the_vocabulary_fails_alone():
    import json
    from pathlib import Path

    from core.model.models import load_tokenizer
    from storage.ingest.door import convert
    from storage.ingest.verifiers_traces import episode_records

    tokenizer = load_tokenizer("tiny")
    line = (Path(__file__).parent / "fixtures" / "verifiers" / "traces.jsonl").read_text()
    outside = len(tokenizer) + 5  # an id no token of the tokenizer has (below 2^31)
    for spoil, said in ((outside, f"token id {outside} is outside the tokenizer's vocabulary of"),
                        (2**40, "field 'nodes[0].token_ids[0]' must be a token id between 0 "
                                f"and 2^31-1, got {2**40}")):
        episode = json.loads(line.splitlines()[0])
        episode["traces"].append(json.loads(json.dumps(episode["traces"][0])))
        episode["traces"][1]["id"] = "spoiled"
        episode["traces"][1]["nodes"][0]["token_ids"][0] = spoil
        # each trace is made under the framework's guard, as import does
        (where_good, good), (where_bad, bad) = convert("line 1",
                                                       lambda: episode_records(episode, tokenizer))
        assert (where_good, where_bad) == ("line 1[0]", "line 1[1]")
        assert len(good["tokens"]) > 0 and good["tokens"].first("logprob") is not None
        assert isinstance(bad, LineError)
        assert said in str(bad)


def test_token_text_array_is_each_tokens_text_cleaned_taken_from_the_vocabulary():
    """Issue 57: a trainer's rollout's texts are taken by id from the tokenizer's vocabulary,
    decoded and cleaned once, as one Arrow array: the same texts ``token_texts`` gives, cleaned
    as the recorder cleans every stored text (NUL -> U+2400), a character cut across tokens
    (the emoji's two tokens) on the token completing it, and joined they are the decode."""
    import numpy as np

    from core.model.models import load_tokenizer
    from storage.recorder import clean_text
    from storage.token_columns import joiner, token_text_array
    from storage.token_text import token_texts, whole_vocab

    tokenizer = load_tokenizer("tiny")
    text = "a\x00b: 🙂 héllo 中文字 € 🙂🙂"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (whole_vocab(tokenizer).state[ids] == 2).any()  # some token cuts a character
    got = token_text_array(tokenizer, np.array(ids))
    assert got.to_pylist() == [clean_text(t) for t in token_texts(tokenizer, ids)]
    assert "\u2400" in got.to_pylist() and "\x00" not in "".join(got.to_pylist())
    assert joiner(got)(0, len(ids)) == clean_text(tokenizer.decode(ids))
    assert joiner(got)(3, 5) == "".join(got.to_pylist()[3:5]) and joiner(got)(4, 4) == ""
    for bad in ([-1], [len(tokenizer)]):
        with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
            token_text_array(tokenizer, ids + bad)
    with pytest.raises(ValueError, match="token ids must be integers"):
        token_text_array(tokenizer, np.array(ids, np.float64))
