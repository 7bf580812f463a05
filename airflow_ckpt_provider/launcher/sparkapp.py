"""Drivers as SparkApplication resources of the Kubeflow Spark operator, submitted and restarted by a supervisor (the
supervision service's), never by the operator (``restartPolicy: Never``): one owner of every restart.

With ``--conf spark.ckpt.submitter=sparkapplication`` the supervisor's driver process is ``python -m
airflow_ckpt_provider.launcher.sparkapp``: it creates the resource with kubectl, waits until the operator reports it
ended, deletes it, and exits; SIGTERM deletes it at once (the driver pod goes with it). How the driver ended comes
from its end record, as for any cluster-mode driver (core/records/supervision.py DriverEnd).
Design notes: docs/deployment.md#design-notes-launchersparkapppy."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.launcher.submit import (
    ENTRYPOINT_PY,
    K8S_UPLOAD_PATH,
    SPARKAPPLICATION,
    SUBMITTER_CONF,
    WAIT_CONF,
    SubmitSpec,
    build_command,
    submitter,
)

log = logging.getLogger(__name__)

#: Where the image keeps the runtime's entrypoint (the Dockerfile of docs/deployment.md puts it there).
ENTRYPOINT_CONF = "spark.ckpt.entrypoint"
IMAGE_ENTRYPOINT = "local:///opt/ckpt/entrypoint.py"
#: The operator's application states after which nothing more happens to the resource (kubeflow/spark-operator
#: api/v1beta2 ApplicationStateType).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "SUBMISSION_FAILED"})
#: Settings the SparkApplication carries as fields of its own, or that only the spark-submit form uses.
_AS_FIELDS = {"spark.kubernetes.container.image": "image", "spark.kubernetes.namespace": "namespace",
              "spark.kubernetes.authenticate.driver.serviceAccountName": "serviceAccount"}
_DROPPED = {WAIT_CONF["k8s"], K8S_UPLOAD_PATH, SUBMITTER_CONF, ENTRYPOINT_CONF}
_NAME = re.compile(r"[^a-z0-9-]+")


def uses_sparkapplication(spec: SubmitSpec) -> bool:
    return submitter(spec) == SPARKAPPLICATION


def resource_name(spec: SubmitSpec) -> str:
    """``ckpt-<job>-<driver run>``, a DNS label (lower case, at most 63 characters; a digest keeps a long one
    unique)."""
    name = _NAME.sub("-", f"ckpt-{spec.config.job}-{spec.driver_run or 'run'}".lower()).strip("-")
    if len(name) <= 63:
        return name
    return f"{name[:50].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def manifest(spec: SubmitSpec, *, name: str | None = None) -> dict[str, Any]:
    """The ``sparkoperator.k8s.io/v1beta2`` SparkApplication of ``spec``: the sparkConf and arguments of the command
    ``ckpt run`` would submit (``build_command``, every check included), the runtime's entrypoint from the image,
    ``restartPolicy: Never``."""
    argv, _ = build_command(spec)
    entry = argv.index(str(ENTRYPOINT_PY))
    conf = dict(v.split("=", 1) for k, v in itertools.pairwise(argv[:entry]) if k == "--conf")
    fields = {field: conf.pop(key) for key, field in _AS_FIELDS.items() if key in conf}
    entrypoint = conf.get(ENTRYPOINT_CONF, IMAGE_ENTRYPOINT)
    for key in _DROPPED:
        conf.pop(key, None)
    deps = {opt: argv[argv.index(flag) + 1].split(",") for flag, opt in
            (("--files", "files"), ("--py-files", "pyFiles"), ("--archives", "archives")) if flag in argv[:entry]}
    driver: dict[str, Any] = {"cores": 1, "memory": conf.get("spark.driver.memory", "1g")}
    if "serviceAccount" in fields:
        driver["serviceAccount"] = fields["serviceAccount"]
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": name or resource_name(spec), "namespace": fields.get("namespace", "default"),
                     "labels": {"app.kubernetes.io/part-of": "airflow-ckpt-provider", "ckpt.job": spec.config.job}},
        "spec": {
            "type": "Python", "pythonVersion": "3", "mode": "cluster", "image": fields.get("image", ""),
            "sparkVersion": _spark_version(), "mainApplicationFile": entrypoint,
            "arguments": argv[entry + 1:], "sparkConf": conf, "deps": deps,
            # one owner of restarts: the supervisor that submitted it, never the operator as well
            "restartPolicy": {"type": "Never"},
            "driver": driver,
            "executor": {"instances": _instances(conf), "cores": 1, "memory": conf.get("spark.executor.memory", "1g")},
        },
    }


def _instances(conf: dict[str, str]) -> int:
    value = conf.get("spark.executor.instances", "2").strip()
    if not value.isdigit():
        raise ConfigError(f"--conf spark.executor.instances={value}: expected a whole number of executors")
    return int(value)


def _spark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return "4.3.0"


def driver_command(spec: SubmitSpec) -> tuple[list[str], dict[str, str]]:
    """The command a supervisor runs for one driver: spark-submit's (launcher/submit.build_command), or with the
    SparkApplication submitter this module's, holding the resource it creates."""
    if not uses_sparkapplication(spec):
        return build_command(spec)
    resource = manifest(spec)
    return [sys.executable, "-m", "airflow_ckpt_provider.launcher.sparkapp", "--manifest", json.dumps(resource)], {}


def release(spec: SubmitSpec) -> None:
    """Delete the SparkApplication of driver run ``spec.driver_run`` (its holder was lost with its supervisor, and an
    adopting supervisor saw the driver end): nothing is left behind per run. A no-op for the spark-submit form."""
    if not spec.driver_run or not uses_sparkapplication(spec):
        return
    Kubectl(resource_name(spec), spec.conf.get("spark.kubernetes.namespace", "default")).delete()


# -- the submitter process ----------------------------------------------------------------------------------------


class Kubectl:
    """kubectl for one SparkApplication: create it, read its state, delete it."""

    def __init__(self, name: str, namespace: str, binary: str = "kubectl",
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> None:
        self.name, self.namespace, self.binary, self._run = name, namespace, binary, run

    def _call(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self._run([self.binary, "-n", self.namespace, *args], input=stdin, capture_output=True, text=True,
                         timeout=60, check=False)

    def create(self, resource: dict[str, Any]) -> None:
        done = self._call("create", "-f", "-", stdin=json.dumps(resource))
        if done.returncode != 0:
            raise RuntimeError(f"kubectl create of SparkApplication {self.name} failed: {done.stderr.strip()}")

    def state(self) -> str | None:
        """The operator's state of the application ('' before it reports one); None if the resource is gone."""
        done = self._call("get", "sparkapplication", self.name, "-o", "jsonpath={.status.applicationState.state}")
        if done.returncode != 0:
            if "NotFound" in done.stderr or "not found" in done.stderr:
                return None
            raise RuntimeError(f"kubectl get of SparkApplication {self.name} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def delete(self) -> None:
        done = self._call("delete", "sparkapplication", self.name, "--ignore-not-found", "--wait=false")
        if done.returncode != 0:
            log.warning("kubectl delete of SparkApplication %s failed: %s", self.name, done.stderr.strip())


def hold(kubectl: Kubectl, resource: dict[str, Any], *, poll: float = 5.0,
         sleep: Callable[[float], object] = time.sleep, stopping: Callable[[], bool] = lambda: False) -> int:
    """Create the application, wait until the operator reports a final state (or ``stopping()``), delete it.
    0 once it ended (its end record says how), 1 when it could not be created or vanished, 143 when stopped."""
    try:
        kubectl.create(resource)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        log.error("%s", err)
        return 1
    log.info("SparkApplication %s created in namespace %s", kubectl.name, kubectl.namespace)
    failing = False
    try:
        while not stopping():
            try:
                state = kubectl.state()
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                if not failing:
                    log.warning("%s; asking again every %g s", err, poll)
                failing = True
                sleep(poll)
                continue
            failing = False
            if state is None:
                log.error("SparkApplication %s is gone (deleted by someone else)", kubectl.name)
                return 1
            if state in FINAL_STATES:
                log.info("SparkApplication %s ended: %s", kubectl.name, state)
                return 0
            sleep(poll)
        log.info("SparkApplication %s: stop requested", kubectl.name)
        return 143
    finally:
        kubectl.delete()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="python -m airflow_ckpt_provider.launcher.sparkapp",
                                     description="hold one SparkApplication for a supervisor (see the module)")
    parser.add_argument("--manifest", required=True, help="the SparkApplication as JSON")
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args(argv)
    resource = json.loads(args.manifest)
    kubectl = Kubectl(resource["metadata"]["name"], resource["metadata"]["namespace"], args.kubectl)
    stop = threading.Event()  # SIGTERM (the supervisor's stop) cuts the wait short
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    return hold(kubectl, resource, poll=args.poll, sleep=stop.wait, stopping=stop.is_set)


if __name__ == "__main__":
    sys.exit(main())
