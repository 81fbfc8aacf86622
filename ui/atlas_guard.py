"""What stands between Embedding Atlas's server (``embedding_atlas.server.make_server``, run by
:mod:`ui.embedding_atlas` in its own process on 127.0.0.1) and anyone who can reach its port.

The package's server answers any SQL by a plain GET (``/data/query?query={"sql": ..., "type": "exec"}``), writes any
request body into its cache (``POST /data/cache/NAME``), answers any Host, and opens DuckDB with the default memory
limit (80% of RAM). A web page the user visits can send such a GET cross-site (an image tag needs no CORS), and a
DNS-rebinding page can read the answers. So, keeping the package's own code:

- :class:`Guard`, an ASGI middleware around the package's app: every request must carry the server's random token
  as the first segment of its path (``/<token>/...``, the iframe's address; the frontend's own requests are relative
  to it, so they carry it too) and a Host name of this machine (``127.0.0.1``, ``localhost``, or the one
  ``LAYERLENS_ATLAS_URL`` names); otherwise 403. A request body may carry at most :data:`MAX_BODY_BYTES`, and a
  cache write is refused (413) when the cache folder would pass ``LAYERLENS_ATLAS_CACHE_MB`` in total.
- :func:`connect`, the package's ``make_duckdb_connection`` replaced (its one place where DuckDB is opened): the table
  is written to a DuckDB file attached read-only, so that no statement can change it, whatever its type (a
  data-modifying CTE is typed SELECT); the server sees it through a view. Then DuckDB's memory limit is set to the
  table's own size plus ``LAYERLENS_ATLAS_QUERY_MB`` (default 512) with nothing spilled to disk, file access is
  switched off and the configuration locked, in that order (a locked configuration cannot be changed, not even by us).
  The connection it returns hands out cursors whose ``sql`` runs only what :func:`check_sql` passes, a second wall for
  what is not a write to the table (ATTACH, DETACH, SET, CREATE ...): every statement, as DuckDB's own parser splits
  and types them, must be a SELECT (which includes DESCRIBE, SUMMARIZE, SHOW, WITH, FROM-first), or one of the three
  statements of Mosaic's pre-aggregation (a table in its own ``mosaic`` schema from one SELECT, and that schema
  dropped). The ``/data/selection`` endpoint's predicate goes through the same cursor.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

MAX_BODY_BYTES = 8 * 2**20  # a query, a selection or one cache write
CACHE_MB = int(os.environ.get("LAYERLENS_ATLAS_CACHE_MB", "64"))  # the atlas's cache folder, in total
QUERY_MEMORY_MB = int(os.environ.get("LAYERLENS_ATLAS_QUERY_MB", "512"))  # DuckDB's memory beyond the table's own
LOCAL_HOSTS = {"127.0.0.1", "localhost"}


def new_token() -> str:
    return secrets.token_urlsafe(32)


# --- SQL: reads only -----------------------------------------------------------------------------------------------

_NAME = r'(?:"{0}"|{0})'
_MOSAIC = _NAME.format("mosaic")
MOSAIC_STATEMENTS = [  # what Mosaic's pre-aggregator sends (mosaic-core: PreAggregator.request and dropSchema)
    re.compile(rf"\s*CREATE\s+SCHEMA\s+IF\s+NOT\s+EXISTS\s+{_MOSAIC}\s*;?\s*", re.I),
    re.compile(rf"\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+{_MOSAIC}\s*\.\s*{_NAME.format('preagg_[0-9a-f]+')}"
               rf"\s+AS\s+(?P<select>.+?)\s*;?\s*", re.I | re.S),
    re.compile(rf"\s*DROP\s+SCHEMA\s+IF\s+EXISTS\s+{_MOSAIC}\s+CASCADE\s*;?\s*", re.I),
]


class RefusedSQL(PermissionError):
    pass


def check_sql(cursor, sql: str) -> None:
    """Raise :class:`RefusedSQL` unless every statement of ``sql`` only reads (see the module's docstring)."""
    import duckdb

    for statement in cursor.extract_statements(sql):
        if statement.type == duckdb.StatementType.SELECT:
            continue
        match = next((m for p in MOSAIC_STATEMENTS if (m := p.fullmatch(statement.query))), None)
        if match is not None and match.groupdict().get("select") is not None:
            inner = cursor.extract_statements(match.group("select"))
            if not (len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT):
                match = None
        if match is None:
            raise RefusedSQL(f"refused: a {statement.type.name} statement; this server answers reads only")


class ReadOnlyCursor:
    """A DuckDB cursor whose ``sql`` runs only what :func:`check_sql` lets through (all the package's server uses)."""

    def __init__(self, cursor):
        self._cursor = cursor

    def __enter__(self) -> ReadOnlyCursor:
        return self

    def __exit__(self, *exc) -> None:
        self._cursor.close()

    def sql(self, sql: str):
        check_sql(self._cursor, sql)
        return self._cursor.sql(sql)


class ReadOnlyConnection:
    def __init__(self, connection, folder: tempfile.TemporaryDirectory | None = None):
        self._connection, self._folder = connection, folder  # the folder lives as long as the connection

    def cursor(self) -> ReadOnlyCursor:
        return ReadOnlyCursor(self._connection.cursor())


DATA_CATALOG = "layerlens_data"  # the read-only database that holds the tables


def connect(df, additional_tables: dict | None = None) -> ReadOnlyConnection:
    """The tables written once to a DuckDB file, attached **read-only** to an in-memory database that holds only
    views of them (and Mosaic's ``mosaic`` schema), then its limits set and locked: the package's
    ``make_duckdb_connection`` with a memory limit, no spilling, no extension loading, and reads only.

    Reads only by construction: DuckDB refuses any change to a database attached read-only, and a view cannot be
    the target of DELETE, UPDATE or INSERT, so a write hidden where the statement check cannot see it (a
    data-modifying CTE, which DuckDB types SELECT) fails in DuckDB itself. The statement check stays in front for
    what is not a write to the table (ATTACH, DETACH, SET, CREATE ...)."""
    import duckdb

    folder = tempfile.TemporaryDirectory(prefix="layerlens-atlas-")
    path = Path(folder.name) / "tables.duckdb"
    with duckdb.connect(str(path), config={"temp_directory": ""}) as writer:
        for name, frame in {"dataset": df, **(additional_tables or {})}.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"invalid table name: {name!r}")
            writer.register("_layerlens_frame", frame)
            writer.sql(f'CREATE TABLE "{name}" AS SELECT * FROM _layerlens_frame')
            writer.unregister("_layerlens_frame")
        names = [row[0] for row in writer.sql("SELECT table_name FROM duckdb_tables()").fetchall()]
    con = duckdb.connect(":memory:", config={"temp_directory": "", "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    con.sql(f"ATTACH '{path}' AS {DATA_CATALOG} (READ_ONLY)")
    for name in names:
        con.sql(f'CREATE VIEW "{name}" AS SELECT * FROM {DATA_CATALOG}.main."{name}"')
    table_bytes = path.stat().st_size  # what the tables take once read in, at most about their file
    con.sql(f"SET memory_limit = '{int(table_bytes) + QUERY_MEMORY_MB * 2**20}B'")
    con.sql("SET enable_external_access = false")
    con.sql("SET lock_configuration = true")
    return ReadOnlyConnection(con, folder)


# --- HTTP: token, Host, body sizes ---------------------------------------------------------------------------------

def allowed_hosts(extra_url: str | None = None) -> set[str]:
    """Host names the server answers to: this machine's, and the one of ``LAYERLENS_ATLAS_URL`` when set."""
    hosts = set(LOCAL_HOSTS)
    extra = extra_url if extra_url is not None else os.environ.get("LAYERLENS_ATLAS_URL", "")
    name = urlsplit(extra.replace("{port}", "1")).hostname if extra else None
    if name:
        hosts.add(name.lower())
    return hosts


def host_name(value: str) -> str:
    """``Host`` header -> its name, lower case, without the port (``[::1]:80`` -> ``::1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else ""
    return value.rsplit(":", 1)[0] if ":" in value else value


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Guard:
    """ASGI middleware: the token as the path's first segment, a local Host, bounded bodies and cache."""

    def __init__(self, app, token: str, hosts: set[str], cache_folder: Path, cache_bytes: int = CACHE_MB * 2**20,
                 max_body: int = MAX_BODY_BYTES):
        self.app, self.token, self.hosts = app, token, {h.lower() for h in hosts}
        self.cache_folder, self.cache_bytes, self.max_body = Path(cache_folder), cache_bytes, max_body
        self._cache_lock = asyncio.Lock()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if host_name(headers.get(b"host", b"").decode("latin-1")) not in self.hosts:
            return await self._deny(scope, send, 403, "this server answers only to this machine's host names")
        first, slash, rest = scope["path"][1:].partition("/")
        if not secrets.compare_digest(first.encode(), self.token.encode()):
            return await self._deny(scope, send, 403, "forbidden")
        if scope["type"] == "websocket":
            return await self._deny(scope, send, 403, "forbidden")
        if not slash:  # /<token> -> /<token>/, the app's relative URLs need the slash
            return await self._send(send, 307, b"", [(b"location", f"/{self.token}/".encode())])
        scope = dict(scope, root_path=scope.get("root_path", "") + "/" + self.token)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = await self._read(receive)
        if body is None:
            return await self._send(send, 413, f"a request may carry at most {self.max_body:,} bytes".encode())
        if rest.startswith("data/cache/"):
            async with self._cache_lock:  # checked and written one at a time, so the total holds
                held = folder_bytes(self.cache_folder)
                if held + len(body) + 4096 > self.cache_bytes:
                    return await self._send(send, 413, (
                        f"the atlas's cache holds {held:,} of its {self.cache_bytes:,} bytes; this write of "
                        f"{len(body):,} bytes would pass them").encode())
                return await self.app(scope, _replay(body, receive), send)
        return await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive) -> bytes | None:
        """The whole body, or None past :attr:`max_body` (the rest is read and dropped, never held)."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body:
                chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks) if size <= self.max_body else None

    async def _deny(self, scope, send, status: int, text: str) -> None:
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        return await self._send(send, status, text.encode())

    @staticmethod
    async def _send(send, status: int, body: bytes, headers: list | None = None) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), *(headers or [])]})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive):
    """``receive`` for the app: the body already read, then the client's own messages (its disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
