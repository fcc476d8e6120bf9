"""``python -m intdet``: the same command line as ``intdet``."""

from .cli import main

if __name__ == "__main__":
    main()
