"""Every relative link in README.md and docs/ resolves: the file exists, and so does the heading it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path: Path) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Aggregation rules by name"), slug("What a run leaves behind"), slug("`fedweigh simulate`: one run")
    ('aggregation-rules-by-name', 'what-a-run-leaves-behind', 'fedweigh-simulate-one-run')
    """
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose_lines(path):
        if match := HEADING.match(line):
            base = slug(match.group(1))
            name, count = base, 1
            while name in found:  # repeated headings get -1, -2, ...
                name, count = f"{base}-{count}", count + 1
            found.add(name)
    return found


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                links.append(target)
    return links


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in relative_links(document):
        file_part, _, anchor = target.partition("#")
        destination = (document.parent / file_part).resolve() if file_part else document
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    assert broken == [], f"{document.relative_to(REPO)}: " + "; ".join(broken)


def test_the_checker_finds_broken_links(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text(
        "[ok](there.md#a-heading) [gone](missing.png) [bad anchor](there.md#nope) [web](https://flower.ai)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert relative_links(page) == ["there.md#a-heading", "missing.png", "there.md#nope"]
    assert "a-heading" in anchors(tmp_path / "there.md")
