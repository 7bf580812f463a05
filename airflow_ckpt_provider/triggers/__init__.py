"""Triggers: wait in the triggerer for a job's health, a control request's answer, a snapshot, or Kafka lag."""
