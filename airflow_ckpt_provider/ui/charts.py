"""The Streaming Jobs page's charts: lines over a job's history drawn as inline SVG on the server, from the job
store's records (the driver's status samples, the snapshots' manifests); no chart library, no external service.

Design notes: docs/metrics.md#design-notes-uichartspy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WIDTH, HEIGHT, PAD = 560.0, 150.0, 4.0


@dataclass(frozen=True)
class Chart:
    """One line: its id (``data-testid`` chart-ID), title, the SVG polyline's points, the y range as text and the
    time range; ``count`` points (0: nothing to draw, the page says so)."""

    id: str
    title: str
    points: str
    count: int
    y_max: str
    y_min: str
    since: float | None
    until: float | None


def line(chart_id: str, title: str, values: Sequence[tuple[float, float]], show: Callable[[float], str]) -> Chart:
    """``values`` (unix time, y) as a polyline in a WIDTH x HEIGHT box: time left to right, y from 0 (or below) up
    to its maximum; the y labels written with ``show``."""
    data = sorted(values)
    if not data:
        return Chart(chart_id, title, "", 0, "", "", None, None)
    t0, t1 = data[0][0], data[-1][0]
    lo, hi = min(0.0, *(y for _, y in data)), max(y for _, y in data)
    span_t, span_y = (t1 - t0) or 1.0, (hi - lo) or 1.0
    xy = [(PAD + (t - t0) / span_t * (WIDTH - 2 * PAD), HEIGHT - PAD - (y - lo) / span_y * (HEIGHT - 2 * PAD))
          for t, y in data]
    if len(xy) == 1:  # one point: a short flat line, so that it shows
        xy = [(PAD, xy[0][1]), (WIDTH - PAD, xy[0][1])]
    return Chart(chart_id, title, " ".join(f"{x:.1f},{y:.1f}" for x, y in xy), len(data), show(hi), show(lo),
                 t0, t1)


def _seconds(v: float) -> str:
    return f"{v:.2f} s" if v < 10 else f"{v:.0f} s"


def _count(v: float) -> str:
    return f"{v:,.0f}"


def size_text(n: float | None) -> str:
    """Bytes as the page writes them: ``512 B``, ``7.3 KiB``, ``1.2 GiB`` (also the template's ``size`` filter)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _unix(created_at: str) -> float | None:
    try:
        return datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return None


def job_charts(status: dict[str, Any] | None, snapshots: Sequence[Any]) -> list[Chart]:
    """The page's five charts: batch duration and Kafka lag from the driver's samples (status.json), snapshot size,
    new bytes and duration from the retained snapshots' manifests."""
    samples = [s for s in (status or {}).get("samples", []) if isinstance(s, list | tuple) and len(s) >= 6]
    kept = [(t, sn) for sn in snapshots if getattr(sn, "retained", False) and (t := _unix(sn.created_at)) is not None]
    return [
        line("batch-seconds", "Batch duration (mean between status writes)",
             [(float(s[0]), float(s[4])) for s in samples if s[4] is not None], _seconds),
        line("lag", "Kafka lag (records)", [(float(s[0]), float(s[5])) for s in samples if s[5] is not None], _count),
        line("snapshot-size", "Snapshot size", [(t, float(sn.size)) for t, sn in kept], size_text),
        line("snapshot-new-bytes", "Snapshot new bytes (uploaded)", [(t, float(sn.new_bytes)) for t, sn in kept],
             size_text),
        line("snapshot-seconds", "Snapshot duration", [(t, float(sn.seconds)) for t, sn in kept
                                                        if getattr(sn, "seconds", None) is not None], _seconds),
    ]
