"""DB-API 2 portability for the ledger: placeholders per paramstyle, quoted identifiers, redaction.

Pure Python and driver-agnostic (no database driver is imported): the connection's own module says
its ``paramstyle`` and ``IntegrityError``. Runs wherever the ledger runs (the Spark driver program's
foreachBatch) and in ``committed_batches`` readers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from airflow_ckpt_provider.core.errors import ConfigError

#: A plain SQL identifier: letters, digits and '_', not starting with a digit, at most 63 characters.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: The DB-API 2 paramstyles (PEP 249).
STYLES = ("qmark", "format", "pyformat", "numeric", "named")
_SECRET = re.compile(r"(password\s*=\s*)\S+|(://[^:/@\s]+:)[^@\s]+(@)", re.IGNORECASE)


class Connection(Protocol):
    """The part of a DB-API 2 connection the ledger uses."""

    def cursor(self) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


def quote_table(table: str) -> str:
    """``table`` or ``schema.table`` as a quoted SQL identifier; ConfigError for anything else."""
    parts = table.split(".")
    if not 1 <= len(parts) <= 2 or not all(IDENTIFIER.fullmatch(p) for p in parts):
        raise ConfigError(
            f"ledger table name {table!r} is not allowed: expected an identifier (letters, digits, '_', not "
            "starting with a digit, at most 63 characters), optionally schema-qualified as 'schema.table'; "
            "choose such a name (e.g. 'ckpt_ledger')"
        )
    return ".".join(f'"{p}"' for p in parts)


def driver_module(conn: Any) -> Any:
    """The DB-API module of ``conn`` (the top package of its class, e.g. sqlite3, psycopg)."""
    return sys.modules.get(type(conn).__module__.split(".")[0])


def detect_paramstyle(conn: Any) -> str:
    """The driver module's DB-API ``paramstyle``; ConfigError if it cannot be told."""
    style = getattr(driver_module(conn), "paramstyle", None)
    if style not in STYLES:
        raise ConfigError(
            f"cannot tell the DB-API paramstyle of {type(conn).__module__}.{type(conn).__name__}: expected the "
            f"driver module to have paramstyle in {STYLES}, found {style!r}; pass paramstyle= to Ledger"
        )
    return str(style)


def placeholders(style: str, values: Sequence[Any]) -> tuple[list[str], Any]:
    """Placeholders for ``values`` in ``style`` and the parameters object to pass to execute()."""
    n = len(values)
    if style == "qmark":
        return ["?"] * n, tuple(values)
    if style == "format":
        return ["%s"] * n, tuple(values)
    if style == "numeric":
        return [f":{i + 1}" for i in range(n)], tuple(values)
    if style == "pyformat":
        return [f"%(p{i})s" for i in range(n)], {f"p{i}": v for i, v in enumerate(values)}
    if style == "named":
        return [f":p{i}" for i in range(n)], {f"p{i}": v for i, v in enumerate(values)}
    raise ConfigError(f"unknown DB-API paramstyle {style!r}: expected one of {STYLES}")


def redact(text: str) -> str:
    """``text`` with passwords of DSNs and URLs masked (driver errors may echo a connection string)."""
    return _SECRET.sub(lambda m: f"{m.group(1)}***" if m.group(1) else f"{m.group(2)}***{m.group(3)}", text)


def integrity_error(conn: Any) -> type[BaseException]:
    """The driver's IntegrityError (a primary key violated), or an exception class never raised."""
    err = getattr(conn, "IntegrityError", None) or getattr(driver_module(conn), "IntegrityError", None)
    return err if isinstance(err, type) and issubclass(err, BaseException) else _Never


class _Never(Exception):
    """Stands for a driver without IntegrityError: never raised."""
