"""Issue 57, item 2: the rules every import door keeps are the framework's
(storage/ingest/door.py), not each format's. Each test here is a break found in one door: one
bad item ended the rest of its file or lost a trainer's whole step, a line built a huge value,
``import DIR`` read through a link out of DIR, a SentencePiece tokenizer skipped the
vocabulary check and decoded every prefix. Real files, the real command line, a real store."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from storage import db, ingest
from storage.ingest import formats
from storage.ingest.registry import REGISTRY, Format

ROOT = Path(__file__).resolve().parents[1]
VERIFIERS = ROOT / "tests" / "fixtures" / "verifiers" / "traces.jsonl"


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).fetchall()


def _episode(k: int, change=None) -> dict:
    """The fixture's first episode with a fresh trace id, ``change``d (a function of its one
    trace)."""
    ep = json.loads(VERIFIERS.read_text().splitlines()[0])
    ep["traces"][0]["id"] = f"t{k}"
    if change:
        change(ep["traces"][0])
    return ep


def _write(path: Path, episodes: list) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return path


# -- the registry ------------------------------------------------------------------------------
def test_every_format_is_one_registered_module_behind_the_protocol():
    assert set(formats.NAMES) == set(REGISTRY) == set(ingest.IMPORT_FORMATS)
    for name, fmt in REGISTRY.items():
        assert isinstance(fmt, Format) and fmt.name == name
        assert fmt.followed in ("appended", "whole", "log") and fmt.patterns
        assert type(fmt).__module__.startswith("storage.ingest.")  # defined where it registers
    assert {n for n, f in REGISTRY.items() if f.exports} == {"jsonl", "messages"}
    with pytest.raises(ValueError, match="unknown format 'nope'; expected one of"):
        formats.get("nope")


# -- one verifiers line fails alone, whatever it raises -----------------------------------------
def _spoil(key, value):
    return lambda trace: trace["rewards"]["correct"].update({key: value})


BAD_LINES = {  # line -> (how the trace is spoiled, what the error says)
    2: (_spoil("weight", None), "rewards.correct.weight' must be a number, got null"),
    3: (lambda t: t.update(rewards=[1.0]), "'rewards' must be an object, got list"),
    4: (_spoil("score", 10**400), "rewards.correct.score' must be a number a double can hold"),
    5: (lambda t: t["nodes"][0]["token_ids"].__setitem__(0, 2**70),
        "token_ids[0]' must be a token id between 0 and 2^31-1"),
    6: (lambda t: t["nodes"][0]["token_ids"].__setitem__(0, 1.5),
        "token_ids[0]' must be an integer token id, got float"),
    7: (lambda t: t["nodes"][0]["token_ids"].__setitem__(0, True),
        "token_ids[0]' must be an integer token id, got bool"),
}


def test_a_verifiers_line_that_raises_anything_fails_alone_and_the_file_goes_on(tmp_path):
    episodes = [_episode(1)] + [_episode(k, change) for k, (change, _) in BAD_LINES.items()] \
        + [_episode(8)]
    store = tmp_path / "vf.duckdb"
    report = ingest.import_file(_write(tmp_path / "traces.jsonl", episodes), store, "verifiers")
    assert (report.imported, report.failed) == (2, len(BAD_LINES)), report.errors
    for line, (_, words) in BAD_LINES.items():
        assert any(e.startswith(f"traces.jsonl:{line}[0]: ") and words in e
                   for e in report.errors), (line, report.errors)
    assert {r[0] for r in _q(store, "SELECT traj_id FROM trajectories")} == {"t1", "t8"}


def test_a_30_kb_verifiers_line_cannot_build_a_huge_value(tmp_path):
    """A string weight times a large integer score made an 800 MB string (941 MB peak): both
    must be numbers, so the line fails, named, and the import stays small."""
    bad = _episode(2, _spoil("score", 10**8))
    bad["traces"][0]["rewards"]["correct"]["weight"] = "x" * 8
    bad["pad"] = "y" * 30_000
    path = _write(tmp_path / "traces.jsonl", [_episode(1), bad, _episode(3)])
    # The command line's own peak, in a process of its own: VmHWM, its address space's high
    # water mark. Not ru_maxrss: Linux folds the pre-exec address space's peak into it, and
    # subprocess forks (vfork) from pytest, so it read the pytest worker's peak (a worker grown
    # to 1.5 GB gave ru_maxrss 1548 MB for an import whose VmHWM was 176 MB; 832 and 1708 MB
    # were seen in full-suite runs). ru_maxrss only where there is no /proc.
    peak = ("import resource, sys\nfrom storage.io import main\ncode = main(sys.argv[1:])\n"
            "try:\n    kb = next(int(s.split()[1]) for s in open('/proc/self/status')\n"
            "              if s.startswith('VmHWM:'))\n"
            "except OSError:\n    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(f'peak {kb}')\nsys.exit(code)")
    out = subprocess.run([sys.executable, "-c", peak, "import", str(path), "--db",
                          str(tmp_path / "s.duckdb"), "--format", "verifiers"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    peak_mb = int(out.stdout.rsplit("peak ", 1)[1]) / 1024
    assert out.returncode == 1, out.stderr
    assert "traces.jsonl:2[0]: field 'rewards.correct.weight' must be a number, got str" \
        in out.stderr
    assert "2 imported" in out.stdout, out.stdout
    assert peak_mb < 600, f"the import peaked at {peak_mb:.0f} MB"


# -- trainer-side recorders: one rollout fails alone, inside the user's trainer -----------------
def _skyrl_output(tokenizer) -> dict:
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, answer = ids("Who wrote Dune?"), ids("<answer>Frank Herbert</answer>")
    n = 5
    return {"prompt_token_ids": [prompt] * n, "response_ids": [answer] * n,
            "loss_masks": [[1] * len(answer)] * n, "rewards": [1.0] * n,
            "trajectory_ids": [{"instance_id": "dune", "repetition_id": k} for k in range(n)],
            "stop_reasons": ["stop"] * n}


def test_a_bad_skyrl_rollout_fails_alone_and_the_step_is_recorded(tmp_path):
    from core.model.models import load_tokenizer
    from storage.integrations.skyrl_output import SkyRLRecorder

    tokenizer = load_tokenizer("tiny")
    output = _skyrl_output(tokenizer)
    output["rewards"][1] = None                                      # no reward
    output["loss_masks"] = [list(m) for m in output["loss_masks"]]
    output["loss_masks"][2] = output["loss_masks"][2][:-1]           # one entry short
    output["loss_masks"] = output["loss_masks"][:4]                  # none for the last
    store = tmp_path / "sky.duckdb"
    recorder = SkyRLRecorder(store, tokenizer, run_id="sky")
    report = recorder.record(output, step=1)                         # does not raise
    recorder.close()
    assert (report.imported, report.failed) == (2, 3), report.errors
    assert any("sample 4: 'loss_masks' has no entry for rollout 4" in e
               for e in report.errors), report.errors
    assert any("sample 1: field 'rewards' must be a number, got null" in e
               for e in report.errors), report.errors
    assert any("sample 2: mask has" in e for e in report.errors), report.errors
    assert {r[0] for r in _q(store, "SELECT traj_id FROM trajectories")} == \
        {"s1-dune_0", "s1-dune_3"}


def test_a_verl_batch_with_a_short_uid_records_the_samples_that_have_one(tmp_path):
    pytest.importorskip("verl")
    np = pytest.importorskip("numpy")
    from core.model.models import load_tokenizer
    from storage.integrations.verl_batch import VerlBatchRecorder
    from tests.test_import_rl_trainers import _verl_batch

    tokenizer = load_tokenizer("tiny")
    batch, _ = _verl_batch(tokenizer, step=3)
    batch.non_tensor_batch["uid"] = np.array(["dune", "dune", "sum"], dtype=object)  # 3 of 4
    store = tmp_path / "verl.duckdb"
    recorder = VerlBatchRecorder(store, tokenizer, run_id="verl-short")
    report = recorder.record(batch)                                  # does not raise
    recorder.close()
    assert (report.imported, report.failed) == (3, 1), report.errors
    assert "sample 3: non_tensor_batch['uid'] has 3 entries" in report.errors[0]


# -- import DIR never reads through a link out of DIR ---------------------------------------------
def test_import_dir_refuses_a_link_out_of_the_folder_named(tmp_path):
    art = {"trajectories": [{"reward": 1.0, "messages_and_choices": [
        {"role": "user", "content": "2+3?"},
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "5"}}]}]}
    secret = tmp_path / "elsewhere" / "0001.jsonl"
    secret.parent.mkdir()
    secret.write_text(json.dumps(art))
    logs = tmp_path / "trajectories" / "train"
    logs.mkdir(parents=True)
    (logs / "0000.jsonl").write_text(json.dumps(art))
    (logs / "0001.jsonl").symlink_to(secret)
    store = tmp_path / "art.duckdb"
    out = subprocess.run([sys.executable, "-m", "storage.io", "import", str(logs.parent),
                          "--db", str(store), "--format", "art"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "0001.jsonl: links outside the imported folder: never opened" in out.stderr
    assert _q(store, "SELECT traj_id FROM trajectories") == [("train/0000:1:0",)]


# -- SentencePiece tokenizers: the vocabulary checked, decoded in linear time --------------------
def _sentencepiece(path: Path):
    """A tokenizer.json as SentencePiece models convert to (Llama, Gemma): a Unigram model with
    byte fallback, Metaspace pieces, its decoder not byte-level."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from storage.ingest.verifiers_traces import TokenizerFile

    words = ["hello", "world", "the", "cat"]
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] \
        + [(f"<0x{b:02X}>", -10.0) for b in range(256)] \
        + [("\u2581" + w, -1.0) for w in words] + [("\u2581", -2.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.save(str(path))
    return TokenizerFile(path), tok.encode("hello world € the cat").ids


def test_a_sentencepiece_tokenizer_is_checked_and_decoded_in_linear_time(tmp_path):
    from storage.ingest.verifiers_traces import TokenizerFile
    from storage.token_text import is_byte_level, token_texts

    tokenizer, ids = _sentencepiece(tmp_path / "tokenizer.json")
    assert not is_byte_level(tokenizer)
    assert token_texts(tokenizer, ids) == ["hello", " world", " ", "", "", "€", " the", " cat"]
    for bad in (-1, tokenizer.backend_tokenizer.get_vocab_size()):
        with pytest.raises(ValueError, match=f"token id {bad} is outside the tokenizer's vocab"):
            token_texts(tokenizer, ids + [bad])

    class Counting(TokenizerFile):  # how many tokens are decoded in all: the work done
        decoded = 0

        def decode(self, some):
            Counting.decoded += len(some)
            return super().decode(some)

    counting = Counting(tmp_path / "tokenizer.json")
    long = ids * 512  # 4,096 ids: every prefix decoded would be 8.4M tokens
    texts = token_texts(counting, long)
    assert "".join(texts) == tokenizer.decode(long)
    assert Counting.decoded < 50 * len(long), Counting.decoded


def test_a_verifiers_id_outside_a_sentencepiece_vocabulary_fails_that_line_alone(tmp_path):
    tokenizer, ids = _sentencepiece(tmp_path / "tokenizer.json")

    def ids_of(value):
        def change(trace):
            for node in trace["nodes"]:
                node["token_ids"] = [ids[k % len(ids)] for k in range(len(node["token_ids"]))]
            trace["nodes"][0]["token_ids"][0] = value
        return change

    episodes = [_episode(1, ids_of(ids[0])), _episode(2, ids_of(-1)),
                _episode(3, ids_of(10**6)), _episode(4, ids_of(ids[1]))]
    store = tmp_path / "vf.duckdb"
    report = ingest.import_file(_write(tmp_path / "traces.jsonl", episodes), store, "verifiers",
                                tokenizer=tokenizer)
    assert (report.imported, report.failed) == (2, 2), report.errors
    assert "between 0 and 2^31-1, got -1" in report.errors[0]
    assert "token id 1000000 is outside the tokenizer's vocabulary" in report.errors[1]
    texts = _q(store, "SELECT string_agg(text, '' ORDER BY pos) FROM tokens WHERE traj_id = 't1'")
    assert "€" in texts[0][0]

