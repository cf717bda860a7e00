"""SQLite settings shared by the store's own connections and the ADBC child processes (standard library only)."""
from __future__ import annotations

# WAL pages before the writer checkpoints in its own commit: a big random-key batch dirties thousands at once. A
# backstop: the node checkpoints in the background (NodeStore.checkpoint) long before a one-row write path gets there.
SQLITE_CHECKPOINT_PAGES = 16_384
