"""The provider's Spark data sources in a driver's session, and the checks of a job's writer.

``register_data_sources(spark)`` makes ``format("ckpt-kafka")`` (source and transactional writer) and
``format("ckpt-files")`` available; the job runtime calls it before the job's build function.
``check_output_mode(writer)`` refuses, when the query is defined, an output mode Spark would refuse
only at the first batch.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError

#: The sinks that are Python data sources: Spark 4.3 runs them in append mode only.
APPEND_ONLY = ("ckpt-files", "ckpt-kafka")


def register_data_sources(spark: Any) -> None:
    """Register ``ckpt-kafka`` (reader and transactional writer) and ``ckpt-files`` in ``spark``."""
    from airflow_ckpt_provider.kafka.source import register
    from airflow_ckpt_provider.sinks.files import register as register_files

    register(spark)
    register_files(spark)


def output_mode(writer: Any) -> tuple[str | None, str | None]:
    """(format, output mode) of a DataStreamWriter, read from its JVM object; (None, None) if that fails.

    pyspark has no getter for either; the classic DataStreamWriter keeps them in private fields.
    """
    try:
        jwriter = writer._jwrite
        values = []
        for name in ("source", "outputMode"):
            field = jwriter.getClass().getDeclaredField(name)
            field.setAccessible(True)
            values.append(str(field.get(jwriter)))
        return values[0], values[1]
    except Exception:  # Spark Connect, another Spark version: the sink's own check still applies
        return None, None


def check_output_mode(writer: Any) -> None:
    """Refuse update or complete mode for the ckpt sinks when the query is defined, not at its first batch.

    Spark refuses them for every Python data source sink, but only when the first batch is planned,
    with a long Java stack trace ("requirement failed: ckpt-files does not support Update mode").
    """
    source, mode = output_mode(writer)
    if source in APPEND_ONLY and mode is not None and mode.lower() != "append":
        raise ConfigError(
            f"the {source} sink supports the append output mode only, found outputMode({mode.lower()!r}): Spark "
            "4.3 runs Python data source sinks in append mode. Use outputMode('append') (with a watermark for "
            "aggregations), or write the changed rows with foreachBatch and the ledger"
        )
