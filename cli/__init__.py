"""The command line (``layerlens``; :mod:`cli.main`). Installed, this package is ``layerlens.cli`` (pyproject.toml)."""


import os as _os
import sys as _sys
from pathlib import Path as _Path

if __name__ == "layerlens.cli":  # installed (pip install .): cli, jobs and ui live in the layerlens folder only
    _HOME = str(_Path(__file__).resolve().parents[1])
    if _HOME not in _sys.path:
        _sys.path.insert(0, _HOME)  # first: another project's top-level cli, jobs or ui never shadows ours
    _os.environ["PYTHONPATH"] = _os.pathsep.join([_HOME, *filter(None, [_os.environ.get("PYTHONPATH")])])
