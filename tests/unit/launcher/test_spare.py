"""The supervisor's warm standby (launcher/spare.py) and the standby's wait (runtime/standby.py): which spare is
started, promoted, replaced or given up on; fake processes (the real ones: tests/integration/test_standby.py)."""

from __future__ import annotations

import signal
from pathlib import Path

from airflow_ckpt_provider.launcher.spare import FAILED_STARTS, Spare
from airflow_ckpt_provider.runtime.standby import STANDBY_ENV, SUPERVISOR_ENV, StandbySlot, await_go


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        assert self.code is not None, "waited for a process that runs"
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.code = -9


class Spawner:
    def __init__(self) -> None:
        self.started: list[tuple[FakeProc, dict[str, str]]] = []

    def __call__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> FakeProc:
        proc = FakeProc(100 + len(self.started))
        self.started.append((proc, env))
        return proc

    def slot(self, i: int) -> StandbySlot:
        found = StandbySlot.from_env(self.started[i][1])
        assert found is not None
        return found


def test_a_ready_spare_is_promoted_with_its_go_and_the_next_start_replaces_it(tmp_path: Path) -> None:
    spawn = Spawner()
    spare = Spare("orders", spawn, slots=tmp_path)
    spare.start(["spark-submit"], {"A": "1"}, None)
    spare.start(["spark-submit"], {"A": "1"}, None)  # one runs: nothing more
    assert len(spawn.started) == 1
    proc, env = spawn.started[0]
    assert env["A"] == "1" and STANDBY_ENV in env and SUPERVISOR_ENV in env
    slot = spawn.slot(0)
    assert spare.promote() is None  # not ready yet: stopped, and the caller starts a driver as without a standby
    assert proc.signals == [signal.SIGKILL] and not slot.go.exists()

    spare.start(["spark-submit"], {}, None)
    proc, slot = spawn.started[1][0], spawn.slot(1)
    slot.ready.touch()  # the standby built its session and the job
    assert spare.promote() is proc and slot.go.exists() and proc.signals == []
    assert spare.proc is None
    spare.start(["spark-submit"], {}, None)  # the next spare: the promoted one's files are removed
    assert len(spawn.started) == 3 and not slot.go.exists() and not slot.ready.exists()
    spare.stop()
    assert spawn.started[2][0].signals == [signal.SIGKILL] and not spawn.slot(2).go.exists()


def test_a_spare_that_dies_is_replaced_and_three_that_die_before_ready_are_given_up_on(tmp_path: Path) -> None:
    spawn = Spawner()
    spare = Spare("orders", spawn, slots=tmp_path)
    spare.start([], {}, None)
    spawn.slot(0).ready.touch()
    spawn.started[0][0].code = -9  # killed while waiting: replaced
    spare.start([], {}, None)
    assert len(spawn.started) == 2 and spare.failed_starts == 0
    for i in range(FAILED_STARTS):  # each dies before it is ready (a broken build, say)
        spawn.started[-1][0].code = 2
        spare.start([], {}, None)
        assert spare.failed_starts == i + 1
    assert len(spawn.started) == 1 + FAILED_STARTS and spare.proc is None  # not started again
    assert spare.promote() is None


def test_a_standby_waits_for_its_go_and_ends_when_its_supervisor_is_gone(tmp_path: Path) -> None:
    slot = StandbySlot(tmp_path / "s.go", supervisor_pid=4321)
    looks: list[float] = []

    def sleep_then_go(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 3:
            slot.go.touch()

    def ready_then_go(seconds: float) -> None:
        assert slot.ready.exists()  # said before the wait
        sleep_then_go(seconds)

    assert await_go(slot, alive=lambda pid: True, sleep=ready_then_go) == ""
    assert len(looks) == 3 and not slot.go.exists() and not slot.ready.exists()  # its files removed once it goes
    assert await_go(slot, alive=lambda pid: pid != 4321, sleep=lambda s: None) == "its supervisor (pid 4321) is gone"
    assert not slot.ready.exists()
    assert StandbySlot.from_env({}) is None
