"""Every relative link in README.md and docs/*.md leads somewhere: the file exists and, when
the link names a heading (`file.md#anchor`), that heading is in the file. Sections move between
the README and docs/; a link copied along with its text keeps pointing from the old place.
Likewise every repository path they name in backticks (`core/envs/games/`, `storage/io.py`):
the map of the code has to follow the code when files move."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.S | re.M)     # code blocks hold JSON and shell, not links
CODE = re.compile(r"`[^`\n]*`")
PATH = re.compile(r"(?<![\w./-])((?:core|storage|pages|bench|tests|docs|sample_runs)/[\w./*-]*|app\.py)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(text: str) -> list[str]:
    text = CODE.sub("", FENCE.sub("", text))
    return LINK.findall(text)


def anchors(text: str) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces -> '-'."""
    heads = re.findall(r"^#+\s+(.*?)\s*$", FENCE.sub("", text), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken(doc: Path) -> list[str]:
    bad = []
    for target in links(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):              # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def missing_paths(text: str) -> list[str]:
    """Repository paths named in inline code that are not in the checkout (globs allowed)."""
    named = (m for code in CODE.findall(FENCE.sub("", text)) for m in PATH.findall(code))
    paths = (m.split("::")[0].rstrip(".") for m in named)        # tests/x.py::test_y
    return [p for p in paths if not (ROOT / p).exists() and not any(ROOT.glob(p))]


def test_the_checker_sees_what_is_broken(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md#a-heading) [gone](gone.md) [bad](there.md#nope) "
                   "![img](pic.png) [web](https://example.org/x) `[code](x.md)`\n"
                   "```\n[fenced](y.md)\n```\n")
    assert broken(doc) == ["gone.md: no such file", "there.md#nope: no heading #nope in there.md",
                           "pic.png: no such file"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_exists(doc):
    assert broken(doc) == []


def test_the_path_checker_sees_a_moved_file():
    assert missing_paths("`core/envs/search.py` and `core/envs/apps*.py` (see `storage/io.py`)") \
        == ["core/envs/search.py", "core/envs/apps*.py"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    assert missing_paths(doc.read_text()) == []
