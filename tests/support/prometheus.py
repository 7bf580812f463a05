"""A throwaway Prometheus server (Debian's package) bound to 127.0.0.1 on a free port, with the drivers' file_sd
targets and the alert rules `ckpt metrics` renders; stopped (and its data removed with the test's tmp_path) by
whoever started it."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from airflow_ckpt_provider.embedded.process import free_port


def read_endpoint(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A metrics endpoint's samples as {(sample name, its labels sorted): value} (prometheus_client's parser)."""
    with urllib.request.urlopen(url, timeout=5) as r:  # an endpoint of the test's, on 127.0.0.1
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}

BINARY = shutil.which("prometheus")


class Prometheus:
    """``prometheus`` scraping the targets in ``targets`` (a file_sd file) every second and evaluating ``rules``."""

    def __init__(self, work: Path, targets: Path, rules: Path, *, scrape_job: str = "ckpt-drivers") -> None:
        assert BINARY is not None, "prometheus is missing: scripts/bootstrap installs Debian's package as root"
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": scrape_job, "file_sd_configs": [
                {"files": [str(targets)], "refresh_interval": "1s"}]}],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = work / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [BINARY, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
                stdout=out, stderr=subprocess.STDOUT)
        self.wait_ready(60.0)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready within {timeout} s:\n{self.tail()}")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class OtlpReceiver:
    """An OTLP/HTTP metrics endpoint on 127.0.0.1 (a free port) that keeps the newest value of each data point:
    {(metric name, its attributes but the common ones): value}, decoded with OpenTelemetry's own protobufs."""

    COMMON = frozenset({"ckpt_job", "epoch", "code_version"})

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )

        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.attributes: list[dict[str, str]] = []
        self.exports = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportMetricsServiceRequest.FromString(body)
                receiver.take(request)
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, request: Any) -> None:
        self.exports += 1
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    data = metric.sum if metric.HasField("sum") else metric.gauge
                    for point in data.data_points:
                        attrs = {a.key: a.value.string_value for a in point.attributes}
                        self.attributes.append(attrs)
                        rest = tuple(sorted((k, v) for k, v in attrs.items() if k not in self.COMMON))
                        value = point.as_int if point.HasField("as_int") else point.as_double
                        self.values[(metric.name, rest)] = float(value)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
