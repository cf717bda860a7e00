"""The cluster's control plane: the replicated group0 state (pure core) and its Raft adapter."""
