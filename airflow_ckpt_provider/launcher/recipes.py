"""Production recipes, rendered by ``ckpt recipe``: the supervision service on Kubernetes (a Deployment of two or more
instances with its RBAC, and drivers as driver pods or as a Kubeflow ``SparkApplication`` with its restarts off), on
YARN edge hosts, and the single-host form. Built from the names the launcher itself uses, checked by its own checks.

Design notes: docs/deployment.md#design-notes-launcherrecipespy."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import yaml

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreSpec
from airflow_ckpt_provider.core.records.ownership import Timings
from airflow_ckpt_provider.launcher.sparkapp import ENTRYPOINT_CONF, IMAGE_ENTRYPOINT, manifest
from airflow_ckpt_provider.launcher.sparktarget import SparkTarget
from airflow_ckpt_provider.launcher.submit import (
    K8S_UPLOAD_PATH,
    SPARKAPPLICATION,
    SUBMITTER_CONF,
    WAIT_CONF,
    YARN_MAX_ATTEMPTS,
    SubmitSpec,
)
from airflow_ckpt_provider.runtime.config import RuntimeConfig

#: The forms ``ckpt recipe`` renders.
FORMS = ("kubernetes", "yarn", "single-host")
#: How the drivers of a Kubernetes deployment run: pods that spark-submit creates (the service submits and restarts
#: them), or SparkApplication resources of the Kubeflow Spark operator (``restartPolicy: Never``).
DRIVER_FORMS = ("driver-pods", "sparkapplication")
#: The Kubernetes API server as seen from a pod of the cluster.
IN_CLUSTER_MASTER = "k8s://https://kubernetes.default.svc:443"
SERVICE_NAME = "ckpt-service"
DRIVER_ACCOUNT = "ckpt-spark-driver"
#: The keys of the credentials secret: the names boto3 and Hadoop's s3a read from the environment.
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
#: The verbs spark-submit (in the service's pods) and a driver (for its executors) need on what they create:
#: pods, their config maps and services, and volume claims (Spark's running-on-kubernetes.md, RBAC).
_SPARK_RULES = [{"apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
                 "verbs": ["create", "get", "list", "watch", "patch", "delete", "deletecollection"]}]
_OPERATOR_RULES = [{"apiGroups": ["sparkoperator.k8s.io"], "resources": ["sparkapplications"],
                    "verbs": ["create", "get", "list", "watch", "delete"]}]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class RecipeSettings:
    """What a recipe needs: the job store (``store``, an ``s3://`` URL every host reads), the Kubernetes namespace,
    the image (Spark, Python and this provider), the instances (``replicas``), the secret holding the store's
    credentials (``credentials_secret``; "" for a workload identity), and for a SparkApplication the job
    (``job``, ``job_file`` as a URI the cluster reads, ``checkpoint``)."""

    store: str
    namespace: str = "streaming"
    image: str = ""
    replicas: int = 2
    credentials_secret: str = "ckpt-store-credentials"  # noqa: S105 -- the name of a Kubernetes secret, not a secret
    endpoint_url: str | None = None
    region: str | None = None
    upload_path: str | None = None
    driver_form: str = "driver-pods"
    job: str | None = None
    job_file: str | None = None
    checkpoint: str | None = None
    entrypoint: str = IMAGE_ENTRYPOINT

    @property
    def bucket(self) -> str:
        return urlparse(self.store).netloc

    def spark_uploads(self) -> str:
        """Where spark-submit uploads a driver pod's local files: the setting, else
        ``s3a://<store bucket>/spark-uploads``."""
        return self.upload_path or f"s3a://{self.bucket}/spark-uploads"


def render(form: str, settings: RecipeSettings) -> dict[str, str]:
    """The files of recipe ``form`` (``FORMS``): name -> text. ConfigError on bad settings, naming what to pass."""
    _check_store(settings.store, form)
    if form == "kubernetes":
        return kubernetes(settings)
    if form == "yarn":
        return yarn(settings)
    if form == "single-host":
        return single_host(settings)
    raise ConfigError(f"unknown recipe {form!r}: expected one of {', '.join(FORMS)}")


def _check_store(store: str, form: str) -> None:
    if not store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX (or set CKPT_STORE)")
    if form != "single-host" and urlparse(store).scheme not in ("s3", "s3a"):
        raise ConfigError(f"--store {store}: the {form} recipe runs the service, its drivers and the Airflow workers "
                          "on different hosts, which all read the job store; expected s3://BUCKET/PREFIX (a path "
                          "only one host can see cannot be shared); for one host use `ckpt recipe single-host`")


# -- Kubernetes ---------------------------------------------------------------------------------------------------


def kubernetes(s: RecipeSettings) -> dict[str, str]:
    """``ckpt-service.yaml`` (RBAC, the Deployment, its disruption budget, the Airflow connection), and with the
    SparkApplication form ``<job>-sparkapplication.yaml``."""
    _check_kubernetes(s)
    labels = _labels(SERVICE_NAME)
    rules = _SPARK_RULES + (_OPERATOR_RULES if s.driver_form == "sparkapplication" else [])
    docs: list[dict[str, Any]] = [
        *_account(s, SERVICE_NAME, rules, labels),
        *_account(s, DRIVER_ACCOUNT, _SPARK_RULES, _labels(DRIVER_ACCOUNT)),
        _deployment(s, labels),
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": _meta(s, SERVICE_NAME, labels),
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": SERVICE_NAME}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(s, "ckpt-airflow-connections", labels),
         "data": {"AIRFLOW_CONN_CKPT_SPARK_DEFAULT": json.dumps(spark_connection(s), sort_keys=True),
                  "AIRFLOW_CONN_CKPT_STORE_DEFAULT": json.dumps(store_connection(s), sort_keys=True)}},
    ]
    files = {"ckpt-service.yaml": _yaml_documents(
        "The supervision service on Kubernetes (docs/deployment.md#kubernetes), rendered by `ckpt recipe kubernetes`."
        f"\nDrivers: {s.driver_form}. Apply: kubectl apply -n {s.namespace} -f ckpt-service.yaml", docs)}
    if s.driver_form == "sparkapplication" and s.job:
        files[f"{s.job}-sparkapplication.yaml"] = _yaml_documents(
            f"For review: the SparkApplication the service submits for a driver run of job {s.job} (one per run, named "
            "after it), restartPolicy Never: the service owns its restarts (docs/deployment.md#kubernetes)",
            [spark_application(s)])
    return files


def _check_kubernetes(s: RecipeSettings) -> None:
    if not s.image:
        raise ConfigError("no image given: the service's pods and the drivers run an image with Spark, Python and "
                          "this provider; pass --image REGISTRY/NAME:TAG (docs/deployment.md#the-image)")
    if s.replicas < 2:
        raise ConfigError(f"--replicas {s.replicas}: one instance has nobody to take its jobs over when its pod or "
                          "node is lost; expected 2 or more (the default), or `ckpt recipe single-host` for one host")
    if not _DNS_LABEL.match(s.namespace):
        raise ConfigError(f"--namespace {s.namespace!r}: expected a Kubernetes namespace name (lower-case letters, "
                          "digits and '-', at most 63)")
    if s.driver_form not in DRIVER_FORMS:
        raise ConfigError(f"--drivers {s.driver_form!r}: expected one of {', '.join(DRIVER_FORMS)}")
    if s.driver_form == "sparkapplication" and (s.job or s.job_file or s.checkpoint):
        missing = [flag for flag, value in (("--job", s.job), ("--job-file", s.job_file),
                                            ("--checkpoint", s.checkpoint)) if not value]
        if missing:
            raise ConfigError("--drivers sparkapplication with a job renders the SparkApplication the service submits "
                              f"for it: pass {', '.join(missing)} too (the job file as a URI the cluster reads: "
                              "local:///path/in/the/image or s3a://...)")
        if "://" not in str(s.job_file):
            raise ConfigError(f"--job-file {s.job_file}: the Spark operator submits from its own pod and reads no "
                              "file of this host; expected local:///path/in/the/image or s3a://BUCKET/KEY")


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "airflow-ckpt-provider"}


def _meta(s: RecipeSettings, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": s.namespace, "labels": dict(labels)}


def _account(s: RecipeSettings, name: str, rules: list[dict[str, Any]],
             labels: dict[str, str]) -> list[dict[str, Any]]:
    """A service account, its role in the namespace and the binding of the two."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(s, name, labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(s, name, labels),
         "rules": [dict(rule) for rule in rules]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(s, name, labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": s.namespace}]},
    ]


def _store_env(s: RecipeSettings) -> list[dict[str, Any]]:
    """The store's endpoint, region and credentials as environment variables (the credentials by reference)."""
    env: list[dict[str, Any]] = []
    if s.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": s.endpoint_url})
    if s.region:
        env.append({"name": "AWS_REGION", "value": s.region})
    if s.credentials_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": s.credentials_secret, "key": key}}}
                for key in CREDENTIAL_KEYS]
    return env


def _deployment(s: RecipeSettings, labels: dict[str, str]) -> dict[str, Any]:
    """The instances: one per pod, named by the pod, spread over nodes; a rolling update replaces one at a time, so
    the others keep their jobs and take over the replaced one's (docs/service.md, takeover within 15 s)."""
    timings = Timings()
    command = ["ckpt", "service", "run", "--store", s.store, "--instance", "$(POD_NAME)"]
    select = {"app.kubernetes.io/name": SERVICE_NAME}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(s, SERVICE_NAME, labels),
        "spec": {
            "replicas": s.replicas,
            "selector": {"matchLabels": select},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": SERVICE_NAME,
                    # an instance stops taking steps renew_deadline after its last renewal: SIGTERM ends it sooner
                    "terminationGracePeriodSeconds": int(timings.lease_duration) + 15,
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": select},
                                                           "topologyKey": "kubernetes.io/hostname"}}]}},
                    "containers": [{
                        "name": "service", "image": s.image, "command": command,
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "CKPT_HOME", "value": "/var/lib/ckpt"}, *_store_env(s)],
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                        "volumeMounts": [{"name": "ckpt-home", "mountPath": "/var/lib/ckpt"}],
                    }],
                    "volumes": [{"name": "ckpt-home", "emptyDir": {}}],
                },
            },
        },
    }


def spark_connection(s: RecipeSettings) -> dict[str, Any]:
    """The ``ckpt_spark`` Airflow connection: cluster mode against the API server, the drivers' service account, the
    image's Python (``python_env: none``), the credentials by secret reference; driver pods from spark-submit (its
    local files uploaded to ``upload_path``), or SparkApplications (``spark.ckpt.submitter``, the entrypoint in the
    image)."""
    conf = {
        "spark.kubernetes.namespace": s.namespace,
        "spark.kubernetes.container.image": s.image,
        "spark.kubernetes.authenticate.driver.serviceAccountName": DRIVER_ACCOUNT,
    }
    if s.driver_form == "sparkapplication":
        conf.update({SUBMITTER_CONF: SPARKAPPLICATION, ENTRYPOINT_CONF: s.entrypoint})
    else:
        conf[K8S_UPLOAD_PATH] = s.spark_uploads()
    if s.credentials_secret:
        for side in ("driver", "executor"):
            conf.update({f"spark.kubernetes.{side}.secretKeyRef.{key}": f"{s.credentials_secret}:{key}"
                         for key in CREDENTIAL_KEYS})
    return {"conn_type": "ckpt_spark", "host": IN_CLUSTER_MASTER,
            "extra": {"deploy_mode": "cluster", "python_env": "none", "conf": conf}}


def store_connection(s: RecipeSettings) -> dict[str, Any]:
    """The ``ckpt_store`` Airflow connection: the store and its endpoint (credentials from the environment)."""
    connection: dict[str, Any] = {"conn_type": "ckpt_store", "extra": {"store_url": s.store}}
    if s.endpoint_url:
        connection["host"] = s.endpoint_url
    if s.region:
        connection["extra"]["region_name"] = s.region
    return connection


def spark_application(s: RecipeSettings) -> dict[str, Any]:
    """What the service submits for one driver run of the job with the SparkApplication form
    (launcher/sparkapp.manifest from the recipe's own Spark connection), for review: every check of ``ckpt run``
    applies, ``restartPolicy: Never``."""
    assert s.job  # _check_kubernetes: job, job_file and checkpoint are given
    assert s.job_file
    assert s.checkpoint
    target = SparkTarget.from_fields(**_fields(spark_connection(s)), where="the recipe's Spark connection")
    config = RuntimeConfig(job=s.job, store=s.store, checkpoint=s.checkpoint, endpoint_url=s.endpoint_url,
                           region=s.region, restore=RestoreSpec.parse(LATEST_STATE))
    spec = SubmitSpec(job_file=s.job_file, config=config, master=target.master, deploy_mode="cluster",
                      conf=target.conf, spark_submit="spark-submit", supervised=True,
                      driver_run="20261129T000000Z-000000-1")
    return manifest(spec)


def _fields(connection: dict[str, Any]) -> dict[str, Any]:
    extra = connection["extra"]
    return {"host": connection["host"], "deploy_mode": extra["deploy_mode"], "conf": extra["conf"],
            "python_env": extra["python_env"]}


class _Dumper(yaml.SafeDumper):
    """YAML as a person writes a manifest: no anchors and aliases for a mapping used twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml_documents(comment: str, docs: list[dict[str, Any]]) -> str:
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + "---\n".join(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120) for doc in docs)


# -- YARN and one host -------------------------------------------------------------------------------------------


def _unit(description: str, exec_start: list[str], *, env_file: str, user: str = "ckpt") -> str:
    """A systemd unit. KillMode=process: a restart of the unit ends the instance, not the job supervisors it
    started (detached), which the next owner adopts instead of restarting their drivers."""
    return (f"[Unit]\nDescription={description}\nAfter=network-online.target\nWants=network-online.target\n\n"
            f"[Service]\nUser={user}\nEnvironmentFile={env_file}\nExecStart={shlex.join(exec_start)}\n"
            "Restart=always\nRestartSec=5\nKillMode=process\nTimeoutStopSec=30\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def _env_file(s: RecipeSettings, note: str) -> str:
    lines = [f"# {note}", f"CKPT_STORE={s.store}", "HADOOP_CONF_DIR=/etc/hadoop/conf"]
    if s.endpoint_url:
        lines.append(f"AWS_ENDPOINT_URL={s.endpoint_url}")
    if s.region:
        lines.append(f"AWS_REGION={s.region}")
    lines += [f"# {key}=... (or an instance role: no key on disk)" for key in CREDENTIAL_KEYS]
    return "\n".join(lines) + "\n"


def yarn(s: RecipeSettings) -> dict[str, str]:
    """Two or more edge hosts, each running one instance under systemd; drivers in YARN cluster mode, one AM attempt
    (the service's supervisor restarts, never YARN as well)."""
    if s.replicas < 2:
        raise ConfigError(f"--replicas {s.replicas}: one edge host has nobody to take its jobs over when it is lost; "
                          "expected 2 or more hosts (the default), or `ckpt recipe single-host`")
    connection = {"conn_type": "ckpt_spark", "host": "yarn",
                  "extra": {"deploy_mode": "cluster", "python_env": "hdfs:///apps/ckpt/ckpt-env.tar.gz",
                            "conf": {YARN_MAX_ATTEMPTS: "1", WAIT_CONF["yarn"]: "true"}}}
    return {
        "ckpt-service.service": _unit("ckpt supervision service instance (docs/deployment.md#yarn)",
                                      ["ckpt", "service", "run", "--store", s.store, "--instance", "%H"],
                                      env_file="/etc/ckpt/store.env"),
        "store.env": _env_file(s, f"/etc/ckpt/store.env on each of the {s.replicas} edge hosts (mode 0600)"),
        "airflow-connections.env": (
            "# the Airflow workers' environment: launches hand jobs to the service (supervision='service')\n"
            f"AIRFLOW_CONN_CKPT_SPARK_DEFAULT='{json.dumps(connection, sort_keys=True)}'\n"
            f"AIRFLOW_CONN_CKPT_STORE_DEFAULT='{json.dumps(store_connection(s), sort_keys=True)}'\n"),
    }


def single_host(s: RecipeSettings) -> dict[str, str]:
    """One host: no service; each job's supervisor runs on the host that launched it (the embedded default). What
    must not happen there: the Airflow worker's restart killing the supervisors it started."""
    connection = {"conn_type": "ckpt_spark", "host": "local[4]", "extra": {"deploy_mode": "client"}}
    dropin = ("# /etc/systemd/system/airflow-worker.service.d/ckpt.conf (name your worker's unit): a worker restart\n"
              "# must not end the job supervisors its tasks started (supervision='launcher', docs/deployment.md)\n"
              "[Service]\nKillMode=process\n")
    return {
        "airflow-worker-ckpt.conf": dropin,
        "airflow-connections.env": (
            "# the Airflow worker's environment\n"
            f"AIRFLOW_CONN_CKPT_SPARK_DEFAULT='{json.dumps(connection, sort_keys=True)}'\n"
            f"AIRFLOW_CONN_CKPT_STORE_DEFAULT='{json.dumps(store_connection(s), sort_keys=True)}'\n"),
    }
