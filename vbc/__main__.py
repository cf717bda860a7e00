"""`vbc` and `python -m vbc`: the command line; `vbc demo` goes to vbc.demo, which has its own parser."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # `vbc demo --rows N ...`
        from vbc import demo

        return demo.main(argv[1:])
    from vbc import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
