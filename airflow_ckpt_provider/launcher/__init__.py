"""Runs on the host that launches jobs (an Airflow worker, a shell): deployment records and launches
(deploy.py), the spark-submit command (submit.py), the supervisor that restarts a driver under the
restart strategy (supervisor.py) and the launching half of the restore check (restore_check.py).
Never imports Airflow or pyspark.
"""
