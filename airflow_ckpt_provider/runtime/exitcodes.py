"""Exit codes of the driver (``entrypoint.py``): the contract between a driver and whoever restarts it."""

from __future__ import annotations

EXIT_STOPPED = 0  # stopped with a savepoint, or canceled on request
EXIT_FAILED = 1  # the query failed: restart it from the latest state
EXIT_CONFIG = 2  # bad input (unknown snapshot, unreachable store, bad job file): a restart fails again
EXIT_FENCED = 3  # a newer driver took the job's lease: it runs the job now, do not compete with it
# (4 is the CLI's "no answer in time" of `ckpt job`, never a driver's.)
EXIT_INCOMPATIBLE = 5  # the job's code cannot restore or run on the state (a restore check, a state schema change)
EXIT_DENIED = 6  # the storage refused the credentials (bad secret, unknown key, no permission)
EXIT_REFUSED = 7  # a sink refused the query (its output mode, or a batch of another timeline)

#: What each code means, for logs; codes not listed are failures (a crash, a signal, a JVM error).
MEANING = {
    EXIT_STOPPED: "stopped",
    EXIT_FAILED: "failed",
    EXIT_CONFIG: "bad input",
    EXIT_FENCED: "fenced by a newer driver",
    EXIT_INCOMPATIBLE: "cannot restore the state",
    EXIT_DENIED: "credentials refused",
    EXIT_REFUSED: "a sink refused the query",
}

#: Codes after which restarting cannot help.
NOT_RESTARTABLE = frozenset({EXIT_CONFIG, EXIT_FENCED, EXIT_INCOMPATIBLE, EXIT_DENIED, EXIT_REFUSED})


def exit_meaning(code: int) -> str:
    """``failed``, ``bad input``, ``signal 9``: what a driver's exit status means.

    spark-submit exits with 128+N when the Python driver died of signal N (Java's exit status of a child).
    """
    if code < 0:
        return f"signal {-code}"
    if 128 < code <= 128 + 64:
        return f"failed: 128+{code - 128}, the Python driver likely died of signal {code - 128}"
    return MEANING.get(code, "failed")
