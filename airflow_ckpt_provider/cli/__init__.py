"""The ``ckpt`` command line (``python -m airflow_ckpt_provider.cli``): one module per command group.

``main.py`` builds the parser; ``snapshot``, ``job``, ``run``, ``kafka`` and ``sink`` add their
commands; ``common`` holds the store flags and output helpers they share. Never imports Airflow.
"""
