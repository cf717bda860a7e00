"""The node process: wiring of every role (the one place that starts Raft, gRPC and the loops) and the gRPC servicers."""
