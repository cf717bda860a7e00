"""Where a batch's view rows go: the paired replica of the view tablet owning each row, a moving one's pending too."""
from __future__ import annotations

import pyarrow as pa

from coordinator.core.migrations import STREAMING, USE_NEW, TabletTransition
from coordinator.core.schema import Replica
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN
from worker.build_job import by_destination

N1, N2, N3, N4 = (Replica(f"n{i}", 0) for i in range(1, 5))


def _view_rows(tokens: list[int]) -> pa.Table:
    return pa.table({"token": pa.array(tokens, pa.int64()), "c_k": pa.array(range(len(tokens)), pa.int32())})


def _keys_by_replica(parts: dict[Replica, pa.Table]) -> dict[Replica, list[int]]:
    return {replica: part.column("c_k").to_pylist() for replica, part in parts.items()}


def test_view_rows_whose_tablets_share_their_replicas_go_whole_to_them():
    rows = _view_rows([MIN_TOKEN, -1, 0, MAX_TOKEN])
    same = (N1, Replica("n2", 1))
    parts = by_destination(rows, (same, same, same, same), pair=1)
    assert parts == {Replica("n2", 1): rows}
    assert by_destination(rows.slice(0, 0), (same,) * 4, pair=1) == {}


def test_view_rows_go_to_the_paired_replica_of_the_view_tablet_owning_each_row():
    rows = _view_rows([MIN_TOKEN, -1, 0, MAX_TOKEN])
    replicas = ((N1,), (N2,), (N1,), (Replica("n3", 1),))
    assert _keys_by_replica(by_destination(rows, replicas, pair=0)) == {N1: [0, 2], N2: [1], Replica("n3", 1): [3]}


def test_the_rows_of_a_view_tablet_being_streamed_also_go_to_its_pending_replica():
    rows = _view_rows([MIN_TOKEN, -1, 0, MAX_TOKEN])
    replicas = ((N1,), (N2,), (N1,), (N3,))
    moving = TabletTransition("m1", "view", 1, leaving=N2, pending=N4, stage=STREAMING)
    parts = by_destination(rows, replicas, pair=0, moves={1: moving})
    assert _keys_by_replica(parts) == {N1: [0, 2], N2: [1], N4: [1], N3: [3]}


def test_once_a_moving_view_tablet_writes_only_to_its_new_replica_its_rows_leave_the_old_one_out():
    rows = _view_rows([MIN_TOKEN, -1, 0, MAX_TOKEN])
    replicas = ((N1,), (N2,), (N1,), (N3,))
    moved = TabletTransition("m1", "view", 1, leaving=N2, pending=N4, stage=USE_NEW)
    assert _keys_by_replica(by_destination(rows, replicas, pair=0, moves={1: moved})) == {
        N1: [0, 2], N4: [1], N3: [3]}
