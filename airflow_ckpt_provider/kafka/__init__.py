"""Kafka for PySpark without the JVM connector: a streaming source, commit-on-completion, lag."""
