"""Two costs the import framework bounds (storage/ingest/door.py, storage/token_text.py):

* ``line``: peak RSS of ``python -m storage.io import`` on a 3-line verifiers ``traces.jsonl``
  whose middle line (about 30 KB) holds a reward with score 10^8 and weight ``"xxxxxxxx"``:
  multiplied, an 800 MB string.
* ``decode``: seconds for ``token_texts`` of N ids with a SentencePiece-style tokenizer.json
  (Unigram, byte fallback, Metaspace decoder: not byte-level), which once decoded every prefix.

    python bench/import_doors.py line [--root CHECKOUT]
    python bench/import_doors.py decode --n 16384 [--root CHECKOUT]

``--root`` runs another checkout's code (the one before a change) with this script.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def line(root: Path) -> None:
    ep = json.loads((HERE / "tests/fixtures/verifiers/traces.jsonl").read_text().splitlines()[0])
    bad = json.loads(json.dumps(ep))
    bad["traces"][0]["id"] = "bad"
    bad["traces"][0]["rewards"]["correct"] = {"score": 10**8, "weight": "x" * 8}
    bad["pad"] = "y" * 30_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in (ep, bad)))
        size = path.stat().st_size
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "storage.io", "import", str(path), "--db",
                              str(Path(tmp) / "s.duckdb"), "--format", "verifiers"], cwd=root,
                             capture_output=True, text=True)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"line: a {size} byte file, exit {out.returncode}, "
          f"peak {peak:.0f} MB, {time.perf_counter() - t:.1f} s; {out.stderr.strip()[:200]}")


def decode(root: Path, n: int) -> None:
    sys.path.insert(0, str(root))
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from storage.ingest.verifiers_traces import TokenizerFile
    from storage.token_text import token_texts
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] \
        + [(f"<0x{b:02X}>", -10.0) for b in range(256)] \
        + [("\u2581" + w, -1.0) for w in ("hello", "world", "the", "cat")] + [("\u2581", -2.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(str(Path(tmp) / "tokenizer.json"))
        tf = TokenizerFile(Path(tmp) / "tokenizer.json")
    ids = tok.encode("hello world € the cat").ids
    ids = (ids * (n // len(ids) + 1))[:n]
    t = time.perf_counter()
    texts = token_texts(tf, ids)
    print(f"decode: {n} ids in {time.perf_counter() - t:.2f} s, joined == decode: "
          f"{''.join(texts) == tf.decode(ids)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("line", "decode"))
    p.add_argument("--root", type=Path, default=HERE)
    p.add_argument("--n", type=int, default=16384)
    a = p.parse_args()
    line(a.root) if a.what == "line" else decode(a.root, a.n)
