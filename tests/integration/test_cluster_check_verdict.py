"""A restore check in cluster mode gets its verdict back (issue 42): the check driver runs in the cluster, so its
report line never reaches the launcher's output; the launcher names the check's run, the driver records its verdict
with its end record in the job store (core/records/supervision.py DriverEnd), and the launcher reads it (and deletes
it). On SeaweedFS; YARN cluster mode, with a stand-in for spark-submit that plays the remote driver: it writes the
end record the real entrypoint writes (its report, as entrypoint.py gives it) and prints nothing of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy.modes import RestoreSpec
from airflow_ckpt_provider.core.records.supervision import DRIVER_ENDS
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded.seaweedfs import EmbeddedS3
from airflow_ckpt_provider.launcher.restore_check import check_restore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck

pytestmark = pytest.mark.integration

#: spark-submit in YARN cluster mode, as the launcher sees it: it exits 0 when the application ends and prints the
#: client's lines only. The driver (here: this script) records its end in the job store as entrypoint.py does.
REMOTE_DRIVER = """#!{python}
import json, os, sys, time
from airflow_ckpt_provider.core.records.supervision import DriverEnd, write_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options

argv = sys.argv[1:]
conf = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
run = conf.get("spark.yarn.appMasterEnv.CKPT_DRIVER_RUN")
print("INFO Client: Application report for application_1_0001 (state: FINISHED)", flush=True)
if run:
    store = JobStore.open(os.environ["STORE"], "orders", S3Options.from_env(None, None))
    write_driver_end(store, DriverEnd(job="orders", run=run, code=0, at=time.time(), host="nm-3", pid=1,
                                      report=json.loads(os.environ["REPORT"])))
"""


def test_a_cluster_mode_restore_check_gets_its_verdict_from_the_drivers_end_record(
        s3_server: EmbeddedS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_url = f"s3://{bucket}/jobs"
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    report = RestoreCheck(CheckOutcome.COMPATIBLE, "orders_v2.py can restore savepoint sp-1 (batch 41)",
                          snapshot_id="savepoint-41-20261129T000000Z-abc123", batch_id=41)
    monkeypatch.setenv("STORE", store_url)
    monkeypatch.setenv("REPORT", json.dumps(report.to_dict()))
    submit = tmp_path / "spark-submit"
    submit.write_text(REMOTE_DRIVER.format(python=sys.executable))
    submit.chmod(0o755)
    config = RuntimeConfig(job="orders", store=store_url, checkpoint=f"s3a://{bucket}/ckpt/orders",
                           restore=RestoreSpec.parse("latest-state"), endpoint_url=s3_server.endpoint_url,
                           region=s3_server.region)
    spec = SubmitSpec(job_file="s3a://code/orders_v2.py", config=config, master="yarn", deploy_mode="cluster",
                      spark_submit=str(submit), conf={"spark.yarn.maxAppAttempts": "1"})

    got = check_restore(spec, 60.0, log_file=str(tmp_path / "check.log"))

    assert (got.outcome, got.reason, got.snapshot_id, got.batch_id) == (
        CheckOutcome.COMPATIBLE, report.reason, report.snapshot_id, 41)
    s3 = S3Options(endpoint_url=s3_server.endpoint_url, region=s3_server.region,
                   access_key_id=s3_server.access_key, secret_access_key=s3_server.secret_key)
    assert JobStore.open(store_url, "orders", s3).storage.list(DRIVER_ENDS) == []  # read once, then deleted


def test_without_an_end_record_the_cluster_mode_check_has_no_verdict_and_says_why(
        s3_server: EmbeddedS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    submit = tmp_path / "spark-submit"
    submit.write_text(f"#!{sys.executable}\nprint('INFO Client: application_1_0002 (state: FAILED)')\n")
    submit.chmod(0o755)
    store_url = f"s3://{bucket}/jobs"
    config = RuntimeConfig(job="orders", store=store_url, checkpoint=f"s3a://{bucket}/ckpt/orders",
                           restore=RestoreSpec.parse("latest-state"), endpoint_url=s3_server.endpoint_url,
                           region=s3_server.region)
    spec = SubmitSpec(job_file="s3a://code/orders_v2.py", config=config, master="yarn", deploy_mode="cluster",
                      spark_submit=str(submit))
    got = check_restore(spec, 60.0, log_file=str(tmp_path / "check.log"))
    assert got.outcome is CheckOutcome.INCONCLUSIVE
    assert "exited with 0 (stopped) without a verdict" in got.reason and "state: FAILED" in got.reason
