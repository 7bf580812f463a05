"""`ckpt recipe`: the production recipes as text. The Kubernetes manifests parse, the SparkApplication validates against
the Kubeflow Spark operator's CRD schema (tests/fixtures/k8s, strict about unknown fields as `kubectl apply
--validate=strict` is), the connections they hold pass `ckpt run`'s own checks in supervised cluster mode, no
credential is written, and bad settings are refused naming what to pass. Through the real CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreSpec
from airflow_ckpt_provider.launcher.sparkapp import driver_command
from airflow_ckpt_provider.launcher.sparktarget import SparkTarget
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.runtime.config import RuntimeConfig

SCHEMA = Path(__file__).parents[2] / "fixtures" / "k8s" / "sparkapplication-v1beta2-schema.json"
STORE = "s3://acme-streaming/jobs"
IMAGE = "registry.acme/ckpt-provider:0.1.0"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def recipe(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> dict[str, str]:
    """The files `ckpt recipe ARGS --out DIR` wrote (the command must succeed)."""
    out = tmp_path / "recipe"
    assert cli.main(["recipe", *args, "--out", str(out)]) == 0, capsys.readouterr().err
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema refusing unknown fields, as the API server's strict field validation does."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def accepted_by_ckpt_run(connection: dict[str, Any]) -> list[str]:
    """The command a supervisor runs for a driver of a job with this ckpt_spark connection (spark-submit's, or the
    SparkApplication holder's: launcher/sparkapp.driver_command); its checks raise ConfigError on a connection it would
    refuse."""
    extra = connection["extra"]
    target = SparkTarget.from_fields(host=connection["host"], deploy_mode=extra["deploy_mode"], conf=extra["conf"],
                                     python_env=extra["python_env"])
    config = RuntimeConfig(job="orders", store=STORE, checkpoint="s3a://acme-streaming/ckpt/orders",
                           restore=RestoreSpec.parse(LATEST_STATE))
    spec = SubmitSpec(job_file="local:///opt/jobs/orders.py", config=config, master=target.master,
                      deploy_mode=target.deploy_mode, conf=target.conf, spark_submit="/opt/spark/bin/spark-submit",
                      supervised=True, driver_run="20261129T110000Z-abc123-1")
    argv, _ = driver_command(spec)
    return argv


@pytest.fixture(autouse=True)
def _a_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # never to be written into a recipe
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")


def test_kubernetes_runs_two_instances_spread_over_nodes_with_the_rbac_spark_submit_needs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = recipe(capsys, tmp_path, "kubernetes", "--store", STORE, "--image", IMAGE, "--namespace", "streaming",
                   "--endpoint-url", "https://s3.eu.example")
    assert list(files) == ["ckpt-service.yaml"]
    text = files["ckpt-service.yaml"]
    assert SECRET not in text and "AKIAIOSFODNN7EXAMPLE" not in text
    docs = documents(text)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ServiceAccount", "ckpt-service"), ("Role", "ckpt-service"), ("RoleBinding", "ckpt-service"),
        ("ServiceAccount", "ckpt-spark-driver"), ("Role", "ckpt-spark-driver"), ("RoleBinding", "ckpt-spark-driver"),
        ("Deployment", "ckpt-service"), ("PodDisruptionBudget", "ckpt-service"),
        ("ConfigMap", "ckpt-airflow-connections")]
    assert {d["metadata"]["namespace"] for d in docs} == {"streaming"}
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}

    deployment = by_kind["Deployment", "ckpt-service"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}  # one instance at a time
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == "ckpt-service"
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    (container,) = pod["containers"]
    assert container["command"] == ["ckpt", "service", "run", "--store", STORE, "--instance", "$(POD_NAME)"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["AWS_ENDPOINT_URL"]["value"] == "https://s3.eu.example"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "ckpt-store-credentials", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert by_kind["PodDisruptionBudget", "ckpt-service"]["spec"]["minAvailable"] == 1

    for account in ("ckpt-service", "ckpt-spark-driver"):  # spark-submit makes the driver pod, the driver executors
        (rule,) = by_kind["Role", account]["rules"]
        assert {"pods", "services", "configmaps"} <= set(rule["resources"])
        assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
        binding = by_kind["RoleBinding", account]
        assert binding["roleRef"]["name"] == account
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "streaming"}]

    connections = by_kind["ConfigMap", "ckpt-airflow-connections"]["data"]
    spark = json.loads(connections["AIRFLOW_CONN_CKPT_SPARK_DEFAULT"])
    assert spark["host"] == "k8s://https://kubernetes.default.svc:443"
    argv = accepted_by_ckpt_run(spark)  # supervised Kubernetes cluster mode: the driver's end record decides
    assert "spark.kubernetes.authenticate.driver.serviceAccountName=ckpt-spark-driver" in argv
    assert "spark.kubernetes.driverEnv.CKPT_DRIVER_RUN=20261129T110000Z-abc123-1" in argv
    assert "spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY=ckpt-store-credentials:AWS_SECRET_ACCESS_KEY" \
        in argv
    assert json.loads(connections["AIRFLOW_CONN_CKPT_STORE_DEFAULT"]) == {
        "conn_type": "ckpt_store", "host": "https://s3.eu.example", "extra": {"store_url": STORE}}


def test_the_sparkapplication_the_service_submits_validates_against_the_operators_crd_with_its_restarts_off(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = recipe(capsys, tmp_path, "kubernetes", "--store", STORE, "--image", IMAGE, "--drivers", "sparkapplication",
                   "--job", "orders", "--job-file", "local:///opt/jobs/orders.py",
                   "--checkpoint", "s3a://acme-streaming/ckpt/orders")
    assert list(files) == ["ckpt-service.yaml", "orders-sparkapplication.yaml"]
    (app,) = documents(files["orders-sparkapplication.yaml"])
    schema = strict(json.loads(SCHEMA.read_text())["openAPIV3Schema"])
    jsonschema.validate(app, schema)
    spec = app["spec"]
    assert spec["restartPolicy"] == {"type": "Never"}  # one owner of restarts, never the operator as well
    assert (spec["type"], spec["mode"], spec["mainApplicationFile"]) == ("Python", "cluster",
                                                                         "local:///opt/ckpt/entrypoint.py")
    assert spec["deps"] == {"files": ["local:///opt/jobs/orders.py"]}
    args = spec["arguments"]
    assert args[:7] == ["orders.py", "--job", "orders", "--store", STORE, "--checkpoint",
                        "s3a://acme-streaming/ckpt/orders"]
    assert args[args.index("--restore") + 1] == "latest-state"  # each start resumes the latest completed state
    assert spec["driver"]["serviceAccount"] == "ckpt-spark-driver"
    conf = spec["sparkConf"]
    assert conf["spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY"] == \
        "ckpt-store-credentials:AWS_SECRET_ACCESS_KEY"  # a reference; the operator's spark-submit resolves it
    assert conf["spark.kubernetes.driverEnv.CKPT_DRIVER_RUN"]  # the driver records how it ended, under its run
    assert not any(k.startswith("spark.ckpt.") or "upload.path" in k or "waitAppCompletion" in k for k in conf)
    text = files["orders-sparkapplication.yaml"]
    assert SECRET not in text and "AKIAIOSFODNN7EXAMPLE" not in text
    # the connection the recipe gives Airflow makes the supervisor hold a SparkApplication per driver run
    (connections,) = [d["data"] for d in documents(files["ckpt-service.yaml"]) if d["kind"] == "ConfigMap"]
    argv = accepted_by_ckpt_run(json.loads(connections["AIRFLOW_CONN_CKPT_SPARK_DEFAULT"]))
    assert argv[1:4] == ["-m", "airflow_ckpt_provider.launcher.sparkapp", "--manifest"]
    submitted = json.loads(argv[4])
    jsonschema.validate(submitted, schema)
    assert submitted["metadata"]["name"] == "ckpt-orders-20261129t110000z-abc123-1"  # one resource per driver run
    assert submitted["spec"]["restartPolicy"] == {"type": "Never"}
    # the service's role may manage SparkApplications in this form
    roles = [d for d in documents(files["ckpt-service.yaml"]) if d["kind"] == "Role"]
    assert {"apiGroups": ["sparkoperator.k8s.io"], "resources": ["sparkapplications"],
            "verbs": ["create", "get", "list", "watch", "delete"]} in roles[0]["rules"]

    # the strict schema catches what a misspelling would leave unnoticed (the API server prunes unknown fields)
    wrong = copy.deepcopy(app)
    wrong["spec"]["restartpolicy"] = wrong["spec"].pop("restartPolicy")
    with pytest.raises(jsonschema.ValidationError, match="restartpolicy"):
        jsonschema.validate(wrong, schema)
    wrong = copy.deepcopy(app)
    wrong["spec"]["restartPolicy"]["type"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.validate(wrong, schema)


def test_yarn_runs_an_instance_per_edge_host_that_a_unit_restart_does_not_take_the_jobs_down_with(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = recipe(capsys, tmp_path, "yarn", "--store", STORE)
    assert list(files) == ["airflow-connections.env", "ckpt-service.service", "store.env"]
    unit = files["ckpt-service.service"]
    assert "ExecStart=ckpt service run --store s3://acme-streaming/jobs --instance %H\n" in unit
    assert "KillMode=process\n" in unit and "Restart=always\n" in unit
    assert "EnvironmentFile=/etc/ckpt/store.env\n" in unit
    assert all(SECRET not in text for text in files.values())
    line = next(ln for ln in files["airflow-connections.env"].splitlines()
                if ln.startswith("AIRFLOW_CONN_CKPT_SPARK_DEFAULT="))
    spark = json.loads(line.split("=", 1)[1].strip("'"))
    argv = accepted_by_ckpt_run(spark)  # supervised: one AM attempt, spark-submit waits, the driver's word decides
    assert "spark.yarn.maxAppAttempts=1" in argv
    assert "spark.yarn.appMasterEnv.CKPT_DRIVER_RUN=20261129T110000Z-abc123-1" in argv


def test_single_host_keeps_the_supervisors_through_a_worker_restart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = recipe(capsys, tmp_path, "single-host", "--store", str(tmp_path / "jobs"))
    assert files["airflow-worker-ckpt.conf"].endswith("[Service]\nKillMode=process\n")
    line = next(ln for ln in files["airflow-connections.env"].splitlines()
                if ln.startswith("AIRFLOW_CONN_CKPT_STORE_DEFAULT="))
    assert json.loads(line.split("=", 1)[1].strip("'"))["extra"]["store_url"] == str(tmp_path / "jobs")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["kubernetes", "--store", "/srv/jobs", "--image", IMAGE],
         "error: --store /srv/jobs: the kubernetes recipe runs the service, its drivers and the Airflow workers on "
         "different hosts, which all read the job store; expected s3://BUCKET/PREFIX"),
        (["kubernetes", "--store", STORE], "error: no image given: "),
        (["kubernetes", "--store", STORE, "--image", IMAGE, "--replicas", "1"],
         "error: --replicas 1: one instance has nobody to take its jobs over when its pod or node is lost; expected "
         "2 or more"),
        (["kubernetes", "--store", STORE, "--image", IMAGE, "--namespace", "Streaming_Jobs"],
         "error: --namespace 'Streaming_Jobs': expected a Kubernetes namespace name"),
        (["kubernetes", "--store", STORE, "--image", IMAGE, "--drivers", "sparkapplication", "--job", "orders"],
         "error: --drivers sparkapplication with a job renders the SparkApplication the service submits for it: pass "
         "--job-file, --checkpoint too"),
        (["kubernetes", "--store", STORE, "--image", IMAGE, "--drivers", "sparkapplication", "--job", "orders",
          "--job-file", "/home/me/orders.py", "--checkpoint", "s3a://acme-streaming/ckpt/orders"],
         "error: --job-file /home/me/orders.py: the Spark operator submits from its own pod and reads no file of "
         "this host"),
        (["yarn", "--store", STORE, "--replicas", "1"], "error: --replicas 1: one edge host has nobody"),
        (["yarn"], "error: no job store given: pass --store s3://BUCKET/PREFIX"),
    ],
    ids=["local-store", "no-image", "one-replica", "bad-namespace", "sparkapplication-without-job",
         "sparkapplication-host-file", "yarn-one-host", "no-store"],
)
def test_bad_settings_are_refused_and_nothing_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
    message: str
) -> None:
    monkeypatch.delenv("CKPT_STORE", raising=False)
    out = tmp_path / "recipe"
    assert cli.main(["recipe", *args, "--out", str(out)]) == 1
    assert capsys.readouterr().err.startswith(message)
    assert not out.exists()
