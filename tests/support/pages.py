"""The dashboard under Streamlit's AppTest, opened as a browser opens it."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.sidebar import KEY_MODEL, KEY_OTHER, OTHER

TIMEOUT = 120
ROOT = Path(__file__).resolve().parents[2]


def run_page(path: str, model: str | None = None) -> AppTest:
    """Open the app at its entry point (as a browser does), then go to ``path``."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    if model is not None:
        at.session_state[KEY_MODEL] = OTHER
        at.session_state[KEY_OTHER] = model
    at.run()
    if path != "app.py":
        at.switch_page(path).run()
    return at


