"""Embedding Atlas (Apple's ``embedding-atlas``) as the Token atlas page's interactive map, offline.

Why its standalone server and not its Streamlit component: the component (``embedding_atlas.streamlit``) builds
duckdb-wasm's bundle URLs on ``cdn.jsdelivr.net`` at run time, hard-coded in its minified JavaScript, so offline it
stays blank; the standalone app (``embedding_atlas/static``) ships its assets, and with ``--duckdb server`` the
browser never holds the table: every histogram, count and search is a SQL query answered by DuckDB in the server
process. So each table gets one server **process** (:func:`serve`) bound to 127.0.0.1 on a free port, started once
and reused across reruns, at most :data:`MAX_SERVERS` alive (the least recently used one stopped first), all
stopped when Streamlit exits (and each stops itself when its parent is gone). The page shows it in an iframe.

Its map needs WebGPU with the ``shader-f16`` feature. :func:`webgpu_support` asks the browser (a
``st.components.v2`` component running ``navigator.gpu.requestAdapter()`` in the page) and
:func:`show_embedding_atlas` shows the atlas only where the map can render, otherwise one sentence saying so (the
page then shows its density view), unless ``anyway`` (the table, histograms and SQL work without WebGPU).

The iframe points at ``http://127.0.0.1:<port>/``: the server's own address. It works when the browser runs on the
machine that runs Streamlit, or through a port forward of that port too (``ssh -L``); ``LAYERLENS_ATLAS_URL``
(e.g. ``http://myhost:{port}/``) names another address for the browser. Streamlit cannot proxy another server.

Run by hand: ``python -m ui.embedding_atlas TABLE.parquet --port 5055`` (``--duckdb wasm`` for the in-browser
database).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

MAX_SERVERS = int(os.environ.get("LAYERLENS_ATLAS_SERVERS", "2"))
START_TIMEOUT = 300.0
NO_WEBGPU = ("Embedding Atlas's map needs WebGPU with the shader-f16 feature, which this browser lacks ({reason}): "
             "the density view below is shown instead.")
ROOT = Path(__file__).resolve().parent.parent
NOT_INSTALLED = "not installed: pip install \"layerlens[atlas]\" adds it (an optional extra)"


def installed() -> bool:
    """Whether Embedding Atlas (the optional ``atlas`` extra, requirements-atlas.txt) is installed."""
    import importlib.util

    return importlib.util.find_spec("embedding_atlas") is not None


# --- the server process --------------------------------------------------------------------------------------------

def serve(table: Path, port: int, text: str | None = "text", duckdb: str = "server", host: str = "127.0.0.1",
          parent: int | None = None, token: str | None = None) -> None:
    """Serve ``table`` (a parquet with ``x``, ``y``, ``row``) on ``host:port`` until killed (or ``parent`` exits),
    behind :class:`ui.atlas_guard.Guard` (only ``/<token>/...`` with a local Host) and with DuckDB opened by
    :func:`ui.atlas_guard.connect` (reads only, bounded memory)."""
    import pandas as pd
    import uvicorn
    from embedding_atlas import server as atlas_server
    from embedding_atlas.data_source import DataSource
    from embedding_atlas.options import make_embedding_atlas_props
    from platformdirs import user_cache_path

    from ui import atlas_guard

    frame = pd.read_parquet(table)
    if "row" not in frame.columns:
        frame["row"] = range(len(frame))
    props = make_embedding_atlas_props(row_id="row", x="x", y="y",
                                       text=text if text in frame.columns else None)
    stat = table.stat()
    source = DataSource(f"layerlens-{table.resolve()}-{stat.st_mtime_ns}-{stat.st_size}", frame, {"props": props})
    static = Path(__import__("embedding_atlas").__file__).parent / "static"
    atlas_server.make_duckdb_connection = atlas_guard.connect  # the package opens its DuckDB through this name
    app = atlas_server.make_server(source, static_path=str(static), duckdb_uri=duckdb)
    app = atlas_guard.Guard(app, token or atlas_guard.new_token(), atlas_guard.allowed_hosts(),
                            user_cache_path("embedding_atlas"))
    if parent:
        def watch() -> None:
            while True:
                time.sleep(1.0)
                if os.getppid() != parent:
                    os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")


def free_port(avoid: set[int] | frozenset[int] = frozenset()) -> int:
    """A port free now (the system's choice), none of ``avoid``."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


@dataclasses.dataclass
class Server:
    table: Path
    port: int
    process: subprocess.Popen
    log: Path
    started: float
    ready_seconds: float | None = None
    used: float = 0.0
    token: str = ""

    @property
    def url(self) -> str:
        """The address the browser opens (``LAYERLENS_ATLAS_URL`` with ``{port}``, default 127.0.0.1), with the
        server's token as the first segment of the path."""
        base = os.environ.get("LAYERLENS_ATLAS_URL", "http://127.0.0.1:{port}/").format(port=self.port)
        return base.rstrip("/") + "/" + (f"{self.token}/" if self.token else "")

    @property
    def local(self) -> str:
        return f"http://127.0.0.1:{self.port}/" + (f"{self.token}/" if self.token else "")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def rss_bytes(self) -> int | None:
        """The server process's resident memory (Linux ``/proc``), None when unknown."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def wait_ready(self, timeout: float = START_TIMEOUT) -> Server:
        """Block until the server answers its metadata, or raise with the end of its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Embedding Atlas's server stopped (exit {self.process.returncode}): "
                                   + tail(self.log))
            try:
                with urllib.request.urlopen(self.local + "data/metadata.json", timeout=2) as r:
                    if r.status == 200:
                        self.ready_seconds = self.ready_seconds or time.monotonic() - self.started
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Embedding Atlas's server did not answer within {timeout:.0f} s: " + tail(self.log))


def tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def log_dir() -> Path:
    from analysis.core.home import cache_dir

    folder = cache_dir() / "embedding_atlas"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_ports_given: set[int] = set()


def start(table: Path | str, text: str | None = "text", duckdb: str = "server", port: int | None = None) -> Server:
    """A new server process for ``table`` (not waited for: :meth:`Server.wait_ready`)."""
    from ui.atlas_guard import new_token

    table = Path(table).resolve()
    # never a port this process gave a server before: a frame still open on a stopped server must not reach a new
    # one that took its port (its ping would answer, and the frame would never say its map was stopped)
    port = port or free_port(_ports_given)
    _ports_given.add(port)
    folder = log_dir()
    log = folder / f"server-{port}.log"
    token = new_token()  # in the environment, not the command line (which other users can read)
    env = dict(os.environ, XDG_CACHE_HOME=str(folder / "xdg"),  # its own cache (platformdirs), not ~/.cache
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               LAYERLENS_ATLAS_TOKEN=token)
    args = [sys.executable, "-m", "ui.embedding_atlas", str(table), "--port", str(port), "--duckdb", duckdb,
            "--parent", str(os.getpid())] + (["--text", text] if text else ["--no-text"])
    with open(log, "wb") as out:
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    return Server(table, port, process, log, time.monotonic(), token=token)


_servers: dict[tuple, Server] = {}
_lock = threading.Lock()


def server_for(table: Path | str, text: str | None = "text", duckdb: str = "server",
               timeout: float = START_TIMEOUT) -> Server:
    """The running server of ``table`` (as it is on disk now), started when there is none; at most
    :data:`MAX_SERVERS` are kept, the least recently used stopped first."""
    table = Path(table).resolve()
    stat = table.stat()
    key = (str(table), stat.st_mtime_ns, stat.st_size, text, duckdb)
    with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive():
            _servers.pop(key)
            server = None
        if server is None:
            for old_key in [k for k in _servers if k[0] == key[0]]:  # an older version of the same table
                _servers.pop(old_key).stop()
            while len(_servers) >= max(MAX_SERVERS, 1):
                _servers.pop(min(_servers, key=lambda k: _servers[k].used)).stop()
            server = _servers[key] = start(table, text, duckdb)
        server.used = time.monotonic()
    try:
        return server.wait_ready(timeout)
    except Exception:
        with _lock:
            if _servers.get(key) is server:
                _servers.pop(key)
        raise


def stop_all() -> None:
    with _lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


atexit.register(stop_all)


# --- in the page -------------------------------------------------------------------------------------------------

PROBE_JS = """
export default function (component) {
  const { data, parentElement, setStateValue, setTriggerValue } = component;
  const d = data || {};
  let box = parentElement.querySelector(".ll-atlas");
  if (!box) { box = document.createElement("div"); box.className = "ll-atlas"; parentElement.appendChild(box); }
  const note = (text, extra) => {
    const p = document.createElement("p"); p.className = "ll-atlas-note" + (extra ? " " + extra : "");
    p.textContent = text; box.appendChild(p);
  };
  const unwatch = () => { if (box._llWatch) clearInterval(box._llWatch); box._llWatch = null; box._llWatchUrl = null; };
  const stopped = () => {  // the frame's server is gone (stopped for another map, or ended): say so, offer to reopen
    unwatch(); box.innerHTML = ""; note(d.stopped, "ll-atlas-stopped");
    const b = document.createElement("button"); b.className = "ll-atlas-reopen"; b.textContent = "Reopen the map";
    b.onclick = () => { b.disabled = true; b.textContent = "Reopening…"; setTriggerValue("reopen", Date.now()); };
    box.appendChild(b);
  };
  const watch = (url, frame) => {  // a HEAD to the frame's server every few seconds; once it has answered (the
    unwatch();                      // frame loaded, or a HEAD came back), a failure means it is gone
    let answered = false;
    frame.addEventListener("load", () => { answered = true; });
    box._llWatchUrl = url;
    box._llWatch = setInterval(() => {
      fetch(url, { method: "HEAD", mode: "no-cors", cache: "no-store" }).then(
        () => { answered = true; }, () => { if (answered && box._llWatchUrl === url) stopped(); });
    }, d.ping_ms);
  };
  const show = (gpu) => {
    const ok = gpu.webgpu && gpu.shader_f16;
    if (d.url && (ok || d.anyway)) {
      let frame = box.querySelector("iframe");
      if (!frame || frame.getAttribute("src") !== d.url) {
        box.innerHTML = "";
        if (!ok) note(d.partial.replace("{reason}", gpu.reason));
        frame = document.createElement("iframe");
        frame.setAttribute("src", d.url); frame.setAttribute("title", "Embedding Atlas");
        frame.style.width = "100%"; frame.style.height = d.height + "px"; frame.style.border = "0";
        box.appendChild(frame);
      }
      if (box._llWatchUrl !== d.url) watch(d.url, frame);
    } else if (!ok) {
      unwatch(); box.innerHTML = ""; note(d.message.replace("{reason}", gpu.reason));
    } else {
      unwatch(); box.textContent = "";
    }
  };
  const probe = async () => {
    if (!navigator.gpu) return { webgpu: false, shader_f16: false, reason: "no navigator.gpu" };
    try {
      const adapter = await navigator.gpu.requestAdapter();
      if (!adapter) return { webgpu: false, shader_f16: false, reason: "no WebGPU adapter" };
      const f16 = adapter.features.has("shader-f16");
      return { webgpu: true, shader_f16: f16, reason: f16 ? "" : "the WebGPU adapter has no shader-f16" };
    } catch (e) {
      return { webgpu: false, shader_f16: false, reason: "requestAdapter failed: " + e };
    }
  };
  probe().then((gpu) => {
    box.dataset.webgpu = String(gpu.webgpu && gpu.shader_f16);
    if (JSON.stringify(gpu) !== JSON.stringify(d.known || null)) setStateValue("gpu", gpu);
    show(gpu);
  });
  return unwatch;
}
"""
CSS = (".ll-atlas-note { margin: 0.25rem 0 0.5rem 0; color: var(--st-text-color); } "
       ".ll-atlas-reopen { padding: 0.25rem 0.75rem; border-radius: 0.5rem; border: 1px solid var(--st-border-color); "
       "background: var(--st-secondary-background-color); color: var(--st-text-color); cursor: pointer; }")
PARTIAL = ("Embedding Atlas's map needs WebGPU with the shader-f16 feature, which this browser lacks ({reason}): "
           "its table, histograms and search work, its map does not.")
STOPPED = ("This map's server has stopped: at most {servers} Embedding Atlas server(s) run at once on this machine, "
           "and a map opened since (in this or another browser tab) took its place, or the server ended. Reopen the "
           "map to start it again.")
PING_MS = 3000  # how often the frame asks its server whether it still runs (a HEAD of the app's page)

_component = None


def _mount():
    global _component
    if _component is None:
        import streamlit as st

        _component = st.components.v2.component("layerlens_embedding_atlas", js=PROBE_JS, css=CSS)
    return _component


def webgpu_support(key: str) -> dict | None:
    """What the browser said on an earlier run of this key: ``{"webgpu", "shader_f16", "reason"}``, or None
    before it answered (the first run of a session; its answer reruns the page)."""
    import streamlit as st

    state = st.session_state.get(key)
    gpu = state.get("gpu") if hasattr(state, "get") else None
    return dict(gpu) if isinstance(gpu, dict) else None


def lacks_webgpu(gpu: dict | None) -> str | None:
    """Why the browser that answered ``gpu`` (:func:`webgpu_support`) cannot draw the atlas's map, or None: it can,
    or it has not answered yet."""
    if gpu is None or (gpu.get("webgpu") and gpu.get("shader_f16")):
        return None
    return gpu.get("reason") or "no WebGPU"


@dataclasses.dataclass
class Shown:
    """What :func:`show_embedding_atlas` put on the page: ``renderer`` is ``"embedding-atlas"`` (the map can
    render), ``"embedding-atlas-table"`` (shown without its map, ``anyway``), ``"none"`` (WebGPU missing: the
    page shows its density view) or ``"probing"`` (the browser has not answered yet)."""

    renderer: str
    gpu: dict | None
    url: str | None = None
    message: str | None = None


def show_embedding_atlas(table: Path | str, key: str, height: int = 700, text: str | None = "text",
                         anyway: bool = False) -> Shown:
    """Embedding Atlas over ``table`` (:func:`analysis.tokens.atlas_table.atlas_table`'s parquet) in the page,
    where the browser has WebGPU with shader-f16 (or ``anyway``); otherwise one sentence saying why not."""
    import streamlit as st

    gpu = webgpu_support(key)
    ok = gpu is not None and lacks_webgpu(gpu) is None
    url = None
    if gpu is not None and (ok or anyway):
        with st.spinner("Starting Embedding Atlas's server…", show_time=True):
            url = server_for(table, text=text).url
    data = {"url": url, "height": int(height), "anyway": bool(anyway), "known": gpu, "message": NO_WEBGPU,
            "partial": PARTIAL, "stopped": STOPPED.format(servers=max(MAX_SERVERS, 1)), "ping_ms": PING_MS}

    # "reopen" (the frame's button once its server stopped) only reruns the page: server_for starts it again
    _mount()(data=data, key=key, on_gpu_change=lambda: None, on_reopen_change=lambda: None)
    if gpu is None:
        return Shown("probing", None)
    if ok:
        return Shown("embedding-atlas", gpu, url)
    message = NO_WEBGPU.format(reason=lacks_webgpu(gpu))
    return Shown("embedding-atlas-table" if anyway else "none", gpu, url, message)


# --- python -m ui.embedding_atlas ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a token map table with Embedding Atlas on 127.0.0.1.")
    parser.add_argument("table", type=Path)
    parser.add_argument("--port", type=int, default=5055)
    parser.add_argument("--text", default="text")
    parser.add_argument("--no-text", dest="text", action="store_const", const=None)
    parser.add_argument("--duckdb", default="server", choices=["server", "wasm"])
    parser.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    from ui.atlas_guard import new_token

    token = os.environ.get("LAYERLENS_ATLAS_TOKEN") or new_token()
    print(json.dumps({"table": str(a.table), "port": a.port, "duckdb": a.duckdb}), flush=True)
    if "LAYERLENS_ATLAS_TOKEN" not in os.environ:  # run by hand: the address to open
        print(f"open http://127.0.0.1:{a.port}/{token}/", flush=True)
    serve(a.table, a.port, text=a.text, duckdb=a.duckdb, parent=a.parent, token=token)


if __name__ == "__main__":
    main()
