"""The job store's layout, generated from the record types: ``python -m airflow_ckpt_provider.core.records.layout``
prints the Markdown that docs/jobstore-layout.md holds (tests/unit/core/records/test_layout.py keeps them equal)."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterable

import msgspec

from airflow_ckpt_provider.core.records.base import Record

HEADER = """# The job store's layout

Generated from the record types (`core/records/`) by `python -m airflow_ckpt_provider.core.records.layout`;
do not edit by hand. Every file below is a typed record: JSON with a `schema` version (the snapshot manifest's
is `format`, a ckpt-files commit manifest's `version`); unknown keys are ignored, older versions are upgraded when
read, newer ones refused (`core/records/base.py`). Keys are under the job's root in the job store
(`<store>/<job>/`), except those beginning `<sink>/`: the ckpt-files sink's own records, in its output location,
and those beginning `/`: at the store's root (`/_service/`: the supervision service's instances).
"""


#: The modules that define record types (a new record type's module is added here).
MODULES = ("airflow_ckpt_provider.core.records.status", "airflow_ckpt_provider.core.records.lease",
           "airflow_ckpt_provider.core.records.deployments", "airflow_ckpt_provider.core.records.generation",
           "airflow_ckpt_provider.core.records.start", "airflow_ckpt_provider.core.records.control",
           "airflow_ckpt_provider.core.records.supervision", "airflow_ckpt_provider.core.records.restore_check",
           "airflow_ckpt_provider.core.snapshots.manifest", "airflow_ckpt_provider.core.records.pending",
           "airflow_ckpt_provider.core.snapshots.gc", "airflow_ckpt_provider.core.records.ownership",
           "airflow_ckpt_provider.core.records.operations", "airflow_ckpt_provider.core.records.statesample",
           # the ckpt-files sink's own records, kept in its output location (keys beginning <sink>/)
           "airflow_ckpt_provider.sinks.filelayout", "airflow_ckpt_provider.sinks.timelines")


def record_types() -> list[type[Record]]:
    """Every record type of the job store: the subclasses of Record in MODULES that name their key, by key (a
    type of another module is left out, so the page does not depend on what else was imported:
    ``keyed_types`` finds those)."""
    for module in MODULES:
        importlib.import_module(module)
    return [cls for cls in keyed_types() if cls.__module__ in MODULES]


def keyed_types() -> list[type[Record]]:
    """The subclasses of Record that name their key, of every module imported so far, by key."""
    found: list[type[Record]] = []
    todo: list[type[Record]] = [Record]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.KEY:
            found.append(cls)
    return sorted(found, key=lambda c: c.KEY)


def _type_name(tp: object) -> str:
    text = getattr(tp, "__name__", None) if isinstance(tp, type) else None
    text = text or re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(tp))  # typing.Any, a.b.RequestAction | None: their names
    return text.replace("|", "\\|")  # a pipe would end the table cell


def _default(field: msgspec.structs.FieldInfo) -> str:
    """A field's default as the page shows it: its value, or what a factory makes (an empty container's value;
    another factory by name, e.g. the time it is written)."""
    if field.default is not msgspec.NODEFAULT:
        return repr(field.default)
    factory = field.default_factory
    return repr(factory()) if factory in (dict, list, tuple, set) else f"`{getattr(factory, '__name__', factory)}()`"


def markdown(types: Iterable[type[Record]]) -> str:
    out = [HEADER]
    for cls in types:
        doc = inspect.cleandoc(cls.__doc__ or "").replace("\n", " ")
        out.append(f"## `{cls.KEY}`: {cls.WHAT} ({cls.version_key()} {cls.SCHEMA})\n\n{doc}\n")
        out.append("| field | type | default |\n| --- | --- | --- |")
        for field in msgspec.structs.fields(cls):
            default = "required" if field.required else _default(field)
            out.append(f"| `{field.encode_name}` | `{_type_name(field.type)}` | {default} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown(record_types()))
