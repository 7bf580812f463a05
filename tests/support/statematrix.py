"""The state matrix job's records and the rows an uninterrupted run writes (tests/jobs/state_matrix.py).

Record j (j < count): id j, event time T0 + 10 j, k = k<j % 5>, sk = s<j % 4> in even blocks of 16 records
and s<4 + j % 4> in odd ones (so each sk has sessions with gaps of 200 s or more), ref: orders (j % 3 == 0)
have none, j % 3 == 1 pays order j - 1, j % 3 == 2 pays order j - 50 or, every other 30 records, order j + 31
(the payment arrives first). After every record j % 7 == 6 (j >= 20) comes a copy of record j - 13 with
dup = true and its own later time. Each k's last record has last = true. The last record (``flush``) is a day later.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

T0 = 1_800_000_000  # a whole minute
STEP = 10  # seconds between records
GAP = 45  # the session gap (seconds)
RANGE = 600  # the join's event-time range (seconds)

Record = dict[str, Any]
Row = tuple[str, str, str]  # (op, key, value)


def record(j: int, count: int) -> Record:
    ref = None if j % 3 == 0 else j - 1 if j % 3 == 1 else (j - 50 if (j // 30) % 2 == 0 else j + 31)
    sk = f"s{j % 4}" if (j // 16) % 2 == 0 else f"s{4 + j % 4}"
    return {"id": j, "k": f"k{j % 5}", "sk": sk, "ref": ref, "dup": False, "last": j >= count - 5,
            "t": T0 + STEP * j}


def records(count: int) -> list[Record]:
    """Every record in the order produced, the flush record last."""
    out = []
    for j in range(count):
        out.append(record(j, count))
        if j % 7 == 6 and j >= 20:
            out.append({**record(j - 13, count), "dup": True, "last": False, "t": T0 + STEP * j})
    out.append({"id": -1, "k": "flush", "sk": "flush", "ref": None, "dup": False, "last": False,
                "t": T0 + STEP * count + 86_400})
    return out


def expected(produced: list[Record]) -> Counter[Row]:
    """The rows (op, key, value) an uninterrupted run over ``produced`` (ending with the flush record) writes."""
    rows: Counter[Row] = Counter()
    fresh = [r for r in produced if not r["dup"]]
    keyed = [r for r in fresh if r["k"] != "flush"]
    for op in ("dedup", "dedup_ww"):
        rows.update((op, str(i), "") for i in {r["id"] for r in produced})
    rows.update(("window", f"{start} {k}", str(n))
                for (start, k), n in Counter((r["t"] - r["t"] % 60, r["k"]) for r in keyed).items())
    by_sk: dict[str, list[int]] = defaultdict(list)
    for r in keyed:
        by_sk[r["sk"]].append(r["t"])
    for sk, times in by_sk.items():
        start, end, n = None, 0, 0
        for t in sorted(times):
            if start is not None and t >= end:
                rows[("session", f"{start} {sk}", f"{end} {n}")] += 1
                start = None
            if start is None:
                start, n = t, 0
            end, n = t + GAP, n + 1
        rows[("session", f"{start} {sk}", f"{end} {n}")] += 1
    orders = {r["id"]: r for r in keyed if r["ref"] is None}
    rows.update(("join", f"{r['ref']} {r['id']}", "") for r in keyed
                if r["ref"] in orders and abs(r["t"] - orders[r["ref"]]["t"]) <= RANGE)
    by_k: dict[str, list[Record]] = defaultdict(list)
    for r in keyed:
        by_k[r["k"]].append(r)
    for k, mine in by_k.items():
        rows[("pandas_state", k, f"{len(mine)} {sum(r['id'] for r in mine)}")] += 1
        rows[("tws_pandas", k, str(len(mine)))] += 1
        value = {"ids": sorted(r["id"] for r in mine), "sk": dict(Counter(r["sk"] for r in mine))}
        rows[("tws_rows", k, json.dumps(value, sort_keys=True))] += 1
    return rows
