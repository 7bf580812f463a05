"""The demo (``scripts/demo``, ``python -m airflow_ckpt_provider.demo``): the story (story.py) told on the
embedded services and a throwaway Airflow home (world.py)."""
