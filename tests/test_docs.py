"""README stays a front door (at most 600 lines) and every relative link of README and docs/*.md resolves."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 600

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"(`+).*?\1", re.S)
_LINK = re.compile(r"(?<!\\)!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (links there are examples, not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower-cased, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = text.replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeated headings numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", _FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file, folder or heading anchor does not exist (with why)."""
    bad = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: {dest.name} has no heading with anchor #{anchor}")
    return bad


def test_readme_is_a_front_door():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, (f"README.md has {n} lines (at most {MAX_README_LINES}): move the detail "
                                   f"to a page under docs/ and link it")


def test_every_relative_link_resolves():
    bad = [f"{p.relative_to(ROOT)}: {b}" for p in _pages() for b in broken_links(p)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_docs_page_is_linked_from_readme_or_the_docs_index():
    index = DOCS / "README.md"
    assert index.is_file(), "docs/README.md (the index of the docs pages) is missing"
    linked = set()
    for p in (README, index):
        for target in _LINK.findall(_prose(p.read_text(encoding="utf-8"))):
            path = target.partition("#")[0]
            if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
                linked.add((p.parent / path).resolve())
    orphans = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked and p.name != "README.md"]
    assert not orphans, f"docs pages no index links to: {orphans}"


def test_link_checker_finds_what_is_broken(tmp_path):
    """The checker itself: a missing file, a missing anchor, GitHub's anchor rules, code that is not a link."""
    (tmp_path / "b.md").write_text("# Search backends (`--search`)\n\n## Ties\n\n## Ties\n\n"
                                   "```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#search-backends---search) [ok](b.md#ties-1) [ok](#local) [ok](https://x.org/y)\n"
                    "[gone](c.md) [no anchor](b.md#ties-2) [code](b.md#not-a-heading) `[not a link](zzz.md)`\n"
                    "```bash\n[not a link either](zzz.md)\n```\n\n# Local\n")
    assert broken_links(page) == ["c.md: " + str(tmp_path / "c.md") + " does not exist",
                                  "b.md#ties-2: b.md has no heading with anchor #ties-2",
                                  "b.md#not-a-heading: b.md has no heading with anchor #not-a-heading"]
