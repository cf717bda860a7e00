"""A follower's check of an incoming append_entries message against its log: truncation only at a conflict, never
of a committed entry, and a commit index only over entries the message checked.

pysyncobj 0.3.17, on every append that matches at `prevLogIdx`, deletes the follower's entries after it and appends
the message's, whether they conflict or not (and logs "truncating already-applied log entries" when some were
applied). It then sets the commit index to min(leader's, its last index), so a log tail the message never checked
could be committed. Raft deletes only from the first entry whose term differs, and a follower commits only up to the
last entry the message verified. `check_append` rewrites the message so pysyncobj does just that:

- the entries the follower already holds (same index and term) are dropped, `prevLogIdx` moving to the last of them,
  so pysyncobj truncates from the first conflicting entry (or not at all);
- when nothing is left to append and the follower's log runs past `prevLogIdx`, the tail is kept (`keep_tail`: the
  caller puts back what pysyncobj cut), unless it holds a membership change (pysyncobj reverts those as it cuts);
- the commit index is capped at the last entry the message verified;
- a conflict at or below the follower's commit index is refused (`conflict`): a committed entry never changes, so
  one of the two logs lost what it acknowledged (a disk that lied about a sync, a restored copy), and the follower
  must not apply the other history on top of its own.

A snapshot the leader sends is dropped when the follower's log already holds the entry it ends with
(`snapshot_is_held`): pysyncobj installs any snapshot by clearing the log, so a second copy of one the leader had
already sent (it sends again until the follower's answer arrives) erased the entries the follower had appended and
acknowledged since the first, and the leader counted them as held there (seen in the Raft simulation: an acknowledged
entry lost). Raft keeps the entries after a snapshot's last one when the log holds it; with nothing to add, the
follower drops it (the leader goes on from the snapshot's end whatever the answer).

A leader appends a membership change only when every earlier one is committed (`uncommitted_membership_change`):
pysyncobj 0.3.17 has that guard, but never arms it, so a leader cut off from its followers appended two joins, and
the two new members with it made a majority of the five-member configuration while the two cut off made one of the
old configuration.

A follower that rejects an append tells the leader to go back to just after its commit index at once
(`rejection_hint`), not one entry per round trip.

Pure: the log is any sequence of (command, index, term) entries, as pysyncobj's journals are.
"""
from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass

from pysyncobj import pickle as raft_pickle

MEMBERSHIP_COMMAND = 2  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP: the first byte of a membership change entry

Entry = tuple[bytes, int, int]  # (command, index, term)


@dataclass(frozen=True)
class AppendCheck:
    """What to deliver to pysyncobj: `message` (None: refused, see `conflict`); `keep_tail`: the follower's entries
    after index `tail_from - 1` are not to be cut."""

    message: dict | None
    keep_tail: bool = False
    tail_from: int = 0
    conflict: str = ""


def is_regular_append(message: object) -> bool:
    """An append_entries message carrying whole entries (not a snapshot chunk, not a part of a large entry)."""
    return (isinstance(message, dict) and message.get("type") == "append_entries" and "prevLogIdx" in message
            and "transmission" not in message and "serialized" not in message)


def check_append(log: Sequence[Entry], commit_index: int, message: dict, *, current_term: int) -> AppendCheck:
    """The message pysyncobj should handle for `log` (see the module docstring). A message of a term before the
    member's `current_term` passes unchanged: it comes from a deposed leader, and pysyncobj ignores it."""
    if not log or not is_regular_append(message) or message.get("term", 0) < current_term:
        return AppendCheck(message)
    first, last = log[0][1], log[-1][1]

    def term_at(index: int) -> int | None:
        return log[index - first][2] if first <= index <= last else None

    prev, prev_term = message["prevLogIdx"], message["prevLogTerm"]
    if term_at(prev) != prev_term:
        return AppendCheck(message)  # pysyncobj refuses it, and the leader goes back
    entries = list(message.get("entries", ()))
    while entries and term_at(entries[0][1]) == entries[0][2]:
        _, prev, prev_term = entries.pop(0)
    if entries and entries[0][1] <= min(last, commit_index):
        index, term = entries[0][1], entries[0][2]
        return AppendCheck(None, conflict=f"the leader's entry {index} (term {term}) conflicts with this member's "
                                          f"committed entry {index} (term {term_at(index)})")
    verified = entries[-1][1] if entries else prev
    checked = {**message, "prevLogIdx": prev, "prevLogTerm": prev_term, "entries": entries,
               "commit_index": min(message.get("commit_index", 0), verified)}
    keep_tail = not entries and prev < last and not any(
        _is_membership(entry) for entry in log[prev + 1 - first:])
    return AppendCheck(checked, keep_tail=keep_tail, tail_from=prev + 1)


def _is_membership(entry: Entry) -> bool:
    command = entry[0]
    return bool(command) and command[0] == MEMBERSHIP_COMMAND


def snapshot_is_held(log: Sequence[Entry], dump: bytes) -> bool:
    """Whether `log` holds the entry (same index and term) a complete snapshot (a full dump file's bytes) ends with,
    or begins after it (the member's own dump, of entries it applied, so committed, is newer)."""
    if not log:
        return False
    _, last, _, _ = raft_pickle.loads(gzip.decompress(dump))
    position = last[1] - log[0][1]
    if position < 0:
        return True
    return position < len(log) and log[position][1] == last[1] and log[position][2] == last[2]


def uncommitted_membership_change(log: Sequence[Entry], commit_index: int) -> int | None:
    """The index of a membership change in `log` after `commit_index`, if there is one.

    A leader may append a membership change only when none is: Raft's single-server changes are safe one at a time,
    each committed before the next begins (two in flight let two disjoint majorities form)."""
    for entry in reversed(log):
        if entry[1] <= commit_index:
            return None
        if _is_membership(entry):
            return entry[1]
    return None


def rejection_hint(log: Sequence[Entry], commit_index: int, next_index: int) -> int:
    """Where the leader should go on with a follower that rejected its append (pysyncobj's `next_node_idx`, reset):
    at most just after the follower's commit index, every entry up to which the leader holds too.

    pysyncobj answers the entry it probed (a mismatch) or its log's end (a short log); the leader then steps back one
    entry per round trip while it also sends ahead (it advances its next index as it sends), so when a round trip
    takes longer than its append period, the replies to those sends keep resetting it forward: it never reached a
    follower whose log ended in a few entries of a deposed leader's (seen in the Raft simulation). A committed entry is
    in every later leader's log, and so is the first entry of the follower's log (its dump's last, applied), so the
    leader matches there at once, or sends its snapshot."""
    if not log:
        return next_index
    held = max(commit_index, log[0][1])
    return min(next_index, held + 1)
