"""Airflow notifiers for streaming jobs (notifications/job.py)."""
