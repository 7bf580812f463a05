"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-ckpt-provider",
        "name": "Checkpoints for Spark Structured Streaming",
        "description": "Flink-style snapshots, savepoints, restarts and upgrades for PySpark "
        "Structured Streaming jobs.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Spark Structured Streaming checkpoints",
                "external-doc-url": "https://spark.apache.org/docs/latest/streaming/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Spark Structured Streaming checkpoints",
                "python-modules": [
                    "airflow_ckpt_provider.hooks.job_store",
                    "airflow_ckpt_provider.hooks.spark",
                    "airflow_ckpt_provider.hooks.kafka",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Spark Structured Streaming checkpoints",
                "python-modules": [
                    "airflow_ckpt_provider.operators.job",
                    "airflow_ckpt_provider.operators.control",
                    "airflow_ckpt_provider.operators.snapshot",
                    "airflow_ckpt_provider.operators.upgrade",
                ],
            }
        ],
        "notifications": ["airflow_ckpt_provider.notifications.job.StreamingJobNotifier"],
        "extra-links": ["airflow_ckpt_provider.links.SparkUILink", "airflow_ckpt_provider.links.SnapshotLink"],
        "sensors": [
            {
                "integration-name": "Spark Structured Streaming checkpoints",
                "python-modules": [
                    "airflow_ckpt_provider.sensors.job_health",
                    "airflow_ckpt_provider.sensors.snapshot",
                    "airflow_ckpt_provider.sensors.kafka_lag",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "Spark Structured Streaming checkpoints",
                "python-modules": [
                    "airflow_ckpt_provider.triggers.job_health",
                    "airflow_ckpt_provider.triggers.control",
                    "airflow_ckpt_provider.triggers.snapshot",
                    "airflow_ckpt_provider.triggers.kafka_lag",
                    "airflow_ckpt_provider.triggers.events",
                    "airflow_ckpt_provider.triggers.restore_check",
                ],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_ckpt_provider.hooks.job_store.JobStoreHook",
                "hook-name": "Checkpoint job store (S3 or local)",
                "connection-type": "ckpt_store",
                "conn-fields": {
                    "store_url": {
                        "label": "Store URL",
                        "description": "Root of the job stores: s3://BUCKET/PREFIX or a local directory.",
                        "schema": {"type": ["string", "null"], "pattern": "^(s3a?://[^/]+.*|file://.+|/.+)$"},
                    },
                    "region_name": {"label": "S3 region", "schema": {"type": ["string", "null"]}},
                    "aws_conn_id": {
                        "label": "AWS connection id",
                        "description": "Reuse the credentials, endpoint and region of this AWS connection.",
                        "schema": {"type": ["string", "null"]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port"],
                    "relabeling": {
                        "host": "S3 endpoint URL",
                        "login": "Access key id",
                        "password": "Secret access key",
                    },
                    "placeholders": {
                        "host": "empty for AWS, e.g. http://127.0.0.1:8333 for SeaweedFS or MinIO",
                        "store_url": "s3://my-bucket/streaming-jobs",
                    },
                },
            },
            {
                "hook-class-name": "airflow_ckpt_provider.hooks.spark.CkptSparkHook",
                "hook-name": "Spark for checkpointed streaming jobs",
                "connection-type": "ckpt_spark",
                "conn-fields": {
                    "deploy_mode": {
                        "label": "Deploy mode",
                        "description": "client (the driver runs on the Airflow worker) or cluster (YARN, Kubernetes).",
                        "schema": {"type": ["string", "null"], "enum": ["client", "cluster", None]},
                    },
                    "spark_submit": {
                        "label": "spark-submit",
                        "description": "Path of spark-submit; default: next to this Python, $SPARK_HOME/bin, PATH.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "conf": {
                        "label": "Spark settings (JSON)",
                        "description": "Default Spark settings of the jobs as a JSON object, e.g. "
                        "{\"spark.sql.shuffle.partitions\": \"4\"}.",
                        "schema": {"type": ["string", "null"]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "password", "extra"],
                    "relabeling": {"host": "Master URL"},
                    "placeholders": {"host": "local[2], yarn, spark://host:7077 or k8s://https://host:443"},
                },
            },
        ],
    }
