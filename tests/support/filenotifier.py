"""An Airflow notifier that sends its templated text by appending it to a file, as Slack's sends its text: what the
system tests read to see an alert that Airflow sent (a task's callback, a deadline's, in any Airflow process)."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk.bases.notifier import BaseNotifier


class FileNotifier(BaseNotifier):
    """Appends ``<unix time> <text>`` to ``path``, one line per notification."""

    template_fields = ("text",)

    def __init__(self, text: str, path: str) -> None:
        super().__init__()
        self.text, self.path = text, path

    def notify(self, context: Any) -> None:
        with open(self.path, "a") as out:
            out.write(f"{time.time():.3f} {self.text}\n")

    async def async_notify(self, context: Any) -> None:
        self.notify(context)
