"""Failure clusters (core/jobs/clusters.py): known groups recovered, the job on a real store, the cache,
and what the Failures page reads (storage.queries.failure_clusters)."""
from __future__ import annotations

import shutil
import urllib.parse
from pathlib import Path

import duckdb
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from core.commands import clusters as clusters_cli
from core.jobs import clusters, embedders
from storage import queries

ROOT = Path(__file__).resolve().parent.parent
GIGPO = ROOT / "sample_runs" / "credit_gigpo.duckdb"


@pytest.fixture(scope="module")
def embedder():
    return embedders.StaticEmbedder(threads=2)


def test_constructed_groups_are_recovered(embedder):
    trajs, modes = clusters.constructed_failures(400, seed=3)
    texts = [clusters.trajectory_text(t) for t in trajs]
    labels, k, score = clusters.cluster(embedder(texts))
    ari = adjusted_rand_score(modes, labels)
    print(f"constructed set: 5 modes, 400 trajectories -> k={k}, silhouette {score:.3f}, "
          f"adjusted Rand index {ari:.3f}")
    assert ari > 0.8
    terms = clusters.distinguishing_terms(texts, labels)
    # The tool-error mode's cluster is named by its error, the grid mode's by the hole.
    named = {" ".join(terms[c]) for c in terms}
    assert any("keyerror" in t for t in named) and any("hole" in t for t in named)


def test_text_keeps_actions_errors_and_drops_reasoning():
    text = clusters.trajectory_text(
        [{"action": "<think>long musing about Paris</think><search>capital of Fevam</search>",
          "observation": "<|im_start|>user\n<information>Doc 1 " + "x" * 500, "error": None},
         {"action": "<code>apis.x()</code>", "observation": "", "error": "KeyError: 'id'"}],
        answer="Rene")
    assert "musing" not in text and "<search>capital of Fevam</search>" in text
    assert "im_start" not in text and "x" * 200 not in text
    assert "E: KeyError: 'id'" in text and text.endswith("answer: Rene")


def test_ctfidf_names_what_sets_a_cluster_apart():
    texts = ["timeout calling weather api", "weather api timeout again",
             "fell into hole", "hole again fell"]
    terms = clusters.distinguishing_terms(texts, np.array([0, 0, 1, 1]), top=2)
    assert set(terms[0]) <= {"timeout", "weather", "api", "calling"}
    assert set(terms[1]) <= {"hole", "fell"}


def test_too_few_distinct_failures_make_one_cluster():
    labels, k, score = clusters.cluster(np.ones((5, 4), dtype=np.float32))
    assert k == 1 and set(labels) == {0} and score != score


def test_job_on_a_real_store_caches_and_the_page_reads_it(tmp_path, embedder, capsys):
    store = tmp_path / "gigpo.duckdb"
    shutil.copy(GIGPO, store)
    run_id = duckdb.connect(str(store), read_only=True).execute(
        "SELECT run_id FROM runs").fetchone()[0]
    # Recorded before the cluster tables: the page's read is empty, not an error.
    assert queries.failure_clusters(store, run_id)["clusters"].empty
    progress = tmp_path / "progress.json"
    first = clusters.run(store, run_id, progress, embedder=embedder)
    failing = duckdb.connect(str(store), read_only=True).execute(
        "SELECT count(*) FROM trajectories WHERE run_id = ? AND NOT success",
        [run_id]).fetchone()[0]
    assert first["failing"] == failing and first["embedded"] > 0 and first["cached"] == 0
    assert '"phase": "done"' in progress.read_text()
    read = queries.failure_clusters(store, run_id)
    table, per_step, members = read["clusters"], read["per_step"], read["members"]
    assert table["size"].sum() == failing == len(members)
    assert list(table["cluster"]) == list(range(first["k"]))
    from storage.embeddings import confidence     # the summary carries the page's verdict
    assert (first["confidence"], first["named"]) == confidence(first["k"], first["silhouette"])[:2]
    assert (table["size"].diff().dropna() <= 0).all()          # numbered by size
    assert table["terms"].str.len().min() > 0 and table["classes"].str.len().min() > 0
    assert np.allclose(per_step.groupby("step")["share"].sum(), 1.0)
    # The central members are the cluster's closest to its centroid.
    for _, row in table.iterrows():
        own = members[members["cluster"] == row["cluster"]].sort_values("distance")
        assert row["central"].split(", ")[0] == own["traj_id"].iloc[0]
    # A rerun embeds nothing: every vector comes from the store's cache.
    again = clusters.run(store, run_id, embedder=embedder)
    assert again["embedded"] == 0 and again["cached"] == failing and again["k"] == first["k"]
    count = duckdb.connect(str(store), read_only=True).execute(
        "SELECT count(*) FROM embeddings WHERE run_id = ?", [run_id]).fetchone()[0]
    assert count == failing


def test_cli_refuses_bad_input(tmp_path, capsys):
    assert clusters_cli.main(["--db", str(tmp_path / "none.duckdb"), "--run", "x"]) == 2
    store = tmp_path / "gigpo.duckdb"
    shutil.copy(GIGPO, store)
    assert clusters_cli.main(["--db", str(store), "--run", "no-such-run"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


# -- the Failures page -----------------------------------------------------------------------------
from tests.test_pages import app, demo  # noqa: E402,F401  (fixtures)


def test_failures_page_launches_the_job_and_shows_clusters(app, tmp_path):
    import time

    from pages import _clusterjob
    stores = tmp_path / "stores"
    stores.mkdir()
    store = stores / "gigpo.duckdb"
    shutil.copy(GIGPO, store)
    run_id = duckdb.connect(str(store), read_only=True).execute(
        "SELECT run_id FROM runs").fetchone()[0]
    at = app("failures", store_dir=str(stores), store=str(store), run=run_id)
    assert not at.exception
    assert any("Not computed yet" in i.value for i in at.info)
    at.button(key="cluster_start").click().run()
    assert not at.exception
    deadline = time.monotonic() + 240
    while (_clusterjob.state(str(store), run_id) or {}).get("alive"):
        assert time.monotonic() < deadline, "cluster job did not finish"
        time.sleep(1)
    job = _clusterjob.state(str(store), run_id)
    assert job["phase"] == "done", job
    at.run()
    assert not at.exception
    table = next(f.value for f in at.dataframe if "terms" in f.value.columns)
    assert table["size"].sum() == job["summary"]["failing"]
    assert table["replay"].str.startswith("replay?").all()
    members = next(f.value for f in at.dataframe if "distance" in f.value.columns)
    assert (members["cluster"] == 0).all() and members["replay"].str.contains("traj=").all()


# -- honest confidence (issue 51, item 7) ----------------------------------------------------------
def test_label_terms_are_failure_modes_not_the_names_of_the_task():
    texts = ["A: <search>Giakrohae mayor</search> | O: Doc 1 the mayor of Giakrohae is Rene Thol. "
             "| E: timeout from the search tool",
             "A: <search>Giakrohae mayor</search> | O: timeout again\nanswer: Rene Thol",
             "A: <answer>Up</answer> | O: You fell into a hole. Game over.",
             "A: <answer>Up</answer> | O: The lake froze over, you fell into a hole."]
    masked = clusters.entity_words(texts, known=["capital>mayor:Giakrohae", "Rene Thol"])
    # names mid-sentence or in the task id / answer; "Up" after a tag, "You"/"The"/"Game" at a
    # sentence start and words also written in lower case are not names
    assert masked == {"giakrohae", "rene", "thol"}
    terms = clusters.distinguishing_terms(texts, np.array([0, 0, 1, 1]), top=3, masked=masked)
    assert not {"giakrohae", "rene", "thol"} & set(terms[0])
    assert "timeout" in terms[0] and "hole" in terms[1]
    unmasked = clusters.distinguishing_terms(texts, np.array([0, 0, 1, 1]), top=3)
    assert "giakrohae" in unmasked[0]     # what the mask is for
    # a document's title and a gold answer are names even where the model lower-cased them
    searched = ["A: <search>zonistis company</search> | O: Doc 1(Title: Zonistis) a trading firm",
                "answer: gakresto"]
    assert clusters.entity_words(searched, known=['["Gakresto River"]']) == {
        "zonistis", "gakresto", "river"}


@pytest.mark.parametrize("k, s, level, named, said", [
    (5, 0.62, "reasonable", True, "reasonable structure"),
    (5, 0.31, "weak", True, "weak structure"),
    (12, 0.15, "none", False, "no substantial structure"),
    (24, 0.55, "weak", True, "top of the range searched (2..24)"),
    (1, None, "single", True, "One cluster"),
])
def test_the_confidence_verdict_reads_the_silhouette_and_the_edge(k, s, level, named, said):
    from storage.embeddings import confidence
    got_level, got_named, sentence = confidence(k, s)
    assert (got_level, got_named) == (level, named) and said in sentence


def test_a_best_k_at_the_top_edge_extends_the_search():
    # 30 well-separated directions: the best k is beyond the first range 2..12
    rng = np.random.default_rng(0)
    centres = np.linalg.qr(rng.normal(size=(64, 30)))[0].T          # 30 orthonormal centres
    vectors = np.repeat(centres, 4, axis=0) + 0.01 * rng.normal(size=(120, 64))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    labels, k, score = clusters.cluster(vectors.astype(np.float32))
    assert k > clusters.K_MAX and k == clusters.K_LIMIT   # extended, and stopped at the limit
    labels, k12, _ = clusters.cluster(vectors.astype(np.float32), k_limit=clusters.K_MAX)
    assert k12 == clusters.K_MAX                           # without the extension: the old edge


def test_failures_page_refuses_to_name_clusters_without_structure(app, tmp_path):
    """Clusters stored as the job writes them, at k = 12 with silhouette 0.15 (what the sample
    search run got): the page says there is no substantial structure and names none."""
    import pandas as pd

    from storage import embeddings
    stores = tmp_path / "stores"
    stores.mkdir()
    store = stores / "gigpo.duckdb"
    shutil.copy(GIGPO, store)
    run_id = duckdb.connect(str(store), read_only=True).execute(
        "SELECT run_id FROM runs").fetchone()[0]
    traj, _ = embeddings.failing(store, run_id)
    traj = traj.head(24)
    embeddings.save_clusters(store, run_id, "test-encoder", pd.DataFrame({
        "traj_id": traj["traj_id"], "step": traj["step"].astype(int),
        "cluster": [i % 12 for i in range(len(traj))], "distance": 0.1,
        "terms": "hole, left, slippery", "k": 12, "silhouette": 0.15}))
    at = app("failures", store_dir=str(stores), store=str(store), run=run_id)
    assert not at.exception
    said = [w.value for w in at.warning if "Silhouette 0.15" in w.value]
    assert said and "no substantial structure" in said[0] and "not named" in said[0]
    table = next(f.value for f in at.dataframe if "terms" in f.value.columns)
    assert set(table["terms"]) == {"(not named: no substantial structure)"}
    # the Glossary link carries the sidebar's run (pages/_terms.link)
    query = urllib.parse.urlencode({"store": str(store), "run": run_id})
    assert any(f"glossary?{query}#silhouette" in cap.value for cap in at.caption)
