"""Every relative link in README.md and docs/*.md leads somewhere: the file exists and, when
the link names a heading (`file.md#anchor`), that heading is in the file. Sections move between
the README and docs/; a link copied along with its text keeps pointing from the old place."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.S | re.M)     # code blocks hold JSON and shell, not links
CODE = re.compile(r"`[^`\n]*`")
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
