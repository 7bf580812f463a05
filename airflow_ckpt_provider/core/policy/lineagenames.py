"""OpenLineage names, defined once for the operators (operators/lineage.py) and the driver (runtime/lineage.py).

Pure: no OpenLineage import. Datasets follow the OpenLineage naming spec; the streaming job's own run is named
here too, so that the launching task and every driver of one launch agree on it.
"""

from __future__ import annotations

import posixpath
import uuid
from typing import NamedTuple
from urllib.parse import urlsplit

#: The key of the custom run facet (OpenLineage: custom facets carry a prefix of their producer).
RUN_FACET = "ckpt_streamingJob"
#: The job namespace, as Airflow's OpenLineage provider and OpenLineage's other integrations read it.
NAMESPACE_ENV = "OPENLINEAGE_NAMESPACE"
#: The parent run ``NAMESPACE/JOB/RUN_ID`` (and the root run): the convention of OpenLineage's dbt integration,
#: filled from the provider's ``lineage_parent_id``/``lineage_root_parent_id`` macros.
PARENT_ENV = "OPENLINEAGE_PARENT_ID"
ROOT_PARENT_ENV = "OPENLINEAGE_ROOT_PARENT_ID"
#: Fixed: run ids derived from launch ids are the same wherever they are computed.
RUN_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:airflow-ckpt-provider:launch-run")


class DatasetName(NamedTuple):
    """A dataset as OpenLineage names it: ``namespace`` (where) and ``name`` (what, within it)."""

    namespace: str
    name: str


class RunRef(NamedTuple):
    """Another run (a parent or root run): its job's namespace and name, and its run id."""

    namespace: str
    name: str
    run_id: str


def job_name(job: str) -> str:
    """The OpenLineage job name of a streaming job's driver runs: ``ckpt.<job>``, not the bare job name, which
    may well be the id of the DAG that launches it (the provider names a DAG's runs by its id)."""
    return f"ckpt.{job}"


def launch_run_id(launch_id: str) -> str:
    """The OpenLineage run id of one launch: a UUID derived from the launch id, so every driver of the launch
    (its supervisor's restarts, each with a new epoch) reports the same run."""
    return str(uuid.uuid5(RUN_ID_NAMESPACE, launch_id))


def parse_run_ref(value: str | None) -> RunRef | None:
    """``NAMESPACE/JOB/RUN_ID`` (the provider's ``lineage_parent_id``) as a RunRef; None if absent or malformed
    (a namespace may hold ``/``, e.g. ``kafka://host``: the job and run id are the last two parts)."""
    if not value:
        return None
    namespace, _, rest = value.rpartition("/")
    namespace, _, name = namespace.rpartition("/")
    if not namespace or not name:
        return None
    try:
        run_id = str(uuid.UUID(rest))
    except ValueError:
        return None
    return RunRef(namespace, name, run_id)


def kafka_dataset(bootstrap_servers: str, topic: str) -> DatasetName:
    """OpenLineage's Kafka naming: namespace ``kafka://HOST:PORT`` of the first bootstrap server, name the topic."""
    first = bootstrap_servers.split(",", maxsplit=1)[0].strip()
    first = first.split("://", 1)[-1]  # "PLAINTEXT://host:9092" lists name a protocol
    return DatasetName(f"kafka://{first}", topic)


def uri_dataset(uri: str) -> DatasetName | None:
    """A URI as OpenLineage names it: ``s3://BUCKET/KEY`` (and ``s3a://``) -> ``s3://BUCKET`` + ``KEY``;
    ``kafka://HOST:PORT/TOPIC`` -> ``kafka://HOST:PORT`` + ``TOPIC``; a local path or ``file:///PATH`` ->
    ``file`` + ``/PATH``; ``file://HOST/PATH`` -> ``file://HOST`` + ``/PATH``. None for other schemes."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("s3", "s3a", "s3n") and parts.netloc and parts.path.strip("/"):
        return DatasetName(f"s3://{parts.netloc}", parts.path.strip("/"))
    if scheme == "kafka" and parts.netloc and parts.path.strip("/"):
        return kafka_dataset(parts.netloc, parts.path.strip("/"))
    if scheme == "" and uri.startswith("/"):
        return DatasetName("file", posixpath.normpath(uri))
    if scheme == "file" and parts.path:
        return DatasetName(f"file://{parts.netloc}" if parts.netloc else "file", posixpath.normpath(parts.path))
    return None
