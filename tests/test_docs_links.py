"""Every relative link in the README, docs/ and bench's notes leads somewhere.

A page moved or a heading renamed otherwise leaves a newcomer at a dead link;
file paths quoted in backticks (``stager/...py``) are checked the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         REPO / "bench" / "RESULTS.md", REPO / "bench" / "NOTES.md"]
QUOTED_PATH = re.compile(r"`((?:stager|bench|tests|clients|deploy|docs)/[\w./-]+\.(?:py|sh|md))`")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors: headings lower-cased, punctuation dropped, spaces to dashes."""
    found = set(re.findall(r'<a id="([^"]+)"></a>', page.read_text()))
    for heading in re.findall(r"^#+\s+(.+)$", page.read_text(), re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def _prose(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def test_relative_links_and_anchors_resolve() -> None:
    dead = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and anchor not in _anchors(dest)):
                dead.append(f"{page.relative_to(REPO)}: {target}")
    assert not dead


def test_quoted_repository_paths_exist() -> None:
    missing = [f"{page.relative_to(REPO)}: {path}" for page in PAGES
               for path in QUOTED_PATH.findall(_prose(page)) if not (REPO / path).exists()]
    assert not missing
