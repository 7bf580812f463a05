"""StreamingJobsPlugin: the Streaming jobs page in the Airflow 3 UI's navigation.

Registered through the provider's metadata (get_provider_info ``plugins``), so installing the provider is
enough. The API server mounts the FastAPI app (ui/app.py) at ``/ckpt-jobs``; the navigation entry shows it
inside the Airflow UI (``/plugin/streaming-jobs``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_ckpt_provider.ui.app import create_app

URL_PREFIX = "/ckpt-jobs"


class StreamingJobsPlugin(AirflowPlugin):
    name = "ckpt_streaming_jobs"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Streaming jobs"}]  # noqa: RUF012 - AirflowPlugin's class attributes
    external_views = [  # noqa: RUF012 - AirflowPlugin's class attributes
        {"name": "Streaming jobs", "href": URL_PREFIX.lstrip("/") + "/", "destination": "nav",
         "url_route": "streaming-jobs", "nav_top_level": True},
    ]
