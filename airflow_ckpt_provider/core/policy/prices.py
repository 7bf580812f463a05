"""What store requests cost: a request rate by S3 operation turned into dollars a month, at prices that are a
setting (``CKPT_REQUEST_PRICES``), by default AWS S3 Standard's list prices in us-east-1 as published when this was
written, not truths: a bill has its own.

Design notes: docs/scale.md#design-notes-corepolicypricespy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import ConfigError

ENV = "CKPT_REQUEST_PRICES"
#: Hours in the month the estimates use (AWS's own).
MONTH_HOURS = 730
#: S3 operations by price class: PUT, COPY, POST and LIST cost as "put"; GET, HEAD and the rest as "get"; DELETE is
#: free (DeleteObjects is a POST: its class is a setting of its own, "delete", free by default as AWS bills it).
PUT_CLASS = frozenset({"PutObject", "CopyObject", "PostObject", "ListObjectsV2", "ListObjects", "ListObjectVersions",
                       "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "UploadPartCopy"})
DELETE_CLASS = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})
DEFAULT = {"put": 0.005, "get": 0.0004, "delete": 0.0}  # dollars per 1,000 requests


def price_class(operation: str) -> str:
    return "put" if operation in PUT_CLASS else "delete" if operation in DELETE_CLASS else "get"


@dataclass(frozen=True)
class RequestPrices:
    """Dollars per 1,000 requests of each class (``put``, ``get``, ``delete``)."""

    put: float = DEFAULT["put"]
    get: float = DEFAULT["get"]
    delete: float = DEFAULT["delete"]

    @classmethod
    def parse(cls, text: str) -> RequestPrices:
        """``put=0.005,get=0.0004,delete=0`` (any of them; the others keep their defaults); ConfigError if bad."""
        values: dict[str, float] = {}
        for item in (i.strip() for i in text.split(",") if i.strip()):
            name, _, value = item.partition("=")
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if name.strip() not in DEFAULT or number < 0:
                raise ConfigError(f"{ENV}: expected put=, get= or delete= with dollars per 1,000 requests >= 0 (e.g. "
                                  f"'put=0.005,get=0.0004'), found {item!r}")
            values[name.strip()] = number
        return cls(**values)

    @classmethod
    def from_env(cls) -> RequestPrices:
        return cls.parse(os.environ.get(ENV, ""))

    def monthly(self, per_second: Mapping[str, float]) -> float:
        """Dollars a month of requests at ``per_second`` (by S3 operation)."""
        prices = {"put": self.put, "get": self.get, "delete": self.delete}
        return sum(rate * prices[name] / 1000 for name, rate in by_class(per_second).items()) * MONTH_HOURS * 3600


def by_class(per_operation: Mapping[str, float]) -> dict[str, float]:
    """Rates (or counts) by price class."""
    found = {"put": 0.0, "get": 0.0, "delete": 0.0}
    for operation, n in per_operation.items():
        found[price_class(operation)] += n
    return found


def describe_rates(rates: Mapping[str, float], window: float, prices: RequestPrices | None = None) -> str:
    """'0.93 requests/s (GET 0.50, PUT 0.21, LIST 0.03) over the last 600 s, about $1.23 a month at put $0.005 /
    get $0.0004 / delete $0 per 1,000 (CKPT_REQUEST_PRICES)': what ``ckpt job status`` and the page show."""
    prices = prices or RequestPrices.from_env()
    names = {"GetObject": "GET", "PutObject": "PUT", "ListObjectsV2": "LIST", "HeadObject": "HEAD",
             "DeleteObjects": "DELETE", "DeleteObject": "DELETE"}
    shown: dict[str, float] = {}
    for operation, rate in rates.items():
        name = names.get(operation, operation)
        shown[name] = shown.get(name, 0.0) + rate
    parts = ", ".join(f"{name} {rate:.2f}" for name, rate in sorted(shown.items(), key=lambda kv: -kv[1]))
    return (f"{sum(rates.values()):.2f} requests/s ({parts or 'none'}) over the last {window:.0f} s, about "
            f"${prices.monthly(rates):,.2f} a month at put ${prices.put:g} / get ${prices.get:g} / delete "
            f"${prices.delete:g} per 1,000 ({ENV})")
