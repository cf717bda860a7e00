"""`python -m vbc`: the vbc command line."""
import sys

from vbc.cli import main

if __name__ == "__main__":
    sys.exit(main())
