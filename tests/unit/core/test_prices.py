"""What store requests cost (core/policy/prices.py) and the driver's request rate over its window
(runtime/reporting.RequestRates): pure arithmetic, the prices a setting."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.prices import RequestPrices, by_class, describe_rates
from airflow_ckpt_provider.core.store import requestcount
from airflow_ckpt_provider.runtime.reporting import RequestRates


def test_a_list_every_second_costs_what_docs_scale_md_measured_and_prices_are_a_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert round(RequestPrices().monthly({"ListObjectsV2": 3398 / 3600}), 2) == 12.40  # $12.4 of an idle job's $19
    assert by_class({"PutObject": 2, "UploadPart": 1, "HeadObject": 3, "GetObject": 1, "DeleteObjects": 5}) == {
        "put": 3, "get": 4, "delete": 5}
    monkeypatch.setenv("CKPT_REQUEST_PRICES", "get=0.001, delete=0.005")
    prices = RequestPrices.from_env()
    assert (prices.put, prices.get, prices.delete) == (0.005, 0.001, 0.005)
    assert describe_rates({"GetObject": 1.0, "ListObjectsV2": 0.5}, 600.0, prices) == (
        "1.50 requests/s (GET 1.00, LIST 0.50) over the last 600 s, about $9.20 a month at put $0.005 / get $0.001 / "
        "delete $0.005 per 1,000 (CKPT_REQUEST_PRICES)")


@pytest.mark.parametrize("text", ["put=cheap", "list=0.005", "get=-1"])
def test_a_bad_price_setting_says_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigError, match=r"CKPT_REQUEST_PRICES: expected put=, get= or delete= with dollars per "
                                          r"1,000 requests >= 0"):
        RequestPrices.parse(text)


def test_the_rate_is_taken_over_the_last_window_so_the_starts_burst_ages_out(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {"GetObject": 0}
    monkeypatch.setattr(requestcount, "counts", lambda: dict(counts))
    now = [0.0]
    rates = RequestRates(window=600.0, clock=lambda: now[0])
    assert rates.sample() == {}  # one sample: no rate yet
    counts["GetObject"] = 1000  # the start's burst
    now[0] = 10.0
    assert rates.sample() == {"store_rates": {"GetObject": 100.0}, "store_window": 10.0}
    for t in range(20, 1300, 10):  # then one GET a second
        counts["GetObject"] += 10
        now[0] = float(t)
        sampled = rates.sample()
    assert sampled["store_rates"] == {"GetObject": 1.0} and 600.0 <= sampled["store_window"] <= 610.0
