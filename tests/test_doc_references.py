"""Code, configs, tests and docs cite only documents that live in this repository.

Two checks over every file git tracks under rllib_spear/, tests/, configs/, docs/, benchmarks/,
scripts/ and README.md:

- no citation of a document outside the repository: the upper-case spec and design notes, the
  research notes folder, the feasibility notes (the lower-case docs/algorithms.md and
  docs/design.md are the in-repo documents to cite instead);
- every numbered citation of docs/algorithms.md names a section that is a heading there, and every
  link to a document under docs/ with a ``#`` fragment names a heading of that file.

The patterns are assembled from pieces so that this file does not cite what it forbids.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("rllib_spear/", "tests/", "configs/", "docs/", "benchmarks/", "scripts/", "README.md")

_MD = r"\.md"
# Out-of-repo documents. Upper case only for the three spec files: docs/algorithms.md and
# docs/design.md are fine.
FORBIDDEN = [
    ("the out-of-repo algorithm spec", re.compile(r"\bALGORITHMS" + _MD)),
    ("the out-of-repo design notes", re.compile(r"\bDESIGN" + _MD)),
    ("the out-of-repo style guide", re.compile(r"\bSTYLE" + _MD)),
    ("the out-of-repo research notes", re.compile(r"[\w./-]*\bnotes" + "/" + r"[\w./-]*" + _MD)),
    ("the out-of-repo feasibility notes", re.compile(r"(?i)\bfeasibility" + _MD)),
]

_NUM = r"\d+(?:\.\d+)*"
# "docs/algorithms.md 2.2", "docs/algorithms.md, section 3.4", "docs/algorithms.md 1.1-1.2",
# "docs/algorithms.md 1 and 2", "docs/algorithms.md 1.5, 2.2".
CITATION = re.compile(
    r"docs/algorithms" + _MD + r",?\s+(?:sections?\s+)?"
    + rf"({_NUM}(?:\s*(?:-|–|,|and)\s*{_NUM})*)"
)
# every document under docs/: a link into any of them with a #fragment must name one of its headings
DOC_NAMES = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
ANCHOR_LINK = re.compile(r"\b(" + "|".join(map(re.escape, DOC_NAMES)) + ")" + _MD + r"#([A-Za-z0-9_\-]+)")


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git ls-files)")
    out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, check=True,
                         capture_output=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def _text(path: Path) -> str | None:
    """The file as text, or None for a binary, non-UTF-8 or missing file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _headings(path: Path) -> list[str]:
    """Markdown heading texts of ``path`` (ATX headings outside fenced code blocks)."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            out.append(m.group(1))
    return out


def _section_numbers(headings: list[str]) -> list[str]:
    """"## 1. The shared core" -> "1", "### 1.1 Outcome group advantage" -> "1.1"."""
    nums = []
    for h in headings:
        m = re.match(rf"({_NUM})\.?\s", h + " ")
        if m:
            nums.append(m.group(1))
    return nums


def _github_anchors(headings: list[str]) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to '-', repeats get -1, -2..."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings:
        slug = re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _cited_numbers(group: str) -> list[str]:
    return re.findall(_NUM, group)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def test_no_citation_of_documents_outside_the_repo():
    files = _tracked_files()
    tracked = {p.relative_to(ROOT).as_posix() for p in files}
    bad = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        for what, pattern in FORBIDDEN:
            for m in pattern.finditer(text):
                if m.group(0).removeprefix("./") in tracked:
                    continue  # a file of this repository that happens to match
                rel = path.relative_to(ROOT)
                bad.append(f"{rel}:{_line_of(text, m.start())}: {m.group(0)!r} ({what})")
    assert not bad, (
        "cite docs/algorithms.md sections or docs/design.md instead of documents outside the "
        "repository:\n" + "\n".join(bad)
    )


def test_algorithms_md_sections_are_numbered_consistently():
    nums = _section_numbers(_headings(ROOT / "docs" / "algorithms.md"))
    assert {"1", "2", "3"} <= set(nums), f"docs/algorithms.md lacks numbered sections 1-3: {nums}"
    dupes = sorted({n for n in nums if nums.count(n) > 1})
    assert not dupes, f"docs/algorithms.md numbers these sections twice: {dupes}"
    orphans = [n for n in nums if "." in n and n.rsplit(".", 1)[0] not in nums]
    assert not orphans, f"docs/algorithms.md subsections without a parent section: {orphans}"


def test_algorithms_md_citations_name_existing_sections():
    sections = set(_section_numbers(_headings(ROOT / "docs" / "algorithms.md")))
    bad, seen = [], 0
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for m in CITATION.finditer(text):
            seen += 1
            missing = [n for n in _cited_numbers(m.group(1)) if n not in sections]
            if missing:
                rel = path.relative_to(ROOT)
                bad.append(f"{rel}:{_line_of(text, m.start())}: {m.group(0)!r} (no section {', '.join(missing)})")
    assert seen > 0, "found no docs/algorithms.md citation at all: is the pattern still right?"
    assert not bad, (
        f"these cite sections docs/algorithms.md does not have (it has {sorted(sections)}):\n"
        + "\n".join(bad)
    )


def test_doc_anchor_links_resolve():
    anchors = {name: _github_anchors(_headings(ROOT / "docs" / f"{name}.md")) for name in DOC_NAMES}
    bad = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for m in ANCHOR_LINK.finditer(text):
            if m.group(2) not in anchors[m.group(1)]:
                rel = path.relative_to(ROOT)
                bad.append(f"{rel}:{_line_of(text, m.start())}: {m.group(0)!r}")
    assert not bad, "links to headings that docs/ does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize("heading, anchor", [
    ("1.1 Outcome group advantage", "11-outcome-group-advantage"),
    ("The embedded default policy", "the-embedded-default-policy"),
    ("1.6 Engine/trainer mismatch (truncated IS)", "16-enginetrainer-mismatch-truncated-is"),
])
def test_github_anchor_rule(heading, anchor):
    assert anchor in _github_anchors([heading])
