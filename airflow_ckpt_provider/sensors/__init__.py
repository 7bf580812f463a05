"""Sensors (deferrable by default): a job's health, a new snapshot, a consumer group's lag."""
