"""The test suite: pure-core, storage, parser, Raft adapter, CLI and multi-process integration tests."""
