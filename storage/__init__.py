"""Per-node storage of tablet replicas: last-write-wins rows (cells, pure) and their SQL database (store)."""
