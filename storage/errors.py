"""The store's one error type, apart so that every store kind (storage/db.py's files,
storage/lake.py's team stores) raises the same one and callers catch one name."""
from __future__ import annotations


class StoreError(RuntimeError):
    """A database that cannot be used: unreadable, newer schema, locked too long."""
