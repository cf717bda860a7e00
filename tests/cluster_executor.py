"""An Executor whose statements run as the cluster itself unless told otherwise: for tests of what statements do,
not of who may run them (the product's entry points take a principal with no default)."""
from __future__ import annotations

from coordinator.core.auth import CLUSTER
from cql.executor import Executor


class ClusterExecutor(Executor):
    def execute(self, *args, principal=CLUSTER, **kwargs):
        return super().execute(*args, principal=principal, **kwargs)

    def answer(self, *args, principal=CLUSTER, **kwargs):
        return super().answer(*args, principal=principal, **kwargs)

    def execute_pages(self, *args, principal=CLUSTER, **kwargs):
        return super().execute_pages(*args, principal=principal, **kwargs)
