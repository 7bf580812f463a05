"""The files a view of one completed batch chooses from one listing of a Spark checkpoint.

Pure Python over a listing (key -> size) and a reader (no pyspark). core/snapshots/checkpoint.py builds a
BatchView with a :class:`ViewPlan`: it chooses the metadata, offsets/commits and source log files,
core/snapshots/statestore.py the state stores' files; both record here what a restore from the view would
lack (problems) and what is broken in the live checkpoint (warnings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

FORMAT_V2 = (
    "the query uses state store checkpoint format version 2 (state files named <version>_<uniqueId>) but the "
    "commit of this batch lists no stateUniqueIds to choose them by (a v1 commit): the commit log and the state "
    "disagree; restore another batch, or check that nothing rewrote commits/"
)


def numbered(sizes: dict[str, int], directory: str) -> dict[int, str]:
    """Batch id -> key for the files named by a plain integer directly under ``directory``."""
    out: dict[int, str] = {}
    for key in sizes:
        if key.startswith(directory + "/"):
            name = key[len(directory) + 1 :]
            if name.isdigit():
                out[int(name)] = key
    return out


@dataclass
class ViewPlan:
    """Files chosen so far and problems found while building a BatchView."""

    sizes: dict[str, int]
    read: Callable[[str], bytes]
    uri: Callable[[str], str]
    verify: bool
    chosen: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # a restore from the view would fail
    warnings: list[str] = field(default_factory=list)  # the live checkpoint has broken files
    batch: int | None = None
    #: State checkpoint format v2: commits/N's ``stateUniqueIds`` (operator id -> [partition] -> [store] -> the
    #: unique id of state version N+1); None for format v1.
    state_ids: dict[str, list[list[str]]] | None = None

    def add(self, problem: str) -> None:
        """Record a problem once."""
        if problem not in self.problems:
            self.problems.append(problem)

    def need(self, key: str, why: str) -> bool:
        """Choose ``key``; record a problem if the listing does not have it."""
        if key not in self.sizes:
            self.problems.append(f"{key} is missing: {why}")
            return False
        self.chosen.add(key)
        return True

    def load(self, key: str) -> bytes | None:
        """The bytes of a listed file, or None (problem recorded) if it vanished meanwhile."""
        try:
            return self.read(key)
        except FileNotFoundError:
            self.problems.append(
                f"{key} was deleted while the checkpoint was read (Spark maintenance purges old "
                "files); take the view again"
            )
            return None
