"""The Streaming jobs page of the Airflow UI: an Airflow 3 plugin (a FastAPI app and a navigation view)."""
