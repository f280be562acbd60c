"""uwf-db: an embedded database and synchronous workflow engine for AI-agent threads.

Answers are the library's JSON contract (``docs/schemas/v2``) as plain dicts;
failures are :class:`UwfError` subclasses named by the contract's error kind.
Every call that reads, writes or waits releases the GIL.
"""

from ._native import (
    Ambiguous,
    Conflict,
    Corrupt,
    Damaged,
    Interrupted,
    InvalidInput,
    NotFound,
    StepFailed,
    Store,
    StoreFull,
    TooLarge,
    Unavailable,
    UwfError,
)

__all__ = [
    "Ambiguous",
    "Conflict",
    "Corrupt",
    "Damaged",
    "Interrupted",
    "InvalidInput",
    "NotFound",
    "StepFailed",
    "Store",
    "StoreFull",
    "TooLarge",
    "Unavailable",
    "UwfError",
]
