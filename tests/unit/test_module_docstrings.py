"""Module docstrings stay short (design notes live in docs/), and the docs/ links they name resolve (issue 40)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_ckpt_provider"
DOCS = ROOT / "docs"

#: A module docstring says what the module is for; longer design notes live in docs/ (issue 40 found 33 of more
#: than 10 lines and moved them), linked from the docstring as "Design notes: docs/<page>.md#<anchor>.".
MAX_LINES = 10

DOCS_LINK = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
HOW_TO_SHORTEN = ("shorten it to a summary of a few lines plus a line 'Design notes: docs/<page>.md#<anchor>.', "
                  "moving the rest, as written, into a section of the docs/ page that covers that area")


def _module_docstrings() -> Iterator[tuple[str, str]]:
    """(path under airflow_ckpt_provider/, docstring as written) of every module that has one."""
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc:
            yield path.relative_to(PACKAGE).as_posix(), doc


def _lines(doc: str) -> int:
    """The docstring's lines as the file shows them, from the opening quotes to the closing ones."""
    return doc.count("\n") + 1


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text of links and code, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, outside fenced code; a repeated slug gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = None
    for line in page.read_text().splitlines():
        marker = re.match(r"\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else fence or marker.group(1)
            continue
        heading = re.match(r"#{1,6} (.*?)(?: #+)?$", line)
        if heading and fence is None:
            slug = github_slug(heading.group(1))
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_github_slug_drops_code_marks_and_punctuation_as_github_does() -> None:
    assert github_slug("Design notes: `core/watches/__init__.py`") == "design-notes-corewatches__init__py"
    assert github_slug("Restore check: can the new code restore this state? (`--check-restore`)") == (
        "restore-check-can-the-new-code-restore-this-state---check-restore")
    assert github_slug("See [the sinks](sinks.md)") == "see-the-sinks"


def test_every_module_docstring_is_a_summary_of_at_most_ten_lines() -> None:
    too_long = [f"airflow_ckpt_provider/{module}: expected at most {MAX_LINES} lines, found {_lines(doc)}"
                for module, doc in _module_docstrings() if _lines(doc) > MAX_LINES]
    assert too_long == [], f"module docstrings too long ({HOW_TO_SHORTEN}):\n" + "\n".join(too_long)


def test_docs_links_in_module_docstrings_name_an_existing_page_and_heading() -> None:
    pages: dict[str, set[str]] = {page.name: anchors(page) for page in DOCS.glob("*.md")}
    assert "design-notes-kafkasourcepy" in pages["kafka.md"]  # the parsing works at all
    broken = []
    for module, doc in _module_docstrings():
        for link in DOCS_LINK.finditer(doc):
            page, anchor = link.groups()
            if page not in pages:
                broken.append(f"airflow_ckpt_provider/{module}: {link.group(0)}: expected an existing page, found no "
                              f"docs/{page}: name one of {sorted(pages)}")
            elif anchor is not None and anchor not in pages[page]:
                near = sorted(a for a in pages[page] if a.startswith(anchor.split("-")[0]))[:5]
                broken.append(f"airflow_ckpt_provider/{module}: {link.group(0)}: expected a heading of docs/{page} "
                              f"whose GitHub slug is {anchor!r}, found none (similar: {near}): fix the link, or the "
                              f"heading it names")
    assert broken == [], "\n".join(broken)


def test_anchors_skip_fenced_code_and_number_repeated_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```bash\n# spark-submit --master yarn\n```\n\n## Notes\n\n### Notes\n\n## Notes ##\n")
    assert anchors(page) == {"title", "notes", "notes-1", "notes-2"}
