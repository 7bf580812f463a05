"""``python -m airflow_ckpt_provider.cli``: what supervisors launched by Airflow run (launcher/deploy.py)."""

import sys

from airflow_ckpt_provider.cli.main import main

sys.exit(main())
