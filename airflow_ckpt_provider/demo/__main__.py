"""``python -m airflow_ckpt_provider.demo``: what ``scripts/demo`` runs."""

import sys

from airflow_ckpt_provider.demo.story import main

sys.exit(main())
