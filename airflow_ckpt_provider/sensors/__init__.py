"""Sensors (deferrable with deferrable=True or Airflow's [operators] default_deferrable): a job's health, a new
snapshot, a consumer group's lag."""
