"""``pip install .`` (not editable) gives a working ``layerlens`` command, and ``layerlens dashboard`` serves the
app from the installed package, from a folder outside the clone (issue 35)."""

import os
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_pip_install_gives_the_cli_and_the_dashboard_from_the_installed_package(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    # the dependencies are this environment's (no second download of torch): a .pth file points at them
    Path(own, "deps.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(ROOT)], check=True, cwd=tmp_path)
    installed = Path(own)
    for part in ("layerlens/app.py", "layerlens/pages/1_Reconstruction.py", "layerlens/ui/streamlit.toml",
                 "layerlens/cli/main.py", "layerlens/jobs/worker.py", "analysis/data/demo_sentiment.csv",
                 "analysis/heads/resume.py", "models/demo/model.safetensors"):
        assert (installed / part).is_file(), part
    # issue 43 item 16: nothing but layerlens, analysis and models at the top of site-packages
    ours = {p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", ".pth")) and
            p.name not in ("_distutils_hack", "pip", "setuptools", "pkg_resources", "__pycache__", "_virtualenv.py")}
    assert ours == {"layerlens", "analysis", "models"}, ours
    env = {**os.environ, "LAYERLENS_HOME": str(tmp_path / "home"), "PYTHONPATH": ""}
    done = subprocess.run([python, "-m", "analysis", "info", "--model", "demo"], capture_output=True, text=True,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0 and "family        bert" in done.stdout, done.stderr
    script = venv / "bin" / "layerlens"
    done = subprocess.run([script, "info", "--model", "demo"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0 and "family        bert" in done.stdout, done.stderr
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([script, "dashboard", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the installed dashboard never answered")
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert str(installed / "layerlens" / "app.py").encode() in command  # the installed app, not the clone's
        assert b"--server.address=127.0.0.1" in command and b"--server.maxUploadSize=50" in command
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def test_the_package_list_names_every_package_folder():
    """pyproject.toml lists the packages by hand (the top folder is mapped to ``layerlens``): every folder with an
    ``__init__.py`` under analysis, models, cli, jobs and ui is in it, so a new technique is never left out."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT).parent.parts) for top in ("analysis", "models", "cli", "jobs", "ui")
             for p in (ROOT / top).rglob("__init__.py") if "demo" not in p.parts}
    found = {f"layerlens.{name}" if name.split(".")[0] in ("cli", "jobs", "ui") else name for name in found}
    assert found | {"layerlens", "layerlens.pages"} == listed
