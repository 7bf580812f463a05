"""Both storage backends against the same contract; S3 error cases against a real SeaweedFS."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage
from airflow_ckpt_provider.embedded import EmbeddedS3, free_port

pytestmark = pytest.mark.integration


def test_contract(store_root: Storage, tmp_path: Path) -> None:
    s = store_root.child("job-a")
    s.write("snapshots/1/manifest.json", b"{}")
    assert s.create("objects/abc", b"data") is True
    assert s.create("objects/abc", b"other") is False
    assert s.read("objects/abc") == b"data"
    assert [o.key for o in s.list("objects/")] == ["objects/abc"]
    assert [o.key for o in s.list()] == ["objects/abc", "snapshots/1/manifest.json"]
    info = s.stat("objects/abc")
    assert info is not None and info.size == 4
    with pytest.raises(FileNotFoundError):
        s.read("objects/missing")
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (20 * 4096 + 1))  # > multipart threshold (16 MiB)
    moved: list[int] = []
    s.upload(big, "objects/big", callback=moved.append)
    assert sum(moved) == big.stat().st_size
    s.download("objects/big", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    s.delete(["objects/abc", "objects/big", "objects/never"])
    assert [o.key for o in s.list()] == ["snapshots/1/manifest.json"]


def test_conditional_create_has_exactly_one_winner(store_root: Storage) -> None:
    s = store_root.child("race")
    wins: list[int] = []

    def attempt(i: int) -> None:
        if s.create("lease.json", str(i).encode()):
            wins.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert s.read("lease.json") == str(wins[0]).encode()


def test_a_created_object_s_tag_is_the_one_its_listing_and_stat_report_and_changes_with_a_same_size_write(
        store_root: Storage) -> None:
    s = store_root.child("tags")
    tag = s.create_tagged("snapshots/1/manifest.json", b'{"batch_id": 1}')
    assert tag and s.create_tagged("snapshots/1/manifest.json", b"other") is None
    [listed] = s.list("snapshots/")
    stat = s.stat("snapshots/1/manifest.json")
    assert listed.version == tag and stat is not None and stat.version == tag
    s.write("snapshots/1/manifest.json", b'{"batch_id": 2}')  # the same size, at once
    [again] = s.list("snapshots/")
    assert again.size == listed.size and again.version != tag


def test_wrong_credentials_are_refused_clearly(s3_server: EmbeddedS3, bucket: str, s3_options: S3Options) -> None:
    bad = S3Options(endpoint_url=s3_options.endpoint_url, region=s3_options.region,
                    access_key_id=s3_options.access_key_id, secret_access_key="wrong-secret")
    with pytest.raises(StorageError, match="refused the credentials") as err:
        open_storage(f"s3://{bucket}/x", bad).list()
    assert "wrong-secret" not in str(err.value)
    assert s3_options.access_key_id not in str(err.value)  # only a prefix of the key id is shown


def test_missing_bucket_is_named(s3_options: S3Options) -> None:
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        open_storage("s3://no-such-bucket/x", s3_options).write("k", b"v")


def test_unreachable_endpoint_fails_after_retries() -> None:
    opts = S3Options(endpoint_url=f"http://127.0.0.1:{free_port()}", region="us-east-1",
                     access_key_id="AK", secret_access_key="SK", connect_timeout=1.0)
    with pytest.raises(StorageError, match="cannot reach S3 endpoint"):
        open_storage("s3://b/x", opts).list()


def test_create_recognizes_its_own_earlier_attempt(s3_root: Storage) -> None:
    """A PUT that landed but whose response was lost is retried, gets 412, and still counts as ours."""
    s3_root.write("job/snapshots/x/manifest.json", b"our unique bytes")  # the attempt that landed
    assert s3_root.create("job/snapshots/x/manifest.json", b"our unique bytes") is True
    stored = s3_root.stat("job/snapshots/x/manifest.json")
    assert stored is not None and s3_root.create_tagged("job/snapshots/x/manifest.json", b"our unique bytes") == \
        stored.version
    assert s3_root.create("job/snapshots/x/manifest.json", b"someone else's bytes") is False


def test_s3_refuses_a_content_addressed_body_that_does_not_match_its_sha256(s3_root: Storage) -> None:
    """Snapshot objects travel with their SHA-256: a body corrupted on the way never lands under its name."""
    import hashlib

    body = b"state file" * 100
    s3_root.write_object("job/objects/ok", body, hashlib.sha256(body).hexdigest())
    assert s3_root.read("job/objects/ok") == body
    with pytest.raises(StorageError, match="BadDigest"):
        s3_root.write_object("job/objects/bad", body, hashlib.sha256(b"what was hashed").hexdigest())
    assert s3_root.stat("job/objects/bad") is None


def test_endpoint_without_scheme_is_refused_clearly() -> None:
    from airflow_ckpt_provider.core.errors import ConfigError

    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        S3Options(endpoint_url="127.0.0.1:9000")
    assert "secret" not in repr(S3Options(access_key_id="AKIAEXAMPLE", secret_access_key="secret"))


def test_every_s3_put_carries_the_sha256_of_its_body_and_is_not_signed_twice(s3_root: Storage) -> None:
    """The server checks each body against the checksum header the signature covers; botocore hashes no body again."""
    import base64
    import hashlib

    sent: list[tuple[str, str]] = []

    def header(request: Any, name: str) -> str:
        value = request.headers.get(name, "")
        return value.decode() if isinstance(value, bytes) else str(value)

    def record(request: Any, **_: Any) -> None:
        sent.append((header(request, "x-amz-checksum-sha256"), header(request, "X-Amz-Content-SHA256")))

    events = s3_root.client.meta.events  # type: ignore[attr-defined]  # S3Storage's shared boto3 client
    events.register("before-send.s3.PutObject", record)
    state = b"state file" * 100
    try:
        s3_root.write("job/status.json", b"status")
        assert s3_root.create("job/snapshots/a/manifest.json", b"manifest") is True
        current = s3_root.read_versioned("job/status.json")
        assert current is not None and s3_root.write_if("job/status.json", b"status 2", current.tag) is True
        s3_root.write_object("job/objects/x", state, hashlib.sha256(state).hexdigest())
    finally:
        events.unregister("before-send.s3.PutObject", record)
    bodies = [b"status", b"manifest", b"status 2", state]  # write, create, write_if, write_object
    assert sent == [(base64.b64encode(hashlib.sha256(b).digest()).decode(), "UNSIGNED-PAYLOAD") for b in bodies]


def test_every_s3_request_of_the_process_is_counted_by_its_operation(bucket: str, s3_options: S3Options) -> None:
    """core/store/requestcount.py: what the driver reports as its store request rate (status.json store_rates)."""
    from airflow_ckpt_provider.core.store import requestcount

    storage = open_storage(f"s3://{bucket}/counted", s3_options)
    before = requestcount.counts()
    storage.write("a.json", b"1")
    storage.read("a.json")
    storage.read_versioned("a.json")
    storage.stat("a.json")
    storage.list()
    storage.delete(["a.json"])
    after = requestcount.counts()
    grown = {op: after.get(op, 0) - before.get(op, 0) for op in after if after.get(op, 0) != before.get(op, 0)}
    assert grown == {"PutObject": 1, "GetObject": 2, "HeadObject": 1, "ListObjectsV2": 1, "DeleteObjects": 1}
