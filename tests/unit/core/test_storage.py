from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.store.storage import LocalStorage, S3Options, check_key, check_keys, join, open_storage


def test_create_is_exclusive_and_atomic(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path)
    assert s.create("a/b.json", b"one") is True
    assert s.create("a/b.json", b"two") is False
    assert s.read("a/b.json") == b"one"
    # no temp files are left behind or listed
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["b.json"]


def test_list_is_recursive_sorted_and_prefix_filtered(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path)
    for key in ["x/2", "x/1", "x/y/3", "xa/4", "z"]:
        s.write(key, key.encode())
    assert [o.key for o in s.list("x/")] == ["x/1", "x/2", "x/y/3"]
    assert [o.key for o in s.list("x")] == ["x/1", "x/2", "x/y/3", "xa/4"]
    assert [o.size for o in s.list("z")] == [1]
    assert s.list("nothing/") == []


def test_list_skips_temp_files_and_does_not_follow_a_link_to_a_directory(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path / "root")
    s.write("state/0/1.delta", b"1")
    (tmp_path / "root" / "state" / "0" / ".2.delta.ckpt-tmp-1234abcd").write_bytes(b"half")  # a write under way
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "big").write_bytes(b"not ours")
    (tmp_path / "root" / "state" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert [(o.key, o.size) for o in s.list()] == [("state/0/1.delta", 1)]
    assert [o.key for o in s.list("state/0/")] == ["state/0/1.delta"]


def test_list_refuses_an_unreadable_directory_instead_of_missing_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    s = LocalStorage(tmp_path / "root")
    s.write("state/0/1.delta", b"1")
    unreadable = str(tmp_path / "root" / "state" / "0")
    scandir = os.scandir

    def refusing(path: str) -> Any:  # what a directory of another user with mode 700 gives (tests run as root)
        if path == unreadable:
            raise PermissionError(13, "Permission denied", path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(StorageError, match=r"cannot list .*/state/0: expected a directory this process \(uid \d+\) "
                                           r"can read, found Permission denied; make it readable"):
        s.list()


def test_delete_prunes_empty_dirs_and_ignores_missing(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path / "root")
    s.write("a/b/c", b"1")
    s.delete(["a/b/c", "missing"])
    assert s.list() == []
    assert not (tmp_path / "root" / "a").exists()
    assert (tmp_path / "root").exists()


def test_read_missing_raises_file_not_found(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path)
    with pytest.raises(FileNotFoundError):
        s.read("nope")
    assert s.stat("nope") is None


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "./a", "a/./b", "a/../b", "x" * 256])
def test_invalid_keys_are_refused_with_reason(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match="invalid storage key"):
        LocalStorage(tmp_path).write(key, b"")


KEYS = ["", "/abs", "a//b", "./a", "a/./b", "a/../b", "a/..", "a/.", "a/", "..", ".", "x" * 256, "a/" + "x" * 256,
        "x" * 255, "\u00e9" * 128, "\u00e9" * 127, "a\nb", "a\n/b", "a/\n", "...", "a/.../b", ".a/b..", "a b/c", "\n"]


@pytest.mark.parametrize("key", KEYS)
def test_many_keys_are_checked_at_once_as_check_key_checks_each(key: str) -> None:
    """check_keys (a manifest's paths) refuses what check_key refuses, with its message, and nothing else."""
    try:
        check_key(key)
        refused = None
    except ConfigError as err:
        refused = str(err)
    for keys in ([key], ["state/0/1/2.delta", key, "commits/3"], [key, "offsets/4"]):
        if refused is None:
            check_keys(keys)
        else:
            with pytest.raises(ConfigError) as raised:
                check_keys(keys)
            assert str(raised.value) == refused


def test_child_and_upload_download(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    s = LocalStorage(tmp_path / "root").child("job")
    seen: list[int] = []
    s.upload(src, "objects/abc", callback=seen.append)
    assert seen == [1000]
    s.download("objects/abc", tmp_path / "out" / "copy.bin")
    assert (tmp_path / "out" / "copy.bin").read_bytes() == b"x" * 1000
    assert s.url.endswith("/root/job")


def test_open_storage_urls(tmp_path: Path) -> None:
    assert isinstance(open_storage(tmp_path), LocalStorage)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    with pytest.raises(ConfigError, match="unsupported storage URL"):
        open_storage("hdfs://nn/path")
    with pytest.raises(ConfigError, match="expected s3://BUCKET/PREFIX"):
        open_storage("s3:///nobucket")
    assert join("a/", "", "/b/", "c") == "a/b/c"


def test_folders_are_the_first_segments_below_a_prefix_without_listing_deeper(tmp_path: Path) -> None:
    s = LocalStorage(tmp_path)
    for key in ("orders/status.json", "orders/objects/aa", "billing/snapshots/x/manifest.json", "top.json"):
        s.write(key, b"x")
    assert s.folders() == ("billing", "orders")
    assert s.folders("orders/") == ("objects",)
    assert s.folders("billing") == ("snapshots",)
    assert s.folders("missing/") == ()


def test_s3_options_role_settings_round_trip_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's supervisor and driver get the role as CKPT_S3_ROLE_* (not AWS_ROLE_ARN: botocore's web identity)."""
    options = S3Options(access_key_id="AKIA", secret_access_key="s", role_arn="arn:aws:iam::1:role/r",
                        role_external_id="ext-secret", role_session_name="n", role_duration_s=3600,
                        sts_endpoint_url="http://sts:1")
    for name, value in options.env().items():
        monkeypatch.setenv(name, value)
    assert S3Options.from_env() == options
    assert "ext-secret" not in repr(options)
    assert options.redacted()["role_arn"] == "arn:aws:iam::1:role/r"


@pytest.mark.parametrize("kwargs", [{"role_duration_s": 60}, {"sts_endpoint_url": "sts.amazonaws.com"}])
def test_s3_options_refuse_a_bad_role_setting(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        S3Options(role_arn="arn:aws:iam::1:role/r", **kwargs)
