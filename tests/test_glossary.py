"""Pages that explain themselves (issue 51, item 4), through Streamlit's AppTest on the demo store:
every page opens with what it shows and what healthy looks like, its terms linked to their
Glossary entries; the Glossary page has an entry (an anchor) per term; reward beside success is
explained from the run's own config. tests/test_browser_glossary.py follows the links in Chromium.
"""
from __future__ import annotations

import re
import urllib.parse

import pytest

from pages import _terms
from tests.test_pages import app, demo  # noqa: F401  (fixtures)

PAGES = ("runs", "replay", "groups", "dynamics", "failures", "compare", "train")


def test_reward_beside_success_says_why_they_differ_from_the_config():
    bandit = _terms.reward_beside_success({"env": "bandit", "w_outcome": 1.0})
    assert "probability 0.25" in bandit and "higher expected value" in bandit
    search = _terms.reward_beside_success(
        {"env": "search", "w_outcome": 1.0, "w_format": 0.0, "w_cost": 1.0, "w_process": 0.2})
    assert search.startswith("Reward = 1·outcome + 1·cost + 0.2·process")  # w_format 0 left out
    assert "score the source recorded" in _terms.reward_beside_success({"env": "inspect"})


def test_links_name_only_terms_the_glossary_defines():
    for _text, terms in _terms.INTROS.values():
        for anchor in terms:
            assert _terms.link(anchor) == f"[{_terms.TERMS[anchor][0]}](glossary#{anchor})"
    with pytest.raises(KeyError):
        _terms.link("no-such-term")
    assert set(_terms.INTROS) == set(PAGES)
    # the silhouette's bounds as the Failures page applies them (Kaufman & Rousseeuw)
    assert "below 0.25 no substantial structure" in _terms.TERMS["silhouette"][1]


@pytest.mark.parametrize("page", PAGES)
def test_each_page_opens_with_its_explanation_and_linked_terms(app, demo, page):  # noqa: F811
    at = app(page, store=demo[1], run=demo[2]["demo-search-starpo"])
    assert not at.exception, at.exception
    intro = [cap.value for cap in at.caption if "Healthy:" in cap.value]
    assert intro and intro[0].startswith(_terms.INTROS[page][0]), page
    # each link carries the sidebar's run, so the Glossary tab it opens keeps it
    query = urllib.parse.urlencode({"store": demo[1], "run": demo[2]["demo-search-starpo"]})
    anchors = re.findall(r"\]\(glossary\?" + re.escape(query) + r"#([a-z0-9-]+)\)", intro[0])
    assert anchors == list(_terms.INTROS[page][1])


def test_glossary_page_has_an_anchor_and_a_definition_per_term(app, demo):  # noqa: F811
    at = app("glossary", store=demo[1], run=demo[2]["demo-search-starpo"])
    assert not at.exception, at.exception
    assert at.title[0].value == "Glossary"
    heads = {h.proto.anchor: h.value for h in at.subheader}
    assert heads == {a: term for a, (term, _) in _terms.TERMS.items()}
    assert [m.value for m in at.markdown if m.value in
            {d for _, d in _terms.TERMS.values()}] == [d for _, d in _terms.TERMS.values()]


def test_runs_explains_a_bandit_runs_reward_beside_its_success(app, tmp_path):  # noqa: F811
    from storage.recorder import Recorder
    rec = Recorder(tmp_path / "s.duckdb")
    rec.start_run({"env": "bandit", "model": "tiny", "algo": "dr_grpo"}, name="workshop")
    rec.record_step(1, metrics={"reward/mean": 0.15, "success/rate": 1.0})
    rec.finish("finished")
    at = app("runs", store_dir=str(tmp_path))
    assert not at.exception
    said = [cap.value for cap in at.caption if cap.value.startswith("Bandit runs:")]
    assert said and "probability 0.25" in said[0]
