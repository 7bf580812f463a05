"""An edit of a snapshot's state, as an operation, a check and the State Processor's CLI ask for it: keys of an
operator deleted, or value columns of one table set, each by Spark SQL predicates and expressions. Checked here;
applied by runtime/staterewrite.py on a copy.

Design notes: docs/state-processor.md#design-notes-corepolicystateeditpy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import ConfigError


@dataclass(frozen=True)
class KeyDeletion:
    """Delete from operator ``operator_id``'s state (every store, join side, state variable, timer and TTL entry)
    the keys ``where`` selects: a Spark SQL predicate over the operator's key columns as ``ckpt state read``
    names them (``key_<field>``, nested fields ``key_<field>_<field>``)."""

    operator_id: int
    where: str

    @classmethod
    def parse(cls, text: str) -> KeyDeletion:
        """``OPERATOR:PREDICATE``, e.g. ``0:key_user = 'u-17'``."""
        op, sep, where = text.partition(":")
        if not sep or not op.strip().isdigit() or not where.strip():
            raise ConfigError(f"invalid key deletion {text!r}: expected OPERATOR:PREDICATE, an operator id and a "
                              "Spark SQL predicate over its key columns, e.g. \"0:key_user = 'u-17'\" (`ckpt state "
                              "list` shows the operators, `ckpt state read` their key columns)")
        return cls(int(op), where.strip())

    def __str__(self) -> str:
        return f"{self.operator_id}:{self.where}"


@dataclass(frozen=True)
class ValueUpdate:
    """Set value columns of table ``table`` (``OPERATOR/STORE[/VARIABLE]``) to Spark SQL expressions (``values``:
    column -> expression, over the table's columns) in the rows ``where`` selects."""

    table: str
    where: str
    values: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> ValueUpdate:
        """The JSON ``{"table": ..., "where": ..., "set": {column: expression}}`` (``str()`` writes it)."""
        try:
            body = json.loads(text)
            update = cls(str(body["table"]), str(body["where"]), {str(k): str(v) for k, v in body["set"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            update = None
        if update is None or not update.values or not update.where.strip():
            raise ConfigError(f"invalid value update {text!r}: expected JSON {{\"table\": \"0/default\", \"where\": "
                              "PREDICATE, \"set\": {\"value_<column>\": EXPRESSION}} with at least one column")
        bad = [c for c in update.values if not c.startswith("value_")]
        if bad:
            raise ConfigError(f"value update of table {update.table}: expected value columns (value_...), found "
                              f"{', '.join(bad)}; keys are deleted (`ckpt state delete`), not changed")
        return update

    def __str__(self) -> str:
        return json.dumps({"table": self.table, "where": self.where, "set": dict(self.values)}, sort_keys=True)


StateEdit = KeyDeletion | ValueUpdate


def parse_edit(delete_keys: str | None = None, update_values: str | None = None) -> StateEdit | None:
    """The edit of settings ``delete_keys`` (``OPERATOR:PREDICATE``) or ``update_values`` (JSON), None without one;
    ConfigError for both, or either malformed."""
    if delete_keys is not None and update_values is not None:
        raise ConfigError("delete_keys and update_values are separate edits: expected one, found both")
    if delete_keys is not None:
        return KeyDeletion.parse(delete_keys)
    return None if update_values is None else ValueUpdate.parse(update_values)


def edit_settings(edit: StateEdit) -> dict[str, str]:
    """The settings that ask for ``edit``: ``delete_keys`` or ``update_values``."""
    return {"delete_keys": str(edit)} if isinstance(edit, KeyDeletion) else {"update_values": str(edit)}


def describe_edit(edit: StateEdit) -> str:
    """The edit as a progress line says it."""
    if isinstance(edit, KeyDeletion):
        return f"deleting the keys of operator {edit.operator_id} where {edit.where}"
    return f"setting {', '.join(f'{c} = {e}' for c, e in edit.values.items())} in table {edit.table} where {edit.where}"
