"""``python -m analysis``: the command line, the same as ``layerlens`` (:mod:`cli.main`)."""

import sys

try:  # installed (pip install .): the CLI is layerlens.cli; in a bare clone, the top-level cli package
    from layerlens.cli.main import main
except ModuleNotFoundError:
    from cli.main import main

sys.exit(main())
