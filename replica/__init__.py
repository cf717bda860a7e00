"""The replica role: local rows, view updates and their outbox, the write and read paths between replicas."""
