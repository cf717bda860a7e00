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
MIN_RATE = 100  # rows per second per node
DEFAULT_PARALLEL_BASES = 2
MAX_PARALLEL_BASES = 16
MAX_RATE = 1_000_000_000


@dataclass(frozen=True)
class BuildSettings:
    """How the workers build: `chunk_rows`, the base rows a batch reads (and hands to Spark) at a time;
    `rate_rows_per_s`, the base rows each node's batches read per second at most (0: no limit); and
    `parallel_bases`, how many base tables' views are built at once (filled in creation order)."""

    chunk_rows: int = DEFAULT_CHUNK_ROWS
    rate_rows_per_s: int = 0
    parallel_bases: int = DEFAULT_PARALLEL_BASES


def set_build_settings(state: Group0State, cmd: SetBuildSettings) -> BuildSettings:
    """Change the settings given; INVALID_ARGUMENT (nothing changed) for a value out of range."""
    settings = state.build_settings
    if cmd.chunk_rows is not None:
        if not MIN_CHUNK_ROWS <= cmd.chunk_rows <= MAX_CHUNK_ROWS:
            raise InvalidArgument(f"a chunk holds {MIN_CHUNK_ROWS:,} to {MAX_CHUNK_ROWS:,} rows, not "
                                  f"{cmd.chunk_rows:,}")
        settings = replace(settings, chunk_rows=cmd.chunk_rows)
    if cmd.rate_rows_per_s is not None:
        if cmd.rate_rows_per_s != 0 and not MIN_RATE <= cmd.rate_rows_per_s <= MAX_RATE:
            raise InvalidArgument(f"a build rate is {MIN_RATE:,} to {MAX_RATE:,} rows per second (or off), not "
                                  f"{cmd.rate_rows_per_s:,}")
        settings = replace(settings, rate_rows_per_s=cmd.rate_rows_per_s)
    if cmd.parallel_bases is not None:
        if not 1 <= cmd.parallel_bases <= MAX_PARALLEL_BASES:
            raise InvalidArgument(f"1 to {MAX_PARALLEL_BASES} base tables are built at once, not {cmd.parallel_bases}")
        settings = replace(settings, parallel_bases=cmd.parallel_bases)
    state.build_settings = settings
    return settings


def chunk_limit(settings: BuildSettings) -> int:
    """The rows a chunk holds at most: `chunk_rows`, and under a rate limit one second's worth (so a lifted or
    changed limit takes effect within a second)."""
    if settings.rate_rows_per_s:
        return max(MIN_CHUNK_ROWS, min(settings.chunk_rows, settings.rate_rows_per_s))
    return settings.chunk_rows
