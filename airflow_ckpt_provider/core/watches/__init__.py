"""Watches: pollers that wait for a job to be healthy (or not), a control request's answer, a snapshot, or a
restore check's verdict; one module per watch, nothing here imports Airflow.

Design notes: docs/airflow.md#design-notes-corewatches__init__py."""
