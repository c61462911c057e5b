"""storage.integrations.trl.RecorderCallback on a real TRL GRPOTrainer (tiny model, 2 steps):
what the store holds afterwards, and that every page opens the run.

TRL is optional (requirements-trl.txt; `make extras`, which `make test` runs, installs it): without it these tests are skipped.
"""
from __future__ import annotations

import json

import math
from pathlib import Path

import duckdb
import pytest

pytest.importorskip("trl", reason="TRL is optional: make extras (make test installs it)")

import streamlit as st  # noqa: E402
import streamlit.testing.v1.app_test as app_test  # noqa: E402
from streamlit.runtime.pages_manager import PagesManager  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from storage import queries  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
G, PROMPTS, STEPS, NEW_TOKENS = 4, 2, 2, 6


def format_reward(completions, **kw) -> list[float]:
    """Half the completions score (a letter first): spread inside groups."""
    return [1.0 if c[-1]["content"][:1].isalpha() else 0.0 for c in completions]


def length_reward(completions, **kw) -> list[float]:
    return [len(c[-1]["content"]) / 100 for c in completions]


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """(store path, callback) after 2 GRPOTrainer steps recorded by the callback."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from core.model.policy import load_base_model, load_tokenizer
    from storage.integrations.trl import RecorderCallback

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("trl")
    tok = load_tokenizer("tiny")
    model = load_base_model("tiny", vocab_size=len(tok))
    model.requires_grad_(True)
    prompts = [[{"role": "user", "content": "Name a colour."}],
               [{"role": "user", "content": "Say <b>hi</b> & go"}]]
    data = Dataset.from_list([{"prompt": p} for p in prompts] * (STEPS + 1))
    args = GRPOConfig(
        output_dir=str(base / "out"), per_device_train_batch_size=PROMPTS * G, num_generations=G,
        max_completion_length=NEW_TOKENS, temperature=1.0, beta=0.01, learning_rate=1e-4,
        max_steps=STEPS, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, seed=0, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
        reward_weights=[1.0, 0.5])
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      bias="none", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=[format_reward, length_reward], args=args,
                          train_dataset=data, processing_class=tok, peft_config=lora)
    callback = RecorderCallback(base / "trl.duckdb", run_name="trl grpo test")
    trainer.add_callback(callback)  # the one line a TRL user adds
    trainer.train()
    return base / "trl.duckdb", callback


def rows(path, sql, *params):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def test_run_row_and_config(trl_run):
    path, cb = trl_run
    (run_id, name, status, source, config), = rows(
        path, "SELECT run_id, name, status, source, config FROM runs")
    assert (run_id, name, status, source) == (cb.run_id, "trl grpo test", "finished", "trl")
    for key in ('"env": "trl"', '"algo":', '"model":', '"num_generations": 4',
                '"reward_funcs": ["format_reward", "length_reward"]'):
        assert key in config


def test_every_completion_is_a_trajectory_in_groups_of_G(trl_run):
    path, cb = trl_run
    got = rows(path, "SELECT step, group_id, count(*), count(DISTINCT task_id) FROM trajectories "
                     "GROUP BY ALL ORDER BY ALL")
    assert [r[0] for r in got] == [1, 1, 2, 2]  # TRL's global_step numbering
    assert all(r[2] == G and r[3] == 1 for r in got)
    (n, ntraj), = rows(path, "SELECT count(*), count(DISTINCT traj_id) FROM trajectories")
    assert n == ntraj == STEPS * PROMPTS * G


def test_reward_components_add_up_to_trl_reward(trl_run):
    path, _ = trl_run
    comps = rows(path, "SELECT traj_id, component, value FROM rewards ORDER BY ALL")
    by = {}
    for tid, c, v in comps:
        by.setdefault(tid, {})[c] = v
    trajs = dict(rows(path, "SELECT traj_id, reward FROM trajectories"))
    assert by.keys() == trajs.keys()
    for tid, c in by.items():
        assert {"outcome", "format", "cost", "process", "format_reward", "length_reward"} <= c.keys()
        assert c["format"] == c["format_reward"]  # weight 1, named as the format component
        assert math.isclose(c["outcome"], 0.5 * c["length_reward"], abs_tol=1e-9)  # weighted
        assert math.isclose(c["outcome"] + c["format"] + c["cost"] + c["process"], trajs[tid],
                            abs_tol=1e-9)


def test_advantages_are_trl_grpo_advantages(trl_run):
    path, _ = trl_run
    got = rows(path, "SELECT group_id, list(reward ORDER BY traj_id), "
                     "list(advantage ORDER BY traj_id) FROM trajectories GROUP BY group_id")
    for _, rewards, advs in got:
        mean = sum(rewards) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (G - 1))
        for r, a in zip(rewards, advs):
            assert math.isclose(a, (r - mean) / (std + 1e-4), rel_tol=1e-4, abs_tol=1e-5)


def test_tokens_prompt_and_action_with_logprobs_entropies_and_mask(trl_run):
    path, _ = trl_run
    (tid, step, n_action, n_prompt), = rows(
        path, "SELECT traj_id, step, count(*) FILTER (role = 'action'), "
              "count(*) FILTER (role = 'prompt') FROM tokens WHERE traj_id = 's1-g1-r2' GROUP BY ALL")
    assert step == 1 and 1 <= n_action <= NEW_TOKENS and n_prompt > 5
    toks = rows(path, "SELECT pos, role, trained, logprob, entropy, ref_logprob, advantage, turn, "
                      "text FROM tokens WHERE traj_id = ? ORDER BY pos", tid)
    assert [t[0] for t in toks] == list(range(len(toks)))
    assert "Say <b>hi</b> & go" in "".join(t[8] for t in toks if t[1] == "prompt")
    adv, = rows(path, "SELECT advantage FROM trajectories WHERE traj_id = ?", tid)[0]
    for pos, role, trained, lp, ent, ref, a, turn, _ in toks:
        if role == "prompt":
            assert not trained and lp is None and turn == -1
        else:
            assert trained and turn == 0 and math.isclose(a, adv)
            assert lp < 0 and ent > 0 and ref < 0  # sampling logprob, entropy, reference
    # the recorded action text is what TRL decoded for the completion
    action, = rows(path, "SELECT action FROM turns WHERE traj_id = ?", tid)[0]
    assert "".join(t[8] for t in toks if t[1] == "action").strip() == action.strip()


def test_trl_metrics_mapped_onto_our_names(trl_run):
    path, _ = trl_run
    names = {(s, n) for s, n in rows(path, "SELECT step, name FROM metrics")}
    for step in (1, 2):
        for name in ("reward/mean", "reward/std", "reward/group_std_mean", "reward/frac_zero_std",
                     "success/rate", "policy/kl", "policy/entropy", "policy/clipfrac",
                     "grad/norm", "response/length_mean", "env/turns_mean", "time/step_s",
                     "time/record_s", "trl/reward", "trl/kl"):
            assert (step, name) in names, (step, name)
    ours, trls = rows(path, "SELECT max(value) FILTER (name = 'reward/mean'), "
                            "max(value) FILTER (name = 'trl/reward') FROM metrics WHERE step = 1")[0]
    assert math.isclose(ours, trls, rel_tol=1e-5)


def test_one_transaction_per_step_and_cost_measured(trl_run):
    _, cb = trl_run
    assert len(cb.record_s) == STEPS and all(0 < s < 5 for s in cb.record_s)


# -- the pages open the run ---------------------------------------------------------------------
class _NavigationPagesManager(PagesManager):
    def __init__(self, *args, **kwargs):  # as tests/test_pages.py: keep st.navigation's state
        super().__init__(*args, **kwargs)
        PagesManager.uses_pages_directory = False


@pytest.mark.parametrize("page,params,expect", [
    ("runs", {}, "trl grpo test"),
    ("replay", {"step": 1, "traj": "s1-g1-r2", "turn": 0}, "group s1-g1"),
    ("groups", {"step": 1, "group": "s1-g0"}, "stored advantage"),
    ("dynamics", {}, "grad/norm"),
    ("failures", {}, f"{STEPS * PROMPTS * G} trajectories match")])
def test_pages_open_the_trl_run(trl_run, monkeypatch, page, params, expect):
    path, cb = trl_run
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(path.parent))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.query_params.update({"store": str(path), "run": cb.run_id,
                            **{k: str(v) for k, v in params.items()}})
    at = at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    shown = " ".join([str(e.value) for kind in ("markdown", "caption", "subheader", "info",
                                                 "html")
                      for e in getattr(at, kind)]
                     + [f.value.to_string() + " ".join(map(str, f.value.columns))
                        for f in at.dataframe])
    assert expect in shown


def _open(trl_run, monkeypatch, page: str, **params) -> AppTest:
    path, cb = trl_run
    monkeypatch.setattr(app_test, "PagesManager", _NavigationPagesManager)
    monkeypatch.setenv(queries.STORE_DIRS_ENV, str(path.parent))
    monkeypatch.chdir(ROOT)
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.query_params.update({"store": str(path), "run": cb.run_id,
                            **{k: str(v) for k, v in params.items()}})
    at = at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_groups_lists_the_steps_completions_with_each_reward_function_once(trl_run, monkeypatch):
    """As TRL logs them: a row per completion of the step with its prompt, completion and each
    reward function's value; the contract's components that restate them (format, outcome) are
    not shown beside them, here nor in the group's credit table."""
    at = _open(trl_run, monkeypatch, "groups", step=1, group="s1-g0")
    table = next(f.value for f in at.dataframe if "completion" in f.value.columns)
    assert len(table) == PROMPTS * G
    assert {"prompt", "completion", "format_reward", "length_reward", "reward",
            "advantage"} <= set(table.columns)
    assert not {"format", "outcome", "cost", "process"} & set(table.columns)
    assert table["completion"].str.len().gt(0).all()
    credit = next(f.value for f in at.dataframe if "stored advantage" in " ".join(
        map(str, f.value.columns)) or "format_reward" in f.value.columns and
        "completion" not in f.value.columns)
    assert "format_reward" in credit.columns and "format" not in credit.columns


def test_failures_does_not_classify_a_trl_runs_completions(trl_run, monkeypatch):
    """The taxonomy reads agent episodes (turns, answers, finish reasons); a TRL completion is
    scored by reward functions instead: no class chart, filter or column, and the page says why."""
    at = _open(trl_run, monkeypatch, "failures")
    said = [t.value for t in at.info if "no failure class applies" in t.value]
    assert said and "format" in said[0] and "length" in said[0], [t.value for t in at.info]
    assert not at.get("plotly_chart")
    assert not [m for m in at.multiselect if m.key == "fail_classes"]
    results = next(f for f in at.dataframe if "traj_id" in f.value.columns)
    assert "failure_class" not in list(results.proto.column_order)


def test_dynamics_opens_a_trl_run_on_its_reward_functions(trl_run, monkeypatch):
    at = _open(trl_run, monkeypatch, "dynamics")
    specs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    titles = [f["layout"].get("title", {}).get("text") for f in specs]
    assert "Mean reward per reward function" in titles, titles
    rewards = specs[titles.index("Mean reward per reward function")]
    assert {t["name"] for t in rewards["data"]} == {"trl/rewards/format_reward/mean",
                                                    "trl/rewards/length_reward/mean"}


# -- how a run ends without on_train_end ------------------------------------------------------
ENDING = """
import sys, time
from pathlib import Path
from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer
from core.model.policy import load_base_model, load_tokenizer
from storage.integrations.trl import RecorderCallback
store, out, mode = sys.argv[1:4]
calls = []
def reward(completions, **kw):
    calls.append(1)
    if len(calls) == 2 and mode == "hang":
        Path(out, "in-step-2").write_text("")
        time.sleep(300)  # the test's SIGTERM comes while step 2 scores its completions
    if len(calls) == 2:
        raise RuntimeError("reward server down " + "x" * 100_000)
    return [float(len(c[-1]["content"])) for c in completions]
tok = load_tokenizer("tiny")
model = load_base_model("tiny", vocab_size=len(tok)).requires_grad_(True)
data = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 8)
args = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=4, max_steps=3, logging_steps=1, report_to="none",
                  use_cpu=True, save_strategy="no", disable_tqdm=True)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                      processing_class=tok, peft_config=LoraConfig(r=2, target_modules=["q_proj"],
                                                                   task_type="CAUSAL_LM"))
trainer.add_callback(RecorderCallback(store))
if mode == "caught":  # a script that reports the error itself and exits
    try:
        trainer.train()
    except RuntimeError:
        print("training failed", file=sys.stderr)
        sys.exit(1)
trainer.train()
"""


def _ending(tmp_path, mode: str):
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-c", ENDING, str(tmp_path / "end.duckdb"),
                             str(tmp_path), mode], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _end_row(tmp_path):
    (status, error, steps), = rows(tmp_path / "end.duckdb",
                                   "SELECT status, error, (SELECT list(DISTINCT step) FROM "
                                   "trajectories) FROM runs")
    return status, error, steps


@pytest.mark.parametrize("mode", ["uncaught", "caught"])
def test_a_crashed_training_records_the_exception_that_ended_it(tmp_path, mode):
    """The reward function's own exception (type, message, step, where), bounded in length;
    uncaught, or caught by the script which then exits."""
    proc = _ending(tmp_path, mode)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    status, error, steps = _end_row(tmp_path)
    assert status == "failed"
    assert error.startswith("RuntimeError: reward server down xxx"), error[:200]
    assert "(100000 more characters)" not in error and "more characters)" in error
    assert "during step 2" in error and "in reward" in error  # the reward function's frame
    assert len(error) < 2000
    assert steps == [1]  # the step before the crash was written whole


def test_sigterm_marks_the_run_stopped_and_the_process_still_dies_of_it(tmp_path):
    """A real SIGTERM to a training process in the middle of step 2: the run is 'stopped' with
    the signal and step as its reason (not left 'running', later shown 'interrupted'), step 1
    is kept, and the process dies of SIGTERM as it would without the callback."""
    import signal
    import time
    proc = _ending(tmp_path, "hang")
    deadline = time.monotonic() + 300
    while not (tmp_path / "in-step-2").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "step 2 never started"
        time.sleep(0.2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert time.monotonic() - t0 < 15  # marked within the handler's bound, then gone
    status, error, steps = _end_row(tmp_path)
    assert (status, error, steps) == ("stopped", "SIGTERM during step 2", [1])


def _tiny_trainer(out, reward_funcs, steps: int):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from core.model.policy import load_base_model, load_tokenizer
    tok = load_tokenizer("tiny")
    model = load_base_model("tiny", vocab_size=len(tok)).requires_grad_(True)
    prompts = [[{"role": "user", "content": "Name a colour."}], [{"role": "user", "content": "hi"}]]
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=4, max_steps=steps, logging_steps=1,
                      report_to="none", save_strategy="no", use_cpu=True, seed=0,
                      shuffle_dataset=False, disable_tqdm=True)
    return GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args,
                       train_dataset=Dataset.from_list([{"prompt": p} for p in prompts] * 2),
                       processing_class=tok, peft_config=LoraConfig(
                           r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))


def test_recording_block_marks_the_run_failed_at_once_and_restores_sigterm(tmp_path):
    """``with callback.recording()`` in a process that goes on (a notebook): the run is failed
    with the exception as soon as it leaves train(), and the SIGTERM handler is Python's again."""
    import signal

    from storage.integrations.trl import RecorderCallback

    def broken_reward(completions, **kw):
        raise ValueError("judge returned 'n/a'")

    cb = RecorderCallback(tmp_path / "r.duckdb")
    trainer = _tiny_trainer(tmp_path / "out", [broken_reward], steps=1)
    trainer.add_callback(cb)
    with pytest.raises(ValueError, match="judge returned"):
        with cb.recording():
            trainer.train()
    (status, error), = rows(tmp_path / "r.duckdb", "SELECT status, error FROM runs")
    assert status == "failed" and error.startswith("ValueError: judge returned 'n/a' "
                                                   "(during step 1; at ")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_inf_reward_is_recorded_as_trl_saw_it_and_the_step_flagged(tmp_path):
    """One +inf reward in group 0: TRL's group mean is inf, its advantages NaN -> nan_to_num 0.0.
    Stored: the reward inf (not its finite part), the advantages TRL trained on, a note on the
    group's trajectories and reward/nonfinite_count; reward/mean over the finite rewards."""
    from storage.integrations.trl import RecorderCallback
    from storage.integrations.trl_rows import NONFINITE_NOTE

    def inf_reward(completions, **kw):
        return [math.inf if i == 0 else float(i) for i in range(len(completions))]

    trainer = _tiny_trainer(tmp_path / "out", [inf_reward], steps=1)
    trainer.add_callback(RecorderCallback(tmp_path / "inf.duckdb"))
    trainer.train()
    trained_on = list(trainer._logs["advantages"])[-2 * G:]  # what TRL's loss used
    got = rows(tmp_path / "inf.duckdb", "SELECT traj_id, reward, advantage, "
               "info->>'$.import_notes' LIKE '%not finite%' FROM trajectories ORDER BY traj_id")
    assert [g[0] for g in got] == [f"s1-g{k}-r{i}" for k in range(2) for i in range(G)]
    assert [g[1] for g in got] == [math.inf] + [float(i) for i in range(1, 2 * G)]
    assert [g[2] for g in got] == trained_on
    assert trained_on[:G] == [0.0] * G and all(a != 0 for a in trained_on[G:])
    assert [g[3] for g in got] == [True] * G + [False] * G
    assert NONFINITE_NOTE.startswith("a reward in this group is not finite")
    (outcome, raw), = rows(tmp_path / "inf.duckdb", "SELECT max(value) FILTER (component = "
                           "'outcome'), max(value) FILTER (component = 'inf_reward') FROM "
                           "rewards WHERE traj_id = 's1-g0-r0'")
    assert outcome == raw == math.inf
    metrics = dict(rows(tmp_path / "inf.duckdb", "SELECT name, value FROM metrics WHERE step = 1"))
    assert metrics["reward/nonfinite_count"] == 1
    assert metrics["reward/mean"] == pytest.approx(sum(range(1, 2 * G)) / (2 * G - 1))
    assert "reward/group_std_mean" in metrics and metrics["reward/frac_zero_std"] == 0.0


def test_the_groups_estimators_say_not_computable_for_an_inf_reward():
    """Groups recomputes what each estimator would give a group; a TRL group holding an inf
    reward once raised "rewards contain NaN or inf" there. Now those columns are NaN."""
    import pandas as pd
    from pages import _credit
    trajs = pd.DataFrame({"traj_id": ["a", "b", "c"], "reward": [1.0, float("inf"), 0.0],
                          "advantage": [0.0, 0.0, 0.0]})
    table = _credit.outcome_table(trajs)
    assert not _credit.finite_rewards(trajs) and table[["GRPO", "RLOO"]].isna().all().all()
    ok = _credit.outcome_table(trajs.assign(reward=[1.0, 0.0, 0.0]))
    assert ok["Dr.GRPO"].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_a_trl_run_reads_as_one_its_base_model_and_grpos_loss_type():
    """A PEFT-wrapped model was recorded as "PeftModelForCausalLM" and the algorithm as TRL's
    default loss_type, "dapo"; now the base model's name and "GRPO (loss_type=dapo)"."""
    from types import SimpleNamespace
    from pages._common import algo_label
    from storage.integrations.trl_rows import model_name, run_config
    from core.model.policy import load_policy
    policy = load_policy("tiny", seed=0)
    assert type(policy.model).__name__.startswith("Peft")
    assert model_name(policy.model) != type(policy.model).__name__
    assert model_name(policy.model) == model_name(policy.model.get_base_model())
    cfg = run_config(SimpleNamespace(reward_func_names=["format"], reward_weights=None),
                     SimpleNamespace(loss_type="dapo"), policy.model)
    assert cfg["algo"] == "grpo" and cfg["loss_type"] == "dapo"
    assert algo_label(cfg) == "GRPO (loss_type=dapo)"
    assert algo_label({"trainer": "trl.GRPOTrainer", "algo": "dapo", "loss_type": "dapo"}) == \
        "GRPO (loss_type=dapo)"
    assert algo_label({"algo": "gigpo"}) == "gigpo"


def test_trls_own_sampler_trainer_gap_is_our_mismatch_metric():
    """With vLLM, TRL logs mean |old - sampling logprob| itself; the callback records it under our
    name, so Dynamics' mismatch row and drift alarm read TRL runs too (and keeps TRL's name)."""
    from storage.integrations.trl import RecorderCallback
    cb = RecorderCallback.__new__(RecorderCallback)
    cb.record_s, cb.write_s = [], []
    got = cb._metrics({}, {"sampling/sampling_logp_difference/mean": 0.021,
                           "sampling/importance_sampling_ratio/max": 1.7})
    assert got["mismatch/abs_mean"] == 0.021
    assert got["trl/sampling/sampling_logp_difference/mean"] == 0.021
    assert got["trl/sampling/importance_sampling_ratio/max"] == 1.7
