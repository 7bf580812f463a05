"""docs/jobstore-layout.md is generated from the record types and kept equal to them."""

from __future__ import annotations

from pathlib import Path

from airflow_ckpt_provider.core.records.control import Ack
from airflow_ckpt_provider.core.records.layout import MODULES, keyed_types, markdown, record_types
from airflow_ckpt_provider.core.records.start import StartRecord

DOC = Path(__file__).parents[4] / "docs" / "jobstore-layout.md"


def test_the_layout_page_is_the_generated_one() -> None:
    assert DOC.read_text() == markdown(record_types()), (
        "docs/jobstore-layout.md differs from the record types: run "
        "`.venv/bin/python -m airflow_ckpt_provider.core.records.layout > docs/jobstore-layout.md`")


def test_every_record_type_is_listed_with_its_key_and_fields() -> None:
    assert StartRecord in record_types()
    text = markdown([StartRecord])
    assert "## `deployments/<epoch>.json`: start record (schema 1)" in text
    assert "| `launch_id` | `str \\| None` | None |" in text


def test_a_type_is_named_without_its_module() -> None:
    assert "| `action` | `RequestAction \\| None` | required |" in markdown([Ack])


def test_every_record_type_imported_is_of_a_listed_module() -> None:
    """A record type whose module is not in layout.MODULES would be missing from the page (run with the whole
    suite, most modules are imported by then)."""
    assert [f"{c.__module__}.{c.__name__}" for c in keyed_types() if c.__module__ not in MODULES] == []
