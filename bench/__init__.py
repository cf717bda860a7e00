"""Benchmarks (not tests): write path and Raft commit latency."""
