"""Flink-style checkpoints, savepoints, restarts and upgrades for PySpark Structured Streaming."""

from __future__ import annotations

__version__ = "0.1.0"
