"""The user docs cover what users reach for: JobContext's members, the embedded services, working links."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from airflow_ckpt_provider import embedded
from airflow_ckpt_provider.runtime import JobContext

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _public(cls: type) -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(cls) if not name.startswith("_"))


def test_runtime_md_documents_every_public_member_of_job_context() -> None:
    members = [*_public(JobContext), "config", "job"]  # and the instance attributes set in __init__
    text = (DOCS / "runtime.md").read_text()
    assert [m for m in sorted(set(members)) if f"`ctx.{m}" not in text] == []


@pytest.mark.parametrize("cls", [embedded.EmbeddedS3, embedded.EmbeddedKafka, embedded.EmbeddedServices])
def test_embedded_md_documents_the_embedded_services_api(cls: type) -> None:
    text = (DOCS / "embedded.md").read_text()
    wanted = [m for m in _public(cls) if m not in ("name", "pid", "running", "startup_seconds", "log_tail",
                                                     "log_path", "port", "ports", "storage_engine", "data_dir",
                                                     "workdir")]
    assert f"`{cls.__name__}(" in text
    assert [m for m in wanted if not re.search(rf"`(?:[\w.]+\.)?{m}\b", text)] == []


def test_index_links_every_docs_page() -> None:
    index = (DOCS / "index.md").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    assert [p for p in pages if f"]({p})" not in index] == []


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        heading = re.match(r"#+ (.*)", line)
        if heading:
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_relative_links_and_anchors_in_the_docs_resolve() -> None:
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for link in re.finditer(r"\]\(([^)#\s]*)(#[^)\s]*)?\)", page.read_text()):
            target, anchor = link.group(1), link.group(2)
            if target.startswith(("http://", "https://")):
                continue
            path = page.parent / target if target else page
            if not path.exists():
                broken.append(f"{page.name}: {target} does not exist")
            elif anchor and path.suffix == ".md" and anchor[1:] not in _anchors(path):
                broken.append(f"{page.name}: {target}{anchor} names no heading")
    assert broken == []


INCLUDE = re.compile(r'<!-- include: (\S+), between "([^"]+)" and "([^"]+)" -->\n```python\n(.*?)```', re.S)


def test_included_example_code_is_verbatim() -> None:
    """docs/*.md's ``<!-- include: FILE, between START and END -->`` blocks are the file's text between the markers."""
    root = DOCS.parent
    found = 0
    for page in DOCS.glob("*.md"):
        for path, start, end, block in INCLUDE.findall(page.read_text()):
            source = (root / path).read_text()
            expected = source.split(start + "\n", 1)[1].split(end, 1)[0]
            assert block == expected, f"{page.name}: the include of {path} differs from the file: copy it again"
            found += 1
    assert found == 12  # the five example DAGs in docs/airflow.md, seven parts of the Dagster Definitions in dagster.md
