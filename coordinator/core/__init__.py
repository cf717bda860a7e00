"""The pure, deterministic core of group0: standard library only, no I/O, no clock, no randomness."""
