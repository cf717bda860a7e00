"""The view building worker: the node-local executor of view building tasks."""
