"""RuntimeConfig and RestoreSpec: parsing, the argv round trip to the driver, and validation messages."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.runtime.config import RestoreMode, RestoreSpec, RuntimeConfig

SNAPSHOT_ID = "savepoint-17-20261122T101500Z-abc123"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest-state", RestoreSpec(RestoreMode.LATEST_STATE)),
        ("LATEST_STATE", RestoreSpec(RestoreMode.LATEST_STATE)),
        ("  latest-savepoint ", RestoreSpec(RestoreMode.LATEST_SAVEPOINT)),
        ("Latest_Savepoint", RestoreSpec(RestoreMode.LATEST_SAVEPOINT)),
        ("none", RestoreSpec(RestoreMode.NONE)),
        ("NONE", RestoreSpec(RestoreMode.NONE)),
        (SNAPSHOT_ID, RestoreSpec(RestoreMode.SNAPSHOT, SNAPSHOT_ID)),
        (f" s3://b/jobs/orders/snapshots/{SNAPSHOT_ID} ",
         RestoreSpec(RestoreMode.SNAPSHOT, f"s3://b/jobs/orders/snapshots/{SNAPSHOT_ID}")),
    ],
)
def test_restore_spec_parses_every_form(text: str, expected: RestoreSpec) -> None:
    assert RestoreSpec.parse(text) == expected
    assert str(RestoreSpec.parse(str(expected))) == str(expected)


@pytest.mark.parametrize("text", ["", "   "])
def test_restore_spec_refuses_empty(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid restore strategy .*expected latest-state, latest-savepoint, none"):
        RestoreSpec.parse(text)


@pytest.mark.parametrize("text", ["snapshot", "SNAPSHOT", " Snapshot "])
def test_restore_spec_snapshot_without_a_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="restore strategy 'snapshot' needs the snapshot: pass its id or URI"):
        RestoreSpec.parse(text)


def test_str_names_the_snapshot_or_the_mode() -> None:
    assert str(RestoreSpec(RestoreMode.SNAPSHOT, SNAPSHOT_ID)) == SNAPSHOT_ID
    assert str(RestoreSpec(RestoreMode.LATEST_SAVEPOINT)) == "latest-savepoint"


def test_defaults_and_checkpoint_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_HOME", "/var/ckpt")
    cfg = RuntimeConfig(job="orders", store="s3://b/jobs")
    assert cfg.checkpoint == "/var/ckpt/jobs/orders/checkpoint"
    assert cfg.restore_spec() == RestoreSpec(RestoreMode.LATEST_STATE)
    assert (cfg.checkpoint_interval, cfg.savepoint_interval, cfg.keep_checkpoints) == (60.0, None, 3)


def test_round_trip_through_args_keeps_every_field() -> None:
    cfg = RuntimeConfig(
        job="orders.v2", store="s3://bucket/jobs", checkpoint="/tmp/ckpt/orders", restore=SNAPSHOT_ID,
        checkpoint_interval=0.1, savepoint_interval=3600.5, keep_checkpoints=7, keep_savepoints=2,
        heartbeat_interval=2.5, poll_interval=0.25, lease_interval=0.25, fence_grace=1.5, code_version="git-1a2b3c",
        endpoint_url="http://127.0.0.1:8333", region="eu-west-1",
    )
    args = cfg.to_args()
    assert args[:4] == ["--job", "orders.v2", "--store", "s3://bucket/jobs"]
    assert RuntimeConfig.from_args(args) == cfg


def test_round_trip_keeps_none_values() -> None:
    cfg = RuntimeConfig(job="j", store="/data/store", checkpoint="/c", restore="none", checkpoint_interval=None,
                        savepoint_interval=None, keep_savepoints=None)
    args = cfg.to_args()
    assert args[args.index("--checkpoint-interval") + 1] == "none"  # differs from the default (60 s)
    back = RuntimeConfig.from_args(args)
    assert back == cfg
    assert back.restore_spec() == RestoreSpec(RestoreMode.NONE)  # "none" the strategy is not None the value
    assert (back.checkpoint_interval, back.code_version, back.endpoint_url, back.region) == (None, None, None, None)


def test_from_args_uses_defaults_for_missing_options() -> None:
    cfg = RuntimeConfig.from_args(["--job", "j", "--store", "/s", "--checkpoint", "/c", "--poll-interval", "2",
                                   "--fence-grace", "4"])
    assert cfg == RuntimeConfig(job="j", store="/s", checkpoint="/c", poll_interval=2.0, fence_grace=4.0)
    assert isinstance(cfg.poll_interval, float) and isinstance(cfg.keep_checkpoints, int)


@pytest.mark.parametrize("job", ["", "-leading-dash", "has space", "a/b", "x" * 129, "ö"])
def test_bad_job_name_is_refused(job: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid job name .*expected 1-128 characters of letters, digits"):
        RuntimeConfig(job=job, store="/s", checkpoint="/c")


def test_missing_store_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"no job store given: expected s3://BUCKET/PREFIX or a directory"):
        RuntimeConfig(job="j", store="", checkpoint="/c")


def test_bad_restore_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="restore strategy 'snapshot' needs the snapshot"):
        RuntimeConfig(job="j", store="/s", checkpoint="/c", restore="snapshot")


@pytest.mark.parametrize("name", ["checkpoint_interval", "savepoint_interval"])
def test_negative_interval_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} must be >= 0 seconds or unset, found -1.0$"):
        # ignore[arg-type] below: name is one of the two interval fields
        RuntimeConfig(job="j", store="/s", checkpoint="/c", **{name: -1.0})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["heartbeat_interval", "poll_interval"])
def test_non_positive_heartbeat_and_poll_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} must be > 0 seconds, found 0.0$"):
        # ignore[arg-type] below: name is one of the two interval fields
        RuntimeConfig(job="j", store="/s", checkpoint="/c", **{name: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize(("fence_grace", "lease"), [(10.0, 4.0), (20.0, 5.0), (4.0, 4 / 3), (3.0, 1.0)])
def test_the_default_lease_interval_leaves_the_outage_tolerance_a_reads_margin(fence_grace: float,
                                                                               lease: float) -> None:
    cfg = RuntimeConfig(job="j", store="/s", checkpoint="/c", fence_grace=fence_grace)
    assert cfg.lease_interval is None and cfg.lease_seconds == pytest.approx(lease)
    assert fence_grace - cfg.lease_seconds > cfg.lease_seconds  # the tolerance outlasts an interval
    assert RuntimeConfig(job="j", store="/s", checkpoint="/c", lease_interval=0.5).lease_seconds == 0.5


def test_fence_grace_below_twice_the_lease_interval_is_refused() -> None:
    with pytest.raises(ConfigError,
                       match=r"fence_grace \(4.9 s\) must be at least twice lease_interval \(2.0 s\) \+ 1 s"):
        RuntimeConfig(job="j", store="/s", checkpoint="/c", lease_interval=2.0, fence_grace=4.9)
    assert RuntimeConfig(job="j", store="/s", checkpoint="/c", lease_interval=2.0, fence_grace=5.0).fence_grace == 5.0


@pytest.mark.parametrize(
    ("option", "raw", "message"),
    [
        ("--poll-interval", "fast", "--poll-interval: expected seconds, found 'fast'"),
        ("--checkpoint-interval", "5m", "--checkpoint-interval: expected seconds or 'none', found '5m'"),
        ("--keep-checkpoints", "2.5", "--keep-checkpoints: expected a whole number, found '2.5'"),
        ("--keep-savepoints", "many", "--keep-savepoints: expected a whole number or 'none', found 'many'"),
        ("--poll-interval", "nan", "--poll-interval: expected seconds, found 'nan'"),
        ("--savepoint-interval", "inf", "--savepoint-interval: expected seconds or 'none', found 'inf'"),
        # Only optional fields may be unset: "none" elsewhere is refused here, not a TypeError later.
        ("--heartbeat-interval", "none", "--heartbeat-interval: expected seconds, found 'none'"),
        ("--keep-checkpoints", "none", "--keep-checkpoints: expected a whole number, found 'none'"),
    ],
)
def test_non_numeric_values_are_refused(option: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        RuntimeConfig.from_args(["--job", "j", "--store", "/s", "--checkpoint", "/c", option, raw])
    assert str(err.value) == message


def test_from_args_validates_like_the_constructor() -> None:
    with pytest.raises(ConfigError, match=r"fence_grace .* must be at least twice lease_interval"):
        RuntimeConfig.from_args(["--job", "j", "--store", "/s", "--lease-interval", "6"])
    with pytest.raises(ConfigError, match="checkpoint_interval must be >= 0"):
        RuntimeConfig.from_args(["--job", "j", "--store", "/s", "--checkpoint-interval", "-0.5"])


def test_to_args_leaves_out_unset_settings_whose_default_is_unset_never_printing_none() -> None:
    cfg = RuntimeConfig(job="j", store="s3://b/jobs", checkpoint="/c", checkpoint_interval=None)
    args = cfg.to_args()
    for flag in ("--endpoint-url", "--region", "--code-version", "--savepoint-interval", "--keep-savepoints"):
        assert flag not in args
    assert [a for a in args if a.lower() == "none"] == ["none"]  # only --checkpoint-interval none (never)
    assert RuntimeConfig.from_args(args) == cfg
