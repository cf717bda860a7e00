"""The cluster's view building settings, changed by `SetBuildSettings` (`vbc build config`); owns `build_settings`."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .commands import SetBuildSettings
from .errors import InvalidArgument

if TYPE_CHECKING:
    from .state import Group0State

# A batch reads its tablet replica in chunks of about this many rows, each one Spark job, and records the last
# token done (`worker.build_progress`): a tablet of any size is built in bounded memory, and a restarted worker
# resumes at its last chunk. 250,000 rows keep one chunk per tablet for tablets of up to that size (a chunk's Spark
# job costs ~0.3 s more than its rows).
DEFAULT_CHUNK_ROWS = 250_000
MIN_CHUNK_ROWS = 100
MAX_CHUNK_ROWS = 10_000_000


@dataclass(frozen=True)
class BuildSettings:
    """How the workers build: `chunk_rows`, the base rows a batch reads (and hands to Spark) at a time."""

    chunk_rows: int = DEFAULT_CHUNK_ROWS


def set_build_settings(state: Group0State, cmd: SetBuildSettings) -> BuildSettings:
    """Change the settings; INVALID_ARGUMENT (nothing changed) for a chunk size out of range."""
    if not MIN_CHUNK_ROWS <= cmd.chunk_rows <= MAX_CHUNK_ROWS:
        raise InvalidArgument(f"a chunk holds {MIN_CHUNK_ROWS:,} to {MAX_CHUNK_ROWS:,} rows, not {cmd.chunk_rows:,}")
    state.build_settings = replace(state.build_settings, chunk_rows=cmd.chunk_rows)
    return state.build_settings
