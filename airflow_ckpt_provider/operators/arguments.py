"""Operator arguments read through core/policy/settings.py and core/policy/modes.py.

A literal argument is parsed in ``__init__`` (at DAG parse time: a bad value is an import error of the DAG,
an old spelling an AirflowProviderDeprecationWarning); a templated one is parsed in ``execute``, once
rendered. Parsed modes are str-valued enums, so templating and DAG serialization see their spelling.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import airflow
from airflow.exceptions import AirflowProviderDeprecationWarning

import airflow_ckpt_provider
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import Mode, RestoreSpec
from airflow_ckpt_provider.core.policy.settings import Settings, setting_fields

M = TypeVar("M", bound=Mode)
T = TypeVar("T")
S = TypeVar("S", bound=Settings)


def is_template(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


#: Where the frames of this package and of Airflow are: a warning names the first frame outside them (the DAG's).
_INSIDE = tuple(str(Path(module.__file__ or "").parent) for module in (airflow_ckpt_provider, airflow))


def _as_airflow_warnings(parse: Callable[[], T]) -> T:
    """``parse()``, its DeprecationWarnings re-issued as Airflow's provider deprecation warnings, pointing at
    the line of the DAG file that made the operator."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = parse()
    if caught:
        frame, level = sys._getframe(0), 1
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
            frame, level = frame.f_back, level + 1
        for w in caught:
            category = AirflowProviderDeprecationWarning if issubclass(w.category, DeprecationWarning) else w.category
            warnings.warn(str(w.message), category, stacklevel=level)
    return value


def parse_mode(kind: type[M], value: object) -> M:
    """The member of ``kind`` that ``value`` (rendered) names; ConfigError if none."""
    return _as_airflow_warnings(lambda: kind.parse(value))


def mode_arg(kind: type[M], value: object) -> M | str:
    """``value`` parsed now, unless it is a template (``execute`` parses it with ``parse_mode``)."""
    return value if is_template(value) else parse_mode(kind, value)


def restore_arg(value: object) -> str:
    """A restore strategy argument in its one spelling (checked now), or the template as given."""
    if is_template(value):
        return str(value)
    return str(_as_airflow_warnings(lambda: RestoreSpec.parse(value)))


def parse_restore(value: object) -> RestoreSpec:
    return _as_airflow_warnings(lambda: RestoreSpec.parse(value))


def path_list(value: object, name: str) -> tuple[str, ...]:
    """A (rendered) list argument of paths or URIs (``py_files``, ``files``): a sequence of strings or one
    comma-separated string (what a template renders to), blanks dropped; None is none. ConfigError otherwise."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(item, str) for item in items):
        raise ConfigError(f"{name} must be a list of paths or URIs (or one comma-separated string), found "
                          f"{type(value).__name__} {str(value)[:80]!r}")
    return tuple(part.strip() for item in items for part in item.split(",") if part.strip())


def with_settings(init: Callable[..., None], cls: type[Settings], skip: Sequence[str] = ()) -> inspect.Signature:
    """``init``'s signature with a keyword-only parameter per setting of ``cls`` (but ``skip``) before its
    ``**kwargs``: what Airflow reads to apply ``default_args`` and to check ``partial()``/``expand()``."""
    signature = inspect.signature(init)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    rest = [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    taken = {p.name for p in own}
    settings = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                for f, _ in setting_fields(cls) if f.name not in skip and f.name not in taken]
    return signature.replace(parameters=[*own, *settings, *rest])


def settings_args(cls: type[Settings], kwargs: dict[str, Any], skip: Sequence[str] = ()) -> dict[str, Any]:
    """Pop every setting of ``cls`` (but ``skip``) out of an operator's ``kwargs`` (else its ``default_args``,
    else the field's default), each parsed unless templated: what the operator keeps as attributes."""
    defaults: Mapping[str, Any] = kwargs.get("default_args") or {}
    found: dict[str, Any] = {}
    for f, meta in setting_fields(cls):
        if f.name in skip:
            continue
        value = kwargs.pop(f.name) if f.name in kwargs else defaults.get(f.name, f.default)
        if is_template(value):
            found[f.name] = value
        else:
            found[f.name] = _as_airflow_warnings(partial(meta.parse, value, f.name))
    return found


def settings_of(cls: type[S], op: object, skip: Sequence[str] = (), **more: Any) -> S:
    """``cls`` built from the operator's (rendered) attributes of the same names (but ``skip``, which keep
    their defaults) and ``more``; ConfigError if bad."""
    given = {f.name: getattr(op, f.name) for f, _ in setting_fields(cls) if f.name not in skip and f.name not in more}
    return _as_airflow_warnings(lambda: cls(**given, **more))
