"""``python -m intdet.cli``: the same command line as ``intdet``."""

from . import main

if __name__ == "__main__":
    main()
