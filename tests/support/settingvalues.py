"""Values for settings tests: a non-default value for every setting, derived from its kind."""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.core.policy.modes import Mode
from airflow_ckpt_provider.core.policy.settings import COUNT, SECONDS, SWITCH, TEXT, Settings, setting_fields


def non_defaults(cls: type[Settings]) -> dict[str, Any]:
    """A value other than the default for every setting of ``cls``, derived from its kind: a setting added
    later is covered by the tests below without editing them."""
    values: dict[str, Any] = {}
    for f, m in setting_fields(cls):
        default = f.default
        if m.kind is SECONDS:
            values[f.name] = default + 1.0 if default else 4.0
        elif m.kind is COUNT:
            values[f.name] = default + 1 if default else 2
        elif m.kind is SWITCH:
            values[f.name] = not default
        elif m.kind is TEXT:
            values[f.name] = f"/generated/{f.name}"
        else:  # a mode: its last member (failure-rate, refuse)
            members = list(type(default)) if isinstance(default, Mode) else []
            assert members, f"no generated value for setting {f.name}: teach non_defaults its kind"
            values[f.name] = members[-1]
    valid = {"metrics_address": "127.0.0.1:9464", "metrics_otlp": "http://127.0.0.1:4318/v1/metrics"}  # checked forms
    values.update({name: value for name, value in valid.items() if name in values})
    if "fence_grace" in values:  # a rule across two settings: the grace at least twice the lease interval + 1 s
        values["fence_grace"] = 2 * values["lease_interval"] + 1
    return values
