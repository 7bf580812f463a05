"""Writes a commit manifest and a timeline record of a ckpt-files sink with release 1441567's code (the release before
the typed records), for tests/unit/sinks/test_sink_1441567.py. Run with that release on the path:

    git worktree add /tmp/rel1441567 1441567
    PYTHONPATH=/tmp/rel1441567 .venv/bin/python tests/unit/data/gen_sink_1441567.py tests/unit/data/sink-1441567
    git worktree remove /tmp/rel1441567
"""
import json
import pathlib
import sys

from airflow_ckpt_provider.sinks.filelayout import BatchManifest, DataFile, manifest_key, timeline_key
from airflow_ckpt_provider.sinks.timelines import TimelineRecord

out = pathlib.Path(sys.argv[1])
files = (DataFile(key="data/q1/00000000000000000003/part-00000-a1-0.parquet", size=812, sha256="ab" * 32, rows=7,
                  partition=0),)
m = BatchManifest(job="orders", query_id="q1", batch_id=3, files=files, committed_at="2026-11-27T10:15:00.000+00:00",
                  schema={"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True,
                                                        "metadata": {}}]},
                  arrow_schema="ff00", timeline=1, coverage="c3", previous="c2", offsets=['{"orders":{"0":30}}'])
t = TimelineRecord("q1", 1, 0, 3, "c3", "2026-11-27T10:14:59.000+00:00", (3, 4), "restored savepoint-2")
for key, body in ((manifest_key("q1", 3, 1), m.to_json()),
                  (timeline_key("q1", 1), json.dumps(t.to_dict(), sort_keys=True).encode())):
    path = out / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
print("ok")
