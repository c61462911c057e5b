"""Issue 50, part 1 and 3: the RL trainers' own token-level rollouts, imported with their masks,
logprobs and advantages, made by the real packages (requirements-rl.txt; CI installs them)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pages._tokens import mask_lint
from storage import db, queries
from tests.test_pages import app, demo, texts  # noqa: F401  (fixtures)

RL_EXTRAS = "verl and OpenPipe ART are optional: make extras (make test installs them)"


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).fetchall()


# -- verl's DataProto ----------------------------------------------------------------------------
def _verl_batch(tokenizer, step: int):
    """A real ``verl.DataProto`` laid out as ``RayPPOTrainer.fit`` holds it after
    ``compute_advantage``: left-padded prompts, right-padded multi-turn responses whose tool
    reply is masked out, GRPO advantages from verl's own ``compute_grpo_outcome_advantage``."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    verl = pytest.importorskip("verl", reason=RL_EXTRAS)
    from verl.trainer.ppo import core_algos

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    samples = [  # (prompt, [(text, trained)], reward)
        ("Who wrote Dune?", [("<search>Dune author</search>", 1),
                             ("<information>Frank Herbert wrote Dune.</information>", 0),
                             ("<answer>Frank Herbert</answer>", 1)], 1.0),
        ("Who wrote Dune?", [("<answer>Isaac Asimov</answer>", 1)], 0.0),
        ("What is 2+3?", [("<answer>5</answer>", 1)], 1.0),
        ("What is 2+3?", [("<answer>6</answer>", 1)], 0.0),
    ]
    prompts = [ids(p) for p, _, _ in samples]
    responses = [[(t, m) for text, m in parts for t in ids(text)] for _, parts, _ in samples]
    P, R = max(map(len, prompts)), max(map(len, responses)) + 2
    gen = torch.Generator().manual_seed(0)
    rows = {k: [] for k in ("prompts", "responses", "attention_mask", "response_mask",
                            "token_level_scores")}
    for p, r, (_, _, reward) in zip(prompts, responses, samples):
        rows["prompts"].append([pad] * (P - len(p)) + p)
        rows["responses"].append([t for t, _ in r] + [pad] * (R - len(r)))
        rows["attention_mask"].append([0] * (P - len(p)) + [1] * len(p) + [1] * len(r)
                                      + [0] * (R - len(r)))
        rows["response_mask"].append([m for _, m in r] + [0] * (R - len(r)))
        rows["token_level_scores"].append([0.0] * (len(r) - 1) + [reward] + [0.0] * (R - len(r)))
    t = {k: torch.tensor(v) for k, v in rows.items()}
    t["token_level_scores"] = t["token_level_scores"].float()
    t["token_level_rewards"] = t["token_level_scores"].clone()
    t["input_ids"] = torch.cat([t["prompts"], t["responses"]], dim=1)
    t["old_log_probs"] = -torch.rand((4, R), generator=gen) * 3
    t["rollout_log_probs"] = (t["old_log_probs"] - torch.rand((4, R), generator=gen) * 0.1)
    uid = np.array(["dune", "dune", "sum", "sum"], dtype=object)
    t["advantages"], t["returns"] = core_algos.compute_grpo_outcome_advantage(
        t["token_level_rewards"], t["response_mask"].float(), uid)
    batch = verl.DataProto.from_dict(
        tensors=t, non_tensors={"uid": uid, "data_source": np.array(["toy"] * 4, dtype=object),
                                "reward_model": np.array([{"ground_truth": "Frank Herbert"}] * 2
                                                         + [{"ground_truth": "5"}] * 2)},
        meta_info={"global_steps": step})
    return batch, samples


def test_verl_dataproto_recorded_token_by_token(tmp_path):
    pytest.importorskip("verl", reason=RL_EXTRAS)
    from core.model.models import load_tokenizer
    from storage.integrations.verl_batch import VerlBatchRecorder

    tokenizer = load_tokenizer("tiny")
    batch, samples = _verl_batch(tokenizer, step=3)
    store = tmp_path / "verl.duckdb"
    recorder = VerlBatchRecorder(store, tokenizer, run_id="verl-test", run_name="verl toy")
    report = recorder.record(batch)
    assert (report.imported, report.failed) == (4, 0), report.errors
    recorder.close()

    trajs = queries.trajectories(store, "verl-test", 3).set_index("traj_id")
    assert sorted(trajs.index) == ["s3-dune-0", "s3-dune-1", "s3-sum-0", "s3-sum-1"]
    assert set(trajs["group_id"]) == {"s3-dune", "s3-sum"}
    assert trajs.loc["s3-dune-0", "num_turns"] == 2 and trajs.loc["s3-dune-0", "reward"] == 1.0
    # GRPO over a group of two (rewards 1, 0): +-0.7071, as verl computed it
    adv = batch.batch["advantages"]
    assert trajs.loc["s3-dune-0", "advantage"] == pytest.approx(float(adv[0][0]), abs=1e-6)
    assert trajs.loc["s3-dune-1", "advantage"] == pytest.approx(-0.7071, abs=1e-3)

    toks = queries.tokens(store, "verl-test", "s3-dune-0")
    mask = batch.batch["attention_mask"][0].bool()
    assert "".join(toks["text"]) == tokenizer.decode(batch.batch["input_ids"][0][mask])
    obs = toks[toks["role"] == "observation"]
    assert "".join(obs["text"]) == "<information>Frank Herbert wrote Dune.</information>"
    assert not obs["trained"].any() and obs["logprob"].isna().all()
    act = toks[toks["role"] == "action"]
    assert act["trained"].all() and set(act["turn"]) == {0, 1}
    P = batch.batch["prompts"].shape[1]
    kept = batch.batch["response_mask"][0].bool()
    assert act["logprob"].tolist() == pytest.approx(
        batch.batch["rollout_log_probs"][0][kept].tolist())
    assert act["train_logprob"].tolist() == pytest.approx(
        batch.batch["old_log_probs"][0][kept].tolist())
    assert act["advantage"].tolist() == pytest.approx(batch.batch["advantages"][0][kept].tolist())
    assert toks["token_id"].tolist() == batch.batch["input_ids"][0][mask].tolist()
    assert (toks["role"] == "prompt").sum() == int(batch.batch["attention_mask"][0][:P].sum())
    assert mask_lint(toks, queries.turns(store, "verl-test", ["s3-dune-0"])).empty

    metrics = dict(_q(store, "SELECT name, value FROM metrics WHERE run_id = 'verl-test' "
                             "AND step = 3"))
    assert metrics["reward/mean"] == 0.5 and metrics["mismatch/kl_k3"] > 0
    assert "training/rollout_probs_diff_mean" in metrics
    assert _q(store, "SELECT status, source FROM runs") == [("finished", "import:verl-batch")]


def test_a_verl_recorders_step_derives_its_own_steps_metrics_and_reads_bfloat16(
        tmp_path, monkeypatch):
    """Issue 57: each ``record()`` derives the metrics of the step it wrote only (the whole
    run's were derived again every step, reading every token row stored so far), and they are
    what deriving the whole run gives; the step's rows and its run's record are written in one
    transaction, and if the latter fails the rows are written all the same; a batch whose
    logprobs are bfloat16 (no numpy dtype: read a row at a time) is recorded with the same
    values as its float32 copy."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("verl", reason=RL_EXTRAS)
    from core.model.models import load_tokenizer
    from storage.ingest import import_batch
    from storage.ingest.step_metrics import rederive_metrics
    from storage.integrations import step_recorder
    from storage.integrations.verl_batch import VerlBatchRecorder

    tokenizer = load_tokenizer("tiny")
    store = tmp_path / "verl.duckdb"
    recorder = VerlBatchRecorder(store, tokenizer, run_id="v")
    opened = []
    monkeypatch.setattr(import_batch.db, "writing", lambda path, *args, real=import_batch.db.writing:
                        opened.append(1) or real(path, *args))
    assert recorder.record(_verl_batch(tokenizer, step=1)[0]).imported == 4
    assert len(opened) == 1  # rows, metrics, status and the imports row: one transaction
    assert _q(store, "SELECT lines, imported, errors FROM imports") == [(4, 4, "[]")]
    monkeypatch.setattr(step_recorder, "finish_in", lambda *a, **k: 1 / 0)
    assert recorder.record(_verl_batch(tokenizer, step=9)[0]).imported == 4
    assert _q(store, "SELECT count(DISTINCT traj_id) FROM tokens WHERE step = 9") == [(4,)]
    assert _q(store, "SELECT imported FROM imports ORDER BY ALL") == [(4,), (4,)]
    with db.writing(store) as con:  # a stand-in value: deriving step 1 again would replace it
        con.execute("UPDATE metrics SET value = 99 WHERE run_id = 'v' AND step = 1 "
                    "AND name = 'reward/mean'")
    batch = _verl_batch(tokenizer, step=2)[0]
    for key in ("old_log_probs", "rollout_log_probs"):
        batch.batch[key] = batch.batch[key].to(torch.bfloat16)
    report = recorder.record(batch)
    assert (report.imported, report.failed) == (4, 0), report.errors
    assert _q(store, "SELECT value FROM metrics WHERE step = 1 AND name = 'reward/mean'") == \
        [(99.0,)]
    sql = "SELECT step, name, value FROM metrics WHERE run_id = 'v' ORDER BY ALL"
    by_step = [r for r in _q(store, sql) if r[0] == 2]
    recorder.close()  # the end of the run: the whole run's, once
    assert _q(store, "SELECT value FROM metrics WHERE step = 1 AND name = 'reward/mean'") == \
        [(0.5,)]
    with db.writing(store) as con:
        rederive_metrics(con, "v")
    assert by_step == [r for r in _q(store, sql) if r[0] == 2] and len(by_step) > 5
    toks = queries.tokens(store, "v", "s2-dune-0")
    kept = batch.batch["response_mask"][0].bool()
    assert toks[toks["trained"]]["logprob"].tolist() == \
        batch.batch["rollout_log_probs"][0][kept].double().tolist()


# -- OpenPipe ART ----------------------------------------------------------------------------------
def _art_logs(art_path) -> tuple:
    """Two steps of ART trajectory logs, made with ART's own classes and written where and how its
    backend's ``_log`` writes them (``serialize_trajectory_groups`` into the model's
    ``trajectories/{split}/{step:04d}.jsonl``)."""
    art = pytest.importorskip("art", reason=RL_EXTRAS)
    from art.types import Choice
    from art.utils.output_dirs import get_model_dir, get_trajectories_split_dir
    from art.utils.trajectory_logging import serialize_trajectory_groups

    def rollout(answer: str, correct: int) -> "art.Trajectory":
        call = {"id": "c1", "type": "function",
                "function": {"name": "add", "arguments": '{"x": 2, "y": 3}'}}
        return art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": "You can call tools."},
                {"role": "user", "content": "What is 2+3?"},
                Choice(finish_reason="tool_calls", index=0,
                       message={"role": "assistant", "content": None, "tool_calls": [call]}),
                {"role": "tool", "tool_call_id": "c1", "content": "5"},
                Choice(finish_reason="stop", index=0,
                       message={"role": "assistant", "content": answer})],
            tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}],
            reward=float(correct), metrics={"correct": correct}, metadata={"task": "add-2-3"})

    model = art.Model(name="agent-001", project="toy")
    folder = get_model_dir(model=model, art_path=str(art_path))
    for split, step in (("train", 3), ("val", 3)):
        out = get_trajectories_split_dir(folder, split)
        (art_path / out).mkdir(parents=True, exist_ok=True)
        groups = [art.TrajectoryGroup([rollout("5", 1), rollout("6", 0)]),
                  art.TrajectoryGroup([rollout("5", 1)])]
        (art_path / out / f"{step:04d}.jsonl").write_text(serialize_trajectory_groups(groups))
    return art_path / folder / "trajectories"


def test_art_trajectory_groups_import_with_their_groups_steps_and_splits(tmp_path):
    from storage.ingest.files import guess_format, import_file

    logs = _art_logs(tmp_path)
    # art's import tries to patch transformers' masking process-wide (for an older signature):
    # with transformers 5 it does not apply; if it ever did, every later forward in the suite
    # would run through it, so say so here
    from transformers import masking_utils
    assert masking_utils._preprocess_mask_arguments.__module__ == "transformers.masking_utils"
    assert guess_format(logs) == "art"
    store = tmp_path / "art.duckdb"
    report = import_file(logs, store, run_id="art-test")
    assert (report.imported, report.failed) == (6, 0), report.errors
    trajs = queries.trajectories(store, "art-test").set_index("traj_id")
    assert set(trajs["split"]) == {"train", "eval"}  # ART's val folder is held out
    assert set(trajs["step"]) == {3}
    train = trajs[trajs["split"] == "train"]
    assert sorted(train["group_id"]) == ["train-3-g1", "train-3-g1", "train-3-g2"]
    one = trajs.loc["train/0003:1:0"]
    assert (one["reward"], one["success"], one["num_turns"]) == (1.0, True, 2)
    assert not trajs.loc["train/0003:1:1", "success"]
    turns = queries.turns(store, "art-test", ["train/0003:1:0"])
    assert turns["action_type"].tolist() == ["tool", "answer"]
    assert "5" in turns["observation"][0] and turns["action"].iloc[-1] == "5"
    groups = queries.groups(store, "art-test", 3)
    assert groups.set_index("group_id").loc["train-3-g1", "size"] == 2

    # followed: ART's val folder, each log once it is stable, into the ids import gives
    from storage.ingest.follow import Follower
    follower = Follower(logs / "val", store, "art", "art-val", log=lambda m: None)
    try:
        follower.poll_once()  # the first look sees the file, the second finds it stable
        assert follower.poll_once() == 1
    finally:
        follower.close()
    followed = queries.trajectories(store, "art-val").set_index("traj_id")
    assert sorted(followed.index) == sorted(trajs[trajs["split"] == "eval"].index)
    assert set(followed["split"]) == {"eval"}


# -- verifiers (prime-rl) --------------------------------------------------------------------------
VERIFIERS = Path(__file__).parent / "fixtures" / "verifiers"
"""traces.jsonl written by verifiers 0.4.0's own Trace/Episode classes and write_episode
(make_traces.py beside it says how, and why not in this venv: verifiers needs openai < 3)."""


def test_verifiers_traces_import_token_level_and_follow(tmp_path, capsys):
    from core.model.models import load_tokenizer
    from storage import io
    from storage.ingest.feed import write_records
    from storage.ingest.files import guess_format
    from storage.ingest.follow import Follower
    from storage.ingest.import_batch import finish_import
    from storage.ingest.report import ImportReport
    from storage.ingest.verifiers_traces import read_verifiers
    from storage.migrations import prepare

    episodes = [json.loads(line) for line in (VERIFIERS / "traces.jsonl").read_text().splitlines()]
    run_dir = tmp_path / "outputs" / "toy"
    run_dir.mkdir(parents=True)
    shutil.copy(VERIFIERS / "traces.jsonl", run_dir / "traces.jsonl")
    assert guess_format(tmp_path / "outputs") == "verifiers"

    # with the model's tokenizer (Python API): each token's own text
    tokenizer, store = load_tokenizer("tiny"), tmp_path / "vf.duckdb"
    prepare(store)
    report, run = ImportReport("vf", "traces.jsonl", "verifiers"), {"name": "vf", "config": None,
                                                                  "created": False}
    write_records(((w, r, 0) for w, r in read_verifiers(run_dir, tokenizer=tokenizer)),
                  store, "verifiers", "vf", run, report)
    finish_import(store, "vf", "verifiers", run, report)
    assert (report.imported, report.failed) == (4, 0), report.errors
    trajs = queries.trajectories(store, "vf").set_index("traj_id")
    first = episodes[0]["traces"][0]
    assert set(trajs.index) == {e["traces"][0]["id"] for e in episodes}
    row = trajs.loc[first["id"]]
    assert (row["step"], row["split"], row["group_id"], row["reward"], row["success"]) == \
        (2, "train", "g0", 1.0, True)
    assert sorted(trajs["split"]) == ["eval", "eval", "train", "train"]  # prime-rl's eval work
    assert row["advantage"] == pytest.approx(0.7071)

    toks = queries.tokens(store, "vf", first["id"])
    ids = [i for n in first["nodes"] for i in n["token_ids"]]
    assert toks["token_id"].tolist() == ids
    assert "".join(toks["text"]) == tokenizer.decode(ids)
    sampled = [lp for n in first["nodes"] for lp in n["logprobs"]]
    act = toks[toks["trained"]]
    assert (act["role"] == "action").all() and act["logprob"].tolist() == pytest.approx(sampled)
    assert act["train_logprob"].tolist() == pytest.approx(
        [x for n in first["nodes"] for x in n.get("trainer_logprobs") or []])
    obs = toks[toks["role"] == "observation"]
    assert "5" in "".join(obs["text"]) and not obs["trained"].any()  # the tool's reply
    assert mask_lint(toks, queries.turns(store, "vf", [first["id"]])).empty
    turns = queries.turns(store, "vf", [first["id"]])
    assert turns["action_type"].tolist() == ["tool", "answer"]
    assert "training/rollout_probs_diff_mean" in dict(_q(
        store, "SELECT name, value FROM metrics WHERE run_id = 'vf' AND step = 2"))

    # the command line (no tokenizer): ids, masks and logprobs kept, the text says it is ids
    cli_store = tmp_path / "cli.duckdb"
    assert io.main(["import", str(tmp_path / "outputs"), "--db", str(cli_store),
                    "--run-id", "vf-cli"]) == 0
    assert "4 imported" in capsys.readouterr().out
    cli = queries.tokens(cli_store, "vf-cli", first["id"])
    assert cli[cli["trained"]]["logprob"].tolist() == act["logprob"].tolist()
    assert cli["text"].iloc[0] == f"<{ids[0]}>"
    # ... with --tokenizer (the model's tokenizer.json, read without transformers): the text
    assert io.main(["import", str(run_dir), "--db", str(cli_store), "--run-id", "vf-tok",
                    "--tokenizer", tokenizer.name_or_path]) == 0
    assert queries.tokens(cli_store, "vf-tok", first["id"])["text"].tolist() == \
        toks["text"].tolist()
    assert io.main(["import", str(run_dir), "--db", str(cli_store), "--run-id", "vf-bad",
                    "--tokenizer", str(tmp_path / "nothing")]) == 2
    assert "not a readable tokenizer.json" in capsys.readouterr().err

    # followed as vf-eval appends it: a line at a time, the same ids and texts
    from storage.ingest.verifiers_traces import TokenizerFile
    follower = Follower(run_dir, tmp_path / "f.duckdb", "verifiers", "vf-f", log=lambda m: None,
                        tokenizer=TokenizerFile(tokenizer.name_or_path))
    try:
        assert follower.poll_once() == 1
    finally:
        follower.close()
    assert set(queries.trajectories(tmp_path / "f.duckdb", "vf-f")["traj_id"]) == set(trajs.index)
    assert queries.tokens(tmp_path / "f.duckdb", "vf-f", first["id"])["text"].tolist() == \
        toks["text"].tolist()


# -- SkyRL ---------------------------------------------------------------------------------------
def test_skyrl_generator_output_recorded_token_by_token(tmp_path):
    """skyrl-train 0.3.1 requires Python 3.12 (this venv is 3.11): the GeneratorOutput is built in
    the shape skyrl_train.generators.base declares (a TypedDict of lists), not by the package."""
    from core.model.models import load_tokenizer
    from storage.integrations.skyrl_output import SkyRLRecorder

    tokenizer = load_tokenizer("tiny")
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = ids("Who wrote Dune?")
    act, obs, ans = ids("<search>Dune</search>"), ids("<information>Herbert</information>"), \
        ids("<answer>Frank Herbert</answer>")
    output = {
        "prompt_token_ids": [prompt, prompt],
        "response_ids": [act + obs + ans, ids("<answer>Asimov</answer>")],
        "loss_masks": [[1] * len(act) + [0] * len(obs) + [1] * len(ans),
                       [1] * len(ids("<answer>Asimov</answer>"))],
        "rollout_logprobs": [[-0.5] * (len(act) + len(obs) + len(ans)),
                             [-1.0] * len(ids("<answer>Asimov</answer>"))],
        "rewards": [1.0, [0.0] * len(ids("<answer>Asimov</answer>"))],  # per rollout or token
        "trajectory_ids": [{"instance_id": "dune", "repetition_id": 0},
                           {"instance_id": "dune", "repetition_id": 1}],
        "stop_reasons": ["stop", "length"], "rollout_metrics": None, "is_last_step": None,
    }
    store = tmp_path / "skyrl.duckdb"
    recorder = SkyRLRecorder(store, tokenizer, run_id="sky")
    report = recorder.record(output, step=5)
    recorder.close()
    assert (report.imported, report.failed) == (2, 0), report.errors
    trajs = queries.trajectories(store, "sky", 5).set_index("traj_id")
    assert set(trajs.index) == {"s5-dune_0", "s5-dune_1"} and set(trajs["group_id"]) == {"s5-dune"}
    assert trajs.loc["s5-dune_0", "num_turns"] == 2 and trajs.loc["s5-dune_1", "reward"] == 0.0
    toks = queries.tokens(store, "sky", "s5-dune_0")
    assert toks["token_id"].tolist() == prompt + act + obs + ans
    assert "".join(toks[toks["role"] == "observation"]["text"]) == \
        "<information>Herbert</information>"
    assert toks[toks["trained"]]["logprob"].eq(-0.5).all()
    assert mask_lint(toks, queries.turns(store, "sky", ["s5-dune_0"])).empty
    cut = queries.turns(store, "sky", ["s5-dune_1"])
    assert bool(cut["action_truncated"].iloc[-1])


def test_pages_on_a_recorded_verl_batch(app, tmp_path):
    """Replay's token view coloured by mismatch and advantage, Groups and Dynamics (its mismatch
    charts) load on the import."""
    pytest.importorskip("verl", reason=RL_EXTRAS)
    from core.model.models import load_tokenizer
    from storage.integrations.verl_batch import VerlBatchRecorder

    tokenizer = load_tokenizer("tiny")
    store = tmp_path / "verl.duckdb"
    recorder = VerlBatchRecorder(store, tokenizer, run_id="verl-pages")
    for step in (1, 2):
        recorder.record(_verl_batch(tokenizer, step)[0])
    recorder.close()
    for colour in ("mismatch", "advantage"):
        at = app("replay", store_dir=str(tmp_path), store=str(store), run="verl-pages", step=2,
                 traj="s2-dune-0", turn=1, colour=colour)
        assert not at.exception, at.exception
        said = " ".join(texts(at, "info") + texts(at, "warning"))
        assert "recorded no" not in said and "observation/prompt token trained" not in said
    at = app("groups", store_dir=str(tmp_path), store=str(store), run="verl-pages", step=2,
             group="s2-dune")
    assert not at.exception, at.exception
    at = app("dynamics", store_dir=str(tmp_path), store=str(store), run="verl-pages")
    assert not at.exception, at.exception
    captions = " ".join(texts(at, "caption"))
    assert "verl's training/rollout_probs_diff_*" in captions  # the mismatch charts are drawn
    assert "Mismatch" not in captions.split("Not recorded in this run:")[-1]


def test_a_real_vf_eval_run_imports_as_its_evaluation(tmp_path):
    """tests/fixtures/verifiers/vf-eval: vf-eval 0.4.0 run against agentrl endpoint (tiny), upload
    off (toy_sum_taskset.py says how): a standalone evaluation, text only, 3 tasks x 2."""
    from storage.ingest.files import guess_format, import_file

    run = VERIFIERS / "vf-eval"
    assert guess_format(run) == "verifiers"
    store = tmp_path / "vfe.duckdb"
    report = import_file(run, store, run_id="vfe")
    assert (report.imported, report.failed) == (6, 0), report.errors
    trajs = queries.trajectories(store, "vfe")
    assert set(trajs["split"]) == {"eval"} and set(trajs["step"]) == {0}
    assert sorted(trajs.groupby("group_id").size()) == [2, 2, 2]  # -r 2: a task's rollouts
    assert trajs["prompt"].str.contains(r"What is \d\+2\?").all()
    assert (trajs["reward"] == 0.0).all() and not trajs["success"].any()  # the tiny model
    turns = queries.turns(store, "vfe", trajs["traj_id"].tolist())
    assert len(turns) == 6 and turns["action"].str.len().gt(0).all()
    # --split overrides the format's own (ours: a second run to pair on Compare, say)
    import_file(run, store, run_id="vfe-as-train", split="train")
    assert set(queries.trajectories(store, "vfe-as-train")["split"]) == {"train"}


def test_a_bad_verifiers_trace_fails_alone_naming_why():
    from storage.ingest.door import convert
    from storage.ingest.verifiers_traces import episode_records

    def spoiled(change):  # each trace is made under the framework's guard, as import does
        ep = json.loads((VERIFIERS / "traces.jsonl").read_text().splitlines()[0])
        change(ep["traces"][0]["nodes"])
        return str(convert("line 1", lambda: episode_records(ep))[0][1])

    def huge(nodes):
        nodes[1].update(token_ids=[1] * 200_000, mask=[False] * 200_000)

    assert "200058 token ids on the branch, over the limit of 131072" in spoiled(huge)
    assert "mask has 1 entries for" in spoiled(lambda n: n[1].update(mask=[False]))
    assert "logprobs has 2 values for" in spoiled(lambda n: n[2].update(logprobs=[-1.0, -2.0]))
    assert "is not an earlier node" in spoiled(lambda n: n[0].update(parent=4))
    assert "a 'traces' list" in str(episode_records({"traces": None})[0])
