from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("null", "int", "text", "boolean", "double")
    NULL_FIELD_NUMBER: _ClassVar[int]
    INT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BOOLEAN_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_FIELD_NUMBER: _ClassVar[int]
    null: bool
    int: int
    text: str
    boolean: bool
    double: float
    def __init__(self, null: _Optional[bool] = ..., int: _Optional[int] = ..., text: _Optional[str] = ..., boolean: _Optional[bool] = ..., double: _Optional[float] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class SessionAnswer(_message.Message):
    __slots__ = ("response", "error_code", "error_message")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    response: ExecuteResponse
    error_code: str
    error_message: str
    def __init__(self, response: _Optional[_Union[ExecuteResponse, _Mapping]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("statement", "page_size", "params", "prepared_id", "arrow_values", "paging_state", "arrow_results", "staged")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_VALUES_FIELD_NUMBER: _ClassVar[int]
    PAGING_STATE_FIELD_NUMBER: _ClassVar[int]
    ARROW_RESULTS_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    statement: str
    page_size: int
    params: _containers.RepeatedCompositeFieldContainer[Row]
    prepared_id: str
    arrow_values: bytes
    paging_state: bytes
    arrow_results: bool
    staged: bool
    def __init__(self, statement: _Optional[str] = ..., page_size: _Optional[int] = ..., params: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., prepared_id: _Optional[str] = ..., arrow_values: _Optional[bytes] = ..., paging_state: _Optional[bytes] = ..., arrow_results: _Optional[bool] = ..., staged: _Optional[bool] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("statement",)
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    statement: str
    def __init__(self, statement: _Optional[str] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("id", "bind_columns", "primary_key", "partition_key")
    ID_FIELD_NUMBER: _ClassVar[int]
    BIND_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    bind_columns: _containers.RepeatedCompositeFieldContainer[Column]
    primary_key: _containers.RepeatedScalarFieldContainer[str]
    partition_key: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., bind_columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., primary_key: _Optional[_Iterable[str]] = ..., partition_key: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("columns", "rows", "message", "paging_state", "arrow_rows", "plan")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PAGING_STATE_FIELD_NUMBER: _ClassVar[int]
    ARROW_ROWS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    message: str
    paging_state: bytes
    arrow_rows: bytes
    plan: str
    def __init__(self, columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., message: _Optional[str] = ..., paging_state: _Optional[bytes] = ..., arrow_rows: _Optional[bytes] = ..., plan: _Optional[str] = ...) -> None: ...

class PauseViewRequest(_message.Message):
    __slots__ = ("view", "paused")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    view: str
    paused: bool
    def __init__(self, view: _Optional[str] = ..., paused: _Optional[bool] = ...) -> None: ...

class PauseViewResponse(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class BuildConfigRequest(_message.Message):
    __slots__ = ("chunk_rows", "rate_rows_per_s", "parallel_bases")
    CHUNK_ROWS_FIELD_NUMBER: _ClassVar[int]
    RATE_ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_BASES_FIELD_NUMBER: _ClassVar[int]
    chunk_rows: int
    rate_rows_per_s: int
    parallel_bases: int
    def __init__(self, chunk_rows: _Optional[int] = ..., rate_rows_per_s: _Optional[int] = ..., parallel_bases: _Optional[int] = ...) -> None: ...

class BuildSettings(_message.Message):
    __slots__ = ("chunk_rows", "rate_rows_per_s", "parallel_bases")
    CHUNK_ROWS_FIELD_NUMBER: _ClassVar[int]
    RATE_ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_BASES_FIELD_NUMBER: _ClassVar[int]
    chunk_rows: int
    rate_rows_per_s: int
    parallel_bases: int
    def __init__(self, chunk_rows: _Optional[int] = ..., rate_rows_per_s: _Optional[int] = ..., parallel_bases: _Optional[int] = ...) -> None: ...

class BalancerRequest(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: str
    def __init__(self, action: _Optional[str] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("node", "replicas")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    node: str
    replicas: int
    def __init__(self, node: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class BalancerStatus(_message.Message):
    __slots__ = ("enabled", "loads", "migrations")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    loads: _containers.RepeatedCompositeFieldContainer[NodeLoad]
    migrations: int
    def __init__(self, enabled: _Optional[bool] = ..., loads: _Optional[_Iterable[_Union[NodeLoad, _Mapping]]] = ..., migrations: _Optional[int] = ...) -> None: ...

class JoinClusterRequest(_message.Message):
    __slots__ = ("node_id", "grpc", "raft", "shards")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc: str
    raft: str
    shards: int
    def __init__(self, node_id: _Optional[str] = ..., grpc: _Optional[str] = ..., raft: _Optional[str] = ..., shards: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "grpc", "raft")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    id: str
    grpc: str
    raft: str
    def __init__(self, id: _Optional[str] = ..., grpc: _Optional[str] = ..., raft: _Optional[str] = ...) -> None: ...

class JoinClusterResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class DecommissionRequest(_message.Message):
    __slots__ = ("node_id", "dead")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    dead: bool
    def __init__(self, node_id: _Optional[str] = ..., dead: _Optional[bool] = ...) -> None: ...

class NodeInfoRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "state", "replicas")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    replicas: int
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class ResizeTabletsRequest(_message.Message):
    __slots__ = ("table", "merge")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    table: str
    merge: bool
    def __init__(self, table: _Optional[str] = ..., merge: _Optional[bool] = ...) -> None: ...

class ResizeTabletsResponse(_message.Message):
    __slots__ = ("tablet_count", "target_count")
    TABLET_COUNT_FIELD_NUMBER: _ClassVar[int]
    TARGET_COUNT_FIELD_NUMBER: _ClassVar[int]
    tablet_count: int
    target_count: int
    def __init__(self, tablet_count: _Optional[int] = ..., target_count: _Optional[int] = ...) -> None: ...

class MoveTabletRequest(_message.Message):
    __slots__ = ("table", "tablet", "from_replica", "to_replica")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLET_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICA_FIELD_NUMBER: _ClassVar[int]
    table: str
    tablet: int
    from_replica: str
    to_replica: str
    def __init__(self, table: _Optional[str] = ..., tablet: _Optional[int] = ..., from_replica: _Optional[str] = ..., to_replica: _Optional[str] = ...) -> None: ...

class MoveTabletResponse(_message.Message):
    __slots__ = ("migration_id",)
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    migration_id: str
    def __init__(self, migration_id: _Optional[str] = ...) -> None: ...

class MigrationRequest(_message.Message):
    __slots__ = ("migration_id",)
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    migration_id: str
    def __init__(self, migration_id: _Optional[str] = ...) -> None: ...

class MigrationInfo(_message.Message):
    __slots__ = ("migration_id", "state", "stage", "reason", "table", "tablet", "leaving", "pending", "kind", "rows_streamed", "rows_per_s")
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLET_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROWS_STREAMED_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    migration_id: str
    state: str
    stage: str
    reason: str
    table: str
    tablet: int
    leaving: str
    pending: str
    kind: str
    rows_streamed: int
    rows_per_s: float
    def __init__(self, migration_id: _Optional[str] = ..., state: _Optional[str] = ..., stage: _Optional[str] = ..., reason: _Optional[str] = ..., table: _Optional[str] = ..., tablet: _Optional[int] = ..., leaving: _Optional[str] = ..., pending: _Optional[str] = ..., kind: _Optional[str] = ..., rows_streamed: _Optional[int] = ..., rows_per_s: _Optional[float] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("views_only",)
    VIEWS_ONLY_FIELD_NUMBER: _ClassVar[int]
    views_only: bool
    def __init__(self, views_only: _Optional[bool] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("id", "grpc", "raft", "alive", "shards", "schema_version", "pending_view_updates", "worker", "insecure")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    RAFT_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    PENDING_VIEW_UPDATES_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    id: str
    grpc: str
    raft: str
    alive: bool
    shards: int
    schema_version: int
    pending_view_updates: int
    worker: WorkerStats
    insecure: bool
    def __init__(self, id: _Optional[str] = ..., grpc: _Optional[str] = ..., raft: _Optional[str] = ..., alive: _Optional[bool] = ..., shards: _Optional[int] = ..., schema_version: _Optional[int] = ..., pending_view_updates: _Optional[int] = ..., worker: _Optional[_Union[WorkerStats, _Mapping]] = ..., insecure: _Optional[bool] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("spark_jobs", "tablet_scans", "rows_scanned", "tasks_finished", "tasks_answered_from_ledger", "batches_running", "batches_failed", "spark_state", "spark_error", "spark_start_s", "read_s", "spark_s", "merge_s", "failures", "view_rows_repaired", "throttled_s", "view_rows_kept")
    SPARK_JOBS_FIELD_NUMBER: _ClassVar[int]
    TABLET_SCANS_FIELD_NUMBER: _ClassVar[int]
    ROWS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    TASKS_ANSWERED_FROM_LEDGER_FIELD_NUMBER: _ClassVar[int]
    BATCHES_RUNNING_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FAILED_FIELD_NUMBER: _ClassVar[int]
    SPARK_STATE_FIELD_NUMBER: _ClassVar[int]
    SPARK_ERROR_FIELD_NUMBER: _ClassVar[int]
    SPARK_START_S_FIELD_NUMBER: _ClassVar[int]
    READ_S_FIELD_NUMBER: _ClassVar[int]
    SPARK_S_FIELD_NUMBER: _ClassVar[int]
    MERGE_S_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    VIEW_ROWS_REPAIRED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_S_FIELD_NUMBER: _ClassVar[int]
    VIEW_ROWS_KEPT_FIELD_NUMBER: _ClassVar[int]
    spark_jobs: int
    tablet_scans: int
    rows_scanned: int
    tasks_finished: int
    tasks_answered_from_ledger: int
    batches_running: int
    batches_failed: int
    spark_state: str
    spark_error: str
    spark_start_s: float
    read_s: float
    spark_s: float
    merge_s: float
    failures: _containers.RepeatedCompositeFieldContainer[BatchFailure]
    view_rows_repaired: int
    throttled_s: float
    view_rows_kept: int
    def __init__(self, spark_jobs: _Optional[int] = ..., tablet_scans: _Optional[int] = ..., rows_scanned: _Optional[int] = ..., tasks_finished: _Optional[int] = ..., tasks_answered_from_ledger: _Optional[int] = ..., batches_running: _Optional[int] = ..., batches_failed: _Optional[int] = ..., spark_state: _Optional[str] = ..., spark_error: _Optional[str] = ..., spark_start_s: _Optional[float] = ..., read_s: _Optional[float] = ..., spark_s: _Optional[float] = ..., merge_s: _Optional[float] = ..., failures: _Optional[_Iterable[_Union[BatchFailure, _Mapping]]] = ..., view_rows_repaired: _Optional[int] = ..., throttled_s: _Optional[float] = ..., view_rows_kept: _Optional[int] = ...) -> None: ...

class BatchFailure(_message.Message):
    __slots__ = ("view_id", "error", "attempts")
    VIEW_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    view_id: str
    error: str
    attempts: int
    def __init__(self, view_id: _Optional[str] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class ViewBuildError(_message.Message):
    __slots__ = ("node", "error", "attempts")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    error: str
    attempts: int
    def __init__(self, node: _Optional[str] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class ViewStatus(_message.Message):
    __slots__ = ("name", "base", "state", "tasks_total", "tasks_done", "progress", "hosts", "is_index", "rows_done", "rows_per_s", "eta_s", "errors", "held")
    class HostsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    IS_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROWS_DONE_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    name: str
    base: str
    state: str
    tasks_total: int
    tasks_done: int
    progress: float
    hosts: _containers.ScalarMap[str, str]
    is_index: bool
    rows_done: int
    rows_per_s: float
    eta_s: float
    errors: _containers.RepeatedCompositeFieldContainer[ViewBuildError]
    held: _containers.RepeatedCompositeFieldContainer[HeldViewRows]
    def __init__(self, name: _Optional[str] = ..., base: _Optional[str] = ..., state: _Optional[str] = ..., tasks_total: _Optional[int] = ..., tasks_done: _Optional[int] = ..., progress: _Optional[float] = ..., hosts: _Optional[_Mapping[str, str]] = ..., is_index: _Optional[bool] = ..., rows_done: _Optional[int] = ..., rows_per_s: _Optional[float] = ..., eta_s: _Optional[float] = ..., errors: _Optional[_Iterable[_Union[ViewBuildError, _Mapping]]] = ..., held: _Optional[_Iterable[_Union[HeldViewRows, _Mapping]]] = ...) -> None: ...

class HeldViewRows(_message.Message):
    __slots__ = ("holder", "target")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    holder: str
    target: str
    def __init__(self, holder: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("leader", "term", "nodes", "views", "answered_by", "schema_version", "migrations", "staging")
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    STAGING_FIELD_NUMBER: _ClassVar[int]
    leader: str
    term: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    views: _containers.RepeatedCompositeFieldContainer[ViewStatus]
    answered_by: str
    schema_version: int
    migrations: _containers.RepeatedCompositeFieldContainer[MigrationInfo]
    staging: _containers.RepeatedCompositeFieldContainer[StagedTable]
    def __init__(self, leader: _Optional[str] = ..., term: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., views: _Optional[_Iterable[_Union[ViewStatus, _Mapping]]] = ..., answered_by: _Optional[str] = ..., schema_version: _Optional[int] = ..., migrations: _Optional[_Iterable[_Union[MigrationInfo, _Mapping]]] = ..., staging: _Optional[_Iterable[_Union[StagedTable, _Mapping]]] = ...) -> None: ...

class StagedTable(_message.Message):
    __slots__ = ("table", "tasks", "replicas", "rows")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    table: str
    tasks: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    rows: int
    def __init__(self, table: _Optional[str] = ..., tasks: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., rows: _Optional[int] = ...) -> None: ...

class TabletsRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class TabletInfo(_message.Message):
    __slots__ = ("tablet", "first_token", "last_token", "replicas", "stage", "leaving", "pending", "migration_id", "reason")
    TABLET_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tablet: int
    first_token: int
    last_token: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    stage: str
    leaving: str
    pending: str
    migration_id: str
    reason: str
    def __init__(self, tablet: _Optional[int] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., stage: _Optional[str] = ..., leaving: _Optional[str] = ..., pending: _Optional[str] = ..., migration_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TabletsResponse(_message.Message):
    __slots__ = ("table", "tablets", "table_id")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLETS_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    table: str
    tablets: _containers.RepeatedCompositeFieldContainer[TabletInfo]
    table_id: str
    def __init__(self, table: _Optional[str] = ..., tablets: _Optional[_Iterable[_Union[TabletInfo, _Mapping]]] = ..., table_id: _Optional[str] = ...) -> None: ...

class InjectRequest(_message.Message):
    __slots__ = ("name", "action", "mode", "one_shot", "timeout")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ENABLE: _ClassVar[InjectRequest.Action]
        DISABLE: _ClassVar[InjectRequest.Action]
        WAIT_HIT: _ClassVar[InjectRequest.Action]
        LIST: _ClassVar[InjectRequest.Action]
    ENABLE: InjectRequest.Action
    DISABLE: InjectRequest.Action
    WAIT_HIT: InjectRequest.Action
    LIST: InjectRequest.Action
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ONE_SHOT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    action: InjectRequest.Action
    mode: str
    one_shot: bool
    timeout: float
    def __init__(self, name: _Optional[str] = ..., action: _Optional[_Union[InjectRequest.Action, str]] = ..., mode: _Optional[str] = ..., one_shot: _Optional[bool] = ..., timeout: _Optional[float] = ...) -> None: ...

class InjectionPoint(_message.Message):
    __slots__ = ("name", "enabled", "mode", "one_shot", "hits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ONE_SHOT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    name: str
    enabled: bool
    mode: str
    one_shot: bool
    hits: int
    def __init__(self, name: _Optional[str] = ..., enabled: _Optional[bool] = ..., mode: _Optional[str] = ..., one_shot: _Optional[bool] = ..., hits: _Optional[int] = ...) -> None: ...

class InjectResponse(_message.Message):
    __slots__ = ("hit", "points", "node", "injections_disabled")
    HIT_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INJECTIONS_DISABLED_FIELD_NUMBER: _ClassVar[int]
    hit: bool
    points: _containers.RepeatedCompositeFieldContainer[InjectionPoint]
    node: str
    injections_disabled: bool
    def __init__(self, hit: _Optional[bool] = ..., points: _Optional[_Iterable[_Union[InjectionPoint, _Mapping]]] = ..., node: _Optional[str] = ..., injections_disabled: _Optional[bool] = ...) -> None: ...

class StreamTabletRequest(_message.Message):
    __slots__ = ("term", "migration_id", "table_id", "first_token", "last_token", "source_node", "schema_version")
    TERM_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    term: int
    migration_id: str
    table_id: str
    first_token: int
    last_token: int
    source_node: str
    schema_version: int
    def __init__(self, term: _Optional[int] = ..., migration_id: _Optional[str] = ..., table_id: _Optional[str] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., source_node: _Optional[str] = ..., schema_version: _Optional[int] = ...) -> None: ...

class StreamTabletResponse(_message.Message):
    __slots__ = ("rows", "seconds")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    seconds: float
    def __init__(self, rows: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class CleanupTabletRequest(_message.Message):
    __slots__ = ("term", "migration_id", "table_id", "first_token", "last_token", "schema_version")
    TERM_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    term: int
    migration_id: str
    table_id: str
    first_token: int
    last_token: int
    schema_version: int
    def __init__(self, term: _Optional[int] = ..., migration_id: _Optional[str] = ..., table_id: _Optional[str] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., schema_version: _Optional[int] = ...) -> None: ...

class CleanupTabletResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class ReadTabletRowsRequest(_message.Message):
    __slots__ = ("table_id", "first_token", "last_token", "schema_version", "after_token", "batch_rows")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    AFTER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    first_token: int
    last_token: int
    schema_version: int
    after_token: int
    batch_rows: int
    def __init__(self, table_id: _Optional[str] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., schema_version: _Optional[int] = ..., after_token: _Optional[int] = ..., batch_rows: _Optional[int] = ...) -> None: ...

class TabletRowsPiece(_message.Message):
    __slots__ = ("ipc", "done", "rows")
    IPC_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ipc: bytes
    done: bool
    rows: int
    def __init__(self, ipc: _Optional[bytes] = ..., done: _Optional[bool] = ..., rows: _Optional[int] = ...) -> None: ...

class TabletStreamProgress(_message.Message):
    __slots__ = ("migration_id", "table_id", "source_node", "rows", "seconds", "rows_per_s")
    MIGRATION_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    migration_id: str
    table_id: str
    source_node: str
    rows: int
    seconds: float
    rows_per_s: float
    def __init__(self, migration_id: _Optional[str] = ..., table_id: _Optional[str] = ..., source_node: _Optional[str] = ..., rows: _Optional[int] = ..., seconds: _Optional[float] = ..., rows_per_s: _Optional[float] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("table_id", "first_token", "last_token", "schema_version", "include_tombstones")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    first_token: int
    last_token: int
    schema_version: int
    include_tombstones: bool
    def __init__(self, table_id: _Optional[str] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., schema_version: _Optional[int] = ..., include_tombstones: _Optional[bool] = ...) -> None: ...

class Cell(_message.Message):
    __slots__ = ("column", "value", "ts")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    column: str
    value: Value
    ts: int
    def __init__(self, column: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., ts: _Optional[int] = ...) -> None: ...

class Mutation(_message.Message):
    __slots__ = ("token", "key", "marker_ts", "tomb_ts", "cells")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MARKER_TS_FIELD_NUMBER: _ClassVar[int]
    TOMB_TS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    token: int
    key: _containers.RepeatedCompositeFieldContainer[Value]
    marker_ts: int
    tomb_ts: int
    cells: _containers.RepeatedCompositeFieldContainer[Cell]
    def __init__(self, token: _Optional[int] = ..., key: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., marker_ts: _Optional[int] = ..., tomb_ts: _Optional[int] = ..., cells: _Optional[_Iterable[_Union[Cell, _Mapping]]] = ...) -> None: ...

class MutationBatch(_message.Message):
    __slots__ = ("table_id", "shard", "mutations", "timestamp", "schema_version", "arrow_mutations", "staged")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARROW_MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    shard: int
    mutations: _containers.RepeatedCompositeFieldContainer[Mutation]
    timestamp: int
    schema_version: int
    arrow_mutations: bytes
    staged: bool
    def __init__(self, table_id: _Optional[str] = ..., shard: _Optional[int] = ..., mutations: _Optional[_Iterable[_Union[Mutation, _Mapping]]] = ..., timestamp: _Optional[int] = ..., schema_version: _Optional[int] = ..., arrow_mutations: _Optional[bytes] = ..., staged: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    def __init__(self, applied: _Optional[int] = ...) -> None: ...

class ReplicaOutcome(_message.Message):
    __slots__ = ("applied", "error_code", "error_message")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    applied: int
    error_code: str
    error_message: str
    def __init__(self, applied: _Optional[int] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table_id", "first_token", "last_token", "partition_key", "limit", "page_size", "has_after", "after_token", "after_key", "columns", "filters", "aggregates", "schema_version")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    HAS_AFTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AFTER_KEY_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    first_token: int
    last_token: int
    partition_key: _containers.RepeatedCompositeFieldContainer[Value]
    limit: int
    page_size: int
    has_after: bool
    after_token: int
    after_key: _containers.RepeatedCompositeFieldContainer[Value]
    columns: _containers.RepeatedScalarFieldContainer[str]
    filters: _containers.RepeatedCompositeFieldContainer[ScanFilter]
    aggregates: _containers.RepeatedCompositeFieldContainer[ScanAggregate]
    schema_version: int
    def __init__(self, table_id: _Optional[str] = ..., first_token: _Optional[int] = ..., last_token: _Optional[int] = ..., partition_key: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., limit: _Optional[int] = ..., page_size: _Optional[int] = ..., has_after: _Optional[bool] = ..., after_token: _Optional[int] = ..., after_key: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., columns: _Optional[_Iterable[str]] = ..., filters: _Optional[_Iterable[_Union[ScanFilter, _Mapping]]] = ..., aggregates: _Optional[_Iterable[_Union[ScanAggregate, _Mapping]]] = ..., schema_version: _Optional[int] = ...) -> None: ...

class ScanFilter(_message.Message):
    __slots__ = ("column", "op", "values")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    column: str
    op: str
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, column: _Optional[str] = ..., op: _Optional[str] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ScanAggregate(_message.Message):
    __slots__ = ("function", "column")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    function: str
    column: str
    def __init__(self, function: _Optional[str] = ..., column: _Optional[str] = ...) -> None: ...

class ScanRow(_message.Message):
    __slots__ = ("token", "values")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    token: int
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, token: _Optional[int] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ScanPage(_message.Message):
    __slots__ = ("rows", "arrow", "partials")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ARROW_FIELD_NUMBER: _ClassVar[int]
    PARTIALS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[ScanRow]
    arrow: bytes
    partials: _containers.RepeatedCompositeFieldContainer[Row]
    def __init__(self, rows: _Optional[_Iterable[_Union[ScanRow, _Mapping]]] = ..., arrow: _Optional[bytes] = ..., partials: _Optional[_Iterable[_Union[Row, _Mapping]]] = ...) -> None: ...

class LocalStatusRequest(_message.Message):
    __slots__ = ("state_digest",)
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    state_digest: bool
    def __init__(self, state_digest: _Optional[bool] = ...) -> None: ...

class LocalStatusResponse(_message.Message):
    __slots__ = ("node_id", "schema_version", "applied_index", "pending_view_updates", "term", "leader", "worker", "streams", "raft_secret_fingerprint", "insecure", "state_digest", "digest_applied_index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PENDING_VIEW_UPDATES_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    RAFT_SECRET_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    schema_version: int
    applied_index: int
    pending_view_updates: int
    term: int
    leader: str
    worker: WorkerStats
    streams: _containers.RepeatedCompositeFieldContainer[TabletStreamProgress]
    raft_secret_fingerprint: str
    insecure: bool
    state_digest: str
    digest_applied_index: int
    def __init__(self, node_id: _Optional[str] = ..., schema_version: _Optional[int] = ..., applied_index: _Optional[int] = ..., pending_view_updates: _Optional[int] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., worker: _Optional[_Union[WorkerStats, _Mapping]] = ..., streams: _Optional[_Iterable[_Union[TabletStreamProgress, _Mapping]]] = ..., raft_secret_fingerprint: _Optional[str] = ..., insecure: _Optional[bool] = ..., state_digest: _Optional[str] = ..., digest_applied_index: _Optional[int] = ...) -> None: ...

class ArrowChunk(_message.Message):
    __slots__ = ("table_id", "shard", "schema_version", "ipc", "rows")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    shard: int
    schema_version: int
    ipc: bytes
    rows: int
    def __init__(self, table_id: _Optional[str] = ..., shard: _Optional[int] = ..., schema_version: _Optional[int] = ..., ipc: _Optional[bytes] = ..., rows: _Optional[int] = ...) -> None: ...

class SchemaBarrierRequest(_message.Message):
    __slots__ = ("schema_version", "timeout", "schema_only", "view_updates")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ONLY_FIELD_NUMBER: _ClassVar[int]
    VIEW_UPDATES_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    timeout: float
    schema_only: bool
    view_updates: bool
    def __init__(self, schema_version: _Optional[int] = ..., timeout: _Optional[float] = ..., schema_only: _Optional[bool] = ..., view_updates: _Optional[bool] = ...) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ("term", "shard", "task_ids", "applied_index")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    term: int
    shard: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    applied_index: int
    def __init__(self, term: _Optional[int] = ..., shard: _Optional[int] = ..., task_ids: _Optional[_Iterable[str]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("finished_task_ids", "rows_scanned", "finished_rows_scanned")
    FINISHED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_ROWS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    finished_task_ids: _containers.RepeatedScalarFieldContainer[str]
    rows_scanned: int
    finished_rows_scanned: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, finished_task_ids: _Optional[_Iterable[str]] = ..., rows_scanned: _Optional[int] = ..., finished_rows_scanned: _Optional[_Iterable[int]] = ...) -> None: ...

class CheckViewRequest(_message.Message):
    __slots__ = ("view", "max_examples")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    view: str
    max_examples: int
    def __init__(self, view: _Optional[str] = ..., max_examples: _Optional[int] = ...) -> None: ...

class CheckDifference(_message.Message):
    __slots__ = ("kind", "replica", "key", "expected", "found")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    replica: str
    key: str
    expected: str
    found: str
    def __init__(self, kind: _Optional[str] = ..., replica: _Optional[str] = ..., key: _Optional[str] = ..., expected: _Optional[str] = ..., found: _Optional[str] = ...) -> None: ...

class CheckViewResponse(_message.Message):
    __slots__ = ("view", "base_rows", "view_rows", "missing", "extra", "different", "examples", "replicas_checked", "seconds", "state")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    BASE_ROWS_FIELD_NUMBER: _ClassVar[int]
    VIEW_ROWS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    DIFFERENT_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    view: str
    base_rows: int
    view_rows: int
    missing: int
    extra: int
    different: int
    examples: _containers.RepeatedCompositeFieldContainer[CheckDifference]
    replicas_checked: int
    seconds: float
    state: str
    def __init__(self, view: _Optional[str] = ..., base_rows: _Optional[int] = ..., view_rows: _Optional[int] = ..., missing: _Optional[int] = ..., extra: _Optional[int] = ..., different: _Optional[int] = ..., examples: _Optional[_Iterable[_Union[CheckDifference, _Mapping]]] = ..., replicas_checked: _Optional[int] = ..., seconds: _Optional[float] = ..., state: _Optional[str] = ...) -> None: ...
