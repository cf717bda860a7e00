"""The vbc node: statement execution, write and read paths, gRPC services, wiring and the command line."""
