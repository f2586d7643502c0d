#!/usr/bin/env python
"""Django's command-line utility for the knowledge base."""

import sys


def main() -> None:
    from kb.cli import run_management

    run_management(sys.argv)


if __name__ == "__main__":
    main()
