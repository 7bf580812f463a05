"""The exception hierarchy of the core: every message says what was expected, what was found, and what to do."""

from __future__ import annotations


class CkptError(Exception):
    """Base class of every error this package raises on purpose."""


class StorageError(CkptError):
    """The job store or checkpoint storage cannot be reached or refused the request."""


class UnreachableError(StorageError):
    """The storage endpoint did not answer (connection refused, timeout): an outage a wait may outlast."""


class CredentialsError(StorageError):
    """The storage refused the credentials (bad secret, unknown key, no permission): no restart fixes that."""


class CheckpointError(CkptError):
    """A Spark checkpoint directory is missing, not a checkpoint, or inconsistent."""


class SnapshotError(CkptError):
    """A snapshot is missing, corrupt, incomplete, or belongs to another job."""


class ConflictError(CkptError):
    """The request would overwrite or race with existing data; nothing was changed."""


class ConfigError(CkptError):
    """An argument or setting is invalid."""
