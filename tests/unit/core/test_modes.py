"""core/policy/modes.py: one spelling per mode, old spellings warn and map, bad values say what is expected."""

from __future__ import annotations

import warnings

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import (
    KillPolicy,
    Mode,
    RestartStrategyName,
    RestoreMode,
    RestoreSpec,
    StopMode,
    TimeTravel,
    UpgradeMode,
)

MODES: list[type[Mode]] = [StopMode, KillPolicy, UpgradeMode, RestartStrategyName, TimeTravel, RestoreMode]


@pytest.mark.parametrize("kind", MODES)
def test_every_spelling_is_hyphenated_lowercase_and_parses_silently(kind: type[Mode]) -> None:
    for member in kind:
        assert member.value == member.value.lower() and "_" not in member.value
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert kind.parse(member) is member
            assert kind.parse(member.value) is member
            assert kind.parse(f"  {member.value} ") is member  # a rendered template's whitespace


@pytest.mark.parametrize(("kind", "old", "member"), [
    (KillPolicy, "leave_running", KillPolicy.LEAVE_RUNNING),
    (KillPolicy, "stop_with_savepoint", KillPolicy.STOP_WITH_SAVEPOINT),
    (KillPolicy, "CANCEL", KillPolicy.CANCEL),
    (StopMode, "SAVEPOINT", StopMode.SAVEPOINT),
    (StopMode, "stop_with_savepoint", StopMode.SAVEPOINT),
    (StopMode, "stop-with-savepoint", StopMode.SAVEPOINT),
    (UpgradeMode, "last_state", UpgradeMode.LAST_STATE),
    (UpgradeMode, "Last-State", UpgradeMode.LAST_STATE),
    (RestartStrategyName, "fixed_delay", RestartStrategyName.FIXED_DELAY),
    (RestartStrategyName, "EXPONENTIAL_DELAY", RestartStrategyName.EXPONENTIAL_DELAY),
    (RestartStrategyName, "failure_rate", RestartStrategyName.FAILURE_RATE),
    (TimeTravel, "REFUSE", TimeTravel.REFUSE),
    (RestoreMode, "latest_state", RestoreMode.LATEST_STATE),
])
def test_every_old_spelling_warns_and_maps(kind: type[Mode], old: str, member: Mode) -> None:
    with pytest.warns(DeprecationWarning, match=f"{kind.what()} '{old}' is deprecated: use '{member.value}'"):
        assert kind.parse(old) is member


def test_the_warning_class_can_be_the_callers() -> None:
    class ProviderDeprecation(DeprecationWarning):
        pass

    with pytest.warns(ProviderDeprecation):
        assert KillPolicy.parse("leave_running", warning=ProviderDeprecation) is KillPolicy.LEAVE_RUNNING


@pytest.mark.parametrize(("kind", "bad", "message"), [
    (StopMode, "kill", "invalid stop mode: expected one of savepoint, cancel, found 'kill'; savepoint stops with a "
                       "final savepoint, cancel stops now"),
    (KillPolicy, "explode", "invalid on_kill_policy: expected one of leave-running, stop-with-savepoint, cancel, "
                            "found 'explode'; leave-running keeps the job"),
    (UpgradeMode, "blue-green", "invalid upgrade_mode: expected one of savepoint, last-state, stateless, found "
                                "'blue-green'; savepoint keeps exactly the stopped state"),
    (RestartStrategyName, "immediately", "invalid restart strategy: expected one of exponential-delay, fixed-delay, "
                                         "failure-rate, found 'immediately'; these are Flink's restart strategies"),
    (TimeTravel, "maybe", "invalid time-travel policy: expected one of fork, refuse, found 'maybe'; fork restores"),
    (StopMode, None, "invalid stop mode: expected one of savepoint, cancel, found None"),
    (StopMode, 3, "invalid stop mode: expected one of savepoint, cancel, found 3"),
])
def test_bad_values_say_what_was_expected_what_was_found_and_what_to_do(kind: type[Mode], bad: object,
                                                                         message: str) -> None:
    with pytest.raises(ConfigError) as err:
        kind.parse(bad)
    assert str(err.value).startswith(message)


def test_an_upgrade_mode_names_how_the_old_driver_stops() -> None:
    assert [m.stop for m in UpgradeMode] == [StopMode.SAVEPOINT, StopMode.CANCEL, StopMode.CANCEL]


def test_modes_are_their_spelling_as_str() -> None:  # templating, XCom and DAG serialization see the text
    assert KillPolicy.STOP_WITH_SAVEPOINT == "stop-with-savepoint" and f"{UpgradeMode.LAST_STATE}" == "last-state"


@pytest.mark.parametrize(("text", "expected"), [
    ("latest-state", RestoreSpec(RestoreMode.LATEST_STATE)),
    ("none", RestoreSpec(RestoreMode.NONE)),
    ("savepoint-7-20261122T101500Z-abc123", RestoreSpec(RestoreMode.SNAPSHOT, "savepoint-7-20261122T101500Z-abc123")),
])
def test_restore_spec_parses_its_spellings_silently_and_prints_them_back(text: str, expected: RestoreSpec) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RestoreSpec.parse(text) == expected
        assert RestoreSpec.parse(expected) is expected
    assert str(expected) == text


def test_restore_spec_old_spellings_warn() -> None:
    with pytest.warns(DeprecationWarning, match="'LATEST_SAVEPOINT' is deprecated: use 'latest-savepoint'"):
        assert RestoreSpec.parse("LATEST_SAVEPOINT") == RestoreSpec(RestoreMode.LATEST_SAVEPOINT)
