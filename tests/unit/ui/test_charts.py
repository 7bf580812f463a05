"""ui/charts.py: the page's lines from a status's samples and the snapshots (pure)."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_ckpt_provider.ui.charts import HEIGHT, PAD, WIDTH, job_charts, line


def test_a_line_spans_the_box_from_the_first_to_the_last_time_and_from_zero_to_the_maximum() -> None:
    chart = line("x", "X", [(110.0, 4.0), (100.0, 0.0), (105.0, 2.0)], str)
    points = [tuple(float(v) for v in p.split(",")) for p in chart.points.split()]
    assert points == [(PAD, HEIGHT - PAD), ((WIDTH) / 2, HEIGHT / 2), (WIDTH - PAD, PAD)]
    assert (chart.count, chart.y_max, chart.y_min, chart.since, chart.until) == (3, "4.0", "0.0", 100.0, 110.0)


def test_one_point_is_a_flat_line_and_none_is_nothing_to_draw() -> None:
    assert line("x", "X", [(100.0, 3.0)], str).points == f"{PAD:.1f},{PAD:.1f} {WIDTH - PAD:.1f},{PAD:.1f}"
    empty = line("x", "X", [], str)
    assert (empty.count, empty.points) == (0, "")


def test_the_page_charts_read_the_samples_and_the_retained_snapshots_only() -> None:
    status = {"samples": [[100.0, 3, 2, 40, 0.5, 10], [130.0, 5, 2, 40, None, None], [160.0, 7, 2, 40, 1.5, 0],
                          "malformed"]}
    snapshots = [SimpleNamespace(retained=True, created_at="2026-11-29T10:00:00.000+00:00", size=2048, new_bytes=1024,
                                 seconds=0.75),
                 SimpleNamespace(retained=True, created_at="2026-11-29T10:01:00.000+00:00", size=2048, new_bytes=0,
                                 seconds=None),  # written before manifests said how long they took
                 SimpleNamespace(retained=False, created_at="2026-11-29T09:00:00.000+00:00", size=9, new_bytes=9,
                                 seconds=9.0),
                 SimpleNamespace(retained=True, created_at="not a time", size=1, new_bytes=1, seconds=1.0)]
    charts = {c.id: c for c in job_charts(status, snapshots)}
    assert [c.count for c in charts.values()] == [2, 2, 2, 2, 1]
    assert (charts["batch-seconds"].y_max, charts["lag"].y_max) == ("1.50 s", "10")
    assert (charts["snapshot-size"].y_max, charts["snapshot-new-bytes"].y_max) == ("2.0 KiB", "1.0 KiB")
    assert charts["snapshot-seconds"].y_max == "0.75 s"
    assert [c.count for c in job_charts(None, [])] == [0, 0, 0, 0, 0]
