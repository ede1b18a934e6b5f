"""cairn: checkpoints from Python (cairn.Checkpointer, over libcairn: see
checkpointer.py; PyTorch state dicts: cairn.pytorch) and read-only analysis
of cairn checkpoint stores, read by libcairn's reader (include/cairn_store.h).

    import cairn
    s = cairn.open("cairn-store")
    s.runs()                                   # run ids with committed versions
    s.checkpoints("run-a")                     # checkpoint names of a run
    s.versions("run-a", "heat2d")              # committed versions (valid MANIFEST)
    a = s.region("run-a", "heat2d", 100, "grid")          # numpy array, real dtype/shape
    s.region("run-a", "heat2d", 100, "iter", rank=1)      # one rank's block
    s.run_info("run-a")                        # RUN file (identity, executions) or None
    d = cairn.diff(s, "run-a", "run-b", abs=1e-12)       # `cairn diff --json`, parsed
    cairn.diff_rows(d)                         # flattened per version / region / rank

`python -m cairn.report STORE RUN_A RUN_B --out DIR` (or `cairn-report`) writes
PNG plots and a text summary of a diff.

Every region read is checked against its checksum (xxh3-64) by libcairn;
damaged data raise CorruptionError, never reach the caller.
"""
from ._format import TYPES, RegionInfo, ShardHeader
from ._hash import xxh3_64
from .diff import Row, diff, find_cli, first_divergence, has_diff, outcome
from .diff import rows as diff_rows
from .checkpointer import (LEVEL_CAPTURED, LEVEL_LOCAL, LEVEL_PERSISTENT, LEVEL_PROTECTED,
                           Checkpointer)
from .errors import (AgainError, BusyError, CairnError, CairnIOError, CancelledError, CorruptionError, DiffUnavailable,
                     DivergedError, EarlierFailureWarning, ExistsError, InvalidArgumentError, NoSpaceError, NotFoundError,
                     NotSupportedError, UnusableError)
from .store import Store, open  # noqa: A004

__version__ = "0.1.0"

__all__ = [
    "open", "Store", "RegionInfo", "ShardHeader", "TYPES", "diff", "diff_rows", "Row", "first_divergence",
    "outcome", "find_cli", "has_diff", "xxh3_64", "CairnError", "CorruptionError", "NotFoundError",
    "NotSupportedError", "DiffUnavailable", "Checkpointer", "LEVEL_CAPTURED", "LEVEL_LOCAL", "LEVEL_PROTECTED",
    "LEVEL_PERSISTENT", "InvalidArgumentError", "CairnIOError", "NoSpaceError", "AgainError", "CancelledError",
    "DivergedError", "UnusableError", "ExistsError", "EarlierFailureWarning", "BusyError",
]
