"""``layerlens dashboard``: the Streamlit app, from a clone or from the installed package (``pip install .``).

The app (``app.py``, ``pages/``, ``ui/``) sits beside this ``cli`` package: in the clone's top level, or in the
installed package set. Its server settings are ``ui/streamlit.toml`` (the clone's ``.streamlit/config.toml`` is
a link to it), passed as flags so an installed copy runs with the same settings from any folder; list-valued
settings (the file watcher's blacklist, used only with ``--dev``) are left to Streamlit's own config files.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from cli.common import UserError


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8501, help="the port on 127.0.0.1 (default 8501)")
    p.add_argument("--dev", action="store_true", help="watch the source files: an edit reloads the page")


def app_root() -> Path:
    """The folder holding ``app.py`` beside ``pages/``, ``ui/`` and this package: the clone's top level, or the
    installed package set's (``pip install .`` puts them side by side, as in the repository)."""
    root = Path(__file__).resolve().parents[1]
    needed = (root / "app.py", root / "pages", root / "ui" / "streamlit.toml")
    if not all(p.exists() for p in needed):
        raise UserError("the dashboard's files (app.py, pages/, ui/) were not found beside the cli package: run "
                        "from a clone of LayerLens or install it with `pip install .`")
    return root


def settings_flags(path: Path) -> list[str]:
    """``--section.key=value`` for every scalar setting of a Streamlit config file, except those set by an
    environment variable (``STREAMLIT_SERVER_FILE_WATCHER_TYPE=auto``: a flag would override it)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import toml as tomllib  # type: ignore[no-redef]  (a dependency of Streamlit there)
    with path.open("rb") as f:
        config = tomllib.load(f)
    flags = []
    for section, values in config.items():
        for key, value in values.items():
            variable = "STREAMLIT_" + re.sub(r"(?<!^)([A-Z])", r"_\1", f"{section}_{key}").upper()
            if not isinstance(value, list) and variable not in os.environ:
                flags.append(f"--{section}.{key}={str(value).lower() if isinstance(value, bool) else value}")
    return flags


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Start the dashboard (replaces this process with Streamlit's server)."""
    root = app_root()
    flags = settings_flags(root / "ui" / "streamlit.toml") + [f"--server.port={args.port}"]
    if args.dev:  # the watcher on, and the file's "none" left out
        flags = [f for f in flags if not f.startswith("--server.fileWatcherType=")]
        flags += ["--server.fileWatcherType=auto", "--server.runOnSave=true"]
    command = [sys.executable, "-m", "streamlit", "run", str(root / "app.py"), *flags]
    sys.stdout.flush()
    os.execv(sys.executable, command)
    return 0  # not reached
