"""What the sensors share: defer to their trigger, or poke the trigger's watch in the worker.

Either way the event goes through ``finish``, which checks its status against the trigger's closed
set. A failure outcome raises AirflowException (AirflowSensorTimeout for a timeout), or skips the task
when ``soft_fail`` is set, in both modes alike.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from airflow.sdk import BaseSensorOperator
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_ckpt_provider.operators.base import default_deferrable
from airflow_ckpt_provider.triggers.base import ERROR, TIMEOUT, WatchTrigger, min_deferral

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.watches.base import Watch

#: The deferral's own timeout comes this long after the trigger's, so the trigger's timeout event (which
#: says what it last saw) normally ends the wait; the deferral timeout is the backstop.
DEFER_GRACE = 60.0


class WatchSensor(BaseSensorOperator):
    """A sensor on a core watch. ``deferrable`` (default: Airflow's ``[operators] default_deferrable``, as for
    the operators) waits in the triggerer, at least ``min_deferral`` s (the operators' ``min_deferral``: an
    earlier outcome is held until then).

    Not deferrable, ``poke`` keeps the watch between pokes in mode="poke" (the default); mode="reschedule"
    starts a new watch at every poke, so what a watch tracks over time cannot be judged there.
    """

    trigger_class: ClassVar[type[WatchTrigger]]

    def __init__(self, *, deferrable: bool | None = None, poke_interval: float = 10.0,
                 min_deferral: float | None = None, **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.min_deferral = min_deferral
        self._watch: Watch | None = None

    @abstractmethod
    def make_trigger(self) -> WatchTrigger:
        """The trigger from the (rendered) arguments; no IO. Its ``build_watch`` serves ``poke``."""

    @abstractmethod
    def on_event(self, event: dict[str, Any]) -> Any:
        """The task's result (pushed to XCom) for an event whose status is the watch's own."""

    def execute(self, context: Context) -> Any:
        if self.deferrable:
            trigger = self.make_trigger()
            trigger.waiting_since = time.time()  # the trigger's timeout counts from here, as Airflow's does
            trigger.min_wait = min_deferral(self.min_deferral)
            self.log.info("Deferring to %s (timeout %.0f s)", type(trigger).__name__, self.timeout)
            self.defer(trigger=trigger, method_name="execute_complete",
                       timeout=timedelta(seconds=self.timeout + DEFER_GRACE))
        return super().execute(context)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        if self._watch is None:
            self._watch = self.make_trigger().build_watch()
        event = self._watch.poll()
        if event is None:
            self.log.info("Waiting: %s", self._watch.waiting_for())
            return False
        return PokeReturnValue(is_done=True, xcom_value=self.finish(event))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        return self.finish(event)

    def finish(self, event: dict[str, Any] | None) -> Any:
        """Validate the event against the trigger's closed set and turn it into a result or an exception."""
        allowed = self.trigger_class.STATUSES
        if not isinstance(event, dict) or event.get("status") not in allowed:
            raise AirflowException(
                f"{self.task_id}: expected an event with a status in {sorted(allowed)} from "
                f"{self.trigger_class.__name__}, found {event!r}"
            )
        status = event["status"]
        if status == TIMEOUT:
            self.fail(str(event.get("message")), timeout=True)
        if status == ERROR:  # broken (a missing connection, an unreachable store): never skipped by soft_fail
            self.log.error("%s failed:\n%s", self.trigger_class.__name__, event.get("traceback", ""))
            raise WatchFailedError(f"{self.task_id}: {event.get('message')}")
        return self.on_event(event)

    def fail(self, message: str, *, timeout: bool = False) -> NoReturn:
        """Fail the task (a timeout as AirflowSensorTimeout), or skip it with ``soft_fail``."""
        if self.soft_fail:
            raise AirflowSkipException(f"{self.task_id}: {message} (soft_fail: skipped)")
        if timeout:
            raise AirflowSensorTimeout(f"{self.task_id}: {message}")
        raise AirflowException(f"{self.task_id}: {message}")


class WatchFailedError(RuntimeError):
    """The watch itself failed. Not an AirflowException on purpose: Airflow's sensor turns those into skips
    under ``soft_fail``, and a broken connection must fail the task, not look like "nothing happened"."""


def optional_int(value: Any) -> int | None:
    """An int from an argument that may have been rendered by a template ("None" and "" are None)."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    return int(value)


def optional_time(value: Any) -> float | None:
    """Epoch seconds from a number, a datetime or a (rendered) string: a number or ISO 8601."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return datetime.fromisoformat(value.strip()).timestamp()
    return float(value)
