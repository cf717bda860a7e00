"""User tools: the `vbc` command line, its rendering, the client library, the local cluster manager, `vbc load` and the demo."""
