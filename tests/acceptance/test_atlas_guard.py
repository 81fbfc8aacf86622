"""The Embedding Atlas server's guard (issue 34, item 3), against the real server process (``ui.embedding_atlas``
started as the page starts it, on a small atlas table): nothing is served without the per-server token in the path,
nor to another Host name (DNS rebinding); SQL that would write, attach, load, copy or reconfigure is refused and the
table stays as it was, while every kind of statement the atlas's own frontend sends still answers; DuckDB's memory
is bounded; cache writes are capped per request and in total. The server tests are slow (the module starts one
server, about 4 s); the same checks on the connection alone, and the Host parsing, are fast."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pandas as pd
import pytest

from analysis.tokens.atlas_table import atlas_table
from tests.unit.tokens.test_tokens_search import planted

CACHE_MB = 1  # this module's server: a 1 MB cache in total, so the total cap is reached with small writes


@pytest.fixture(scope="module")
def tv(tmp_path_factory):
    return planted(tmp_path_factory.mktemp("vectors"), n_texts=30, per_text=10, hidden=12)


@pytest.fixture(scope="module")
def served(tv, tmp_path_factory):
    import ui.embedding_atlas as ea

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAYERLENS_HOME", str(tmp_path_factory.mktemp("home")))
        mp.setenv("LAYERLENS_ATLAS_CACHE_MB", str(CACHE_MB))
        server = ea.start(atlas_table(tv, 1))
        cache = ea.log_dir() / "xdg" / "embedding_atlas"
    try:
        server.wait_ready(120)
        server.cache_folder = cache
        yield server
    finally:
        server.stop()


def fetch(url: str, data: bytes | None = None, host: str | None = None, method: str | None = None):
    """(status, body) of one request; an HTTP error status is returned, not raised."""
    request = urllib.request.Request(url, data=data, method=method)
    if host:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def query(server, sql: str, kind: str = "json", post: bool = False):
    body = json.dumps({"sql": sql, "type": kind})
    if post:
        return fetch(server.local + "data/query", data=body.encode(), method="POST")
    return fetch(server.local + "data/query?query=" + urllib.parse.quote(body))


def rows(server, sql: str) -> list[dict]:
    status, body = query(server, sql)
    assert status == 200, body[:300]
    return json.loads(body)


def bare(server, path: str) -> str:
    return f"http://127.0.0.1:{server.port}/{path}"


def folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


@pytest.mark.slow
def test_without_the_token_nothing_is_served(served, tv):
    sql = urllib.parse.quote(json.dumps({"sql": "SELECT count(*) AS n FROM dataset", "type": "json"}))
    for path in ["", "index.html", "data/metadata.json", f"data/query?query={sql}", "data/dataset.parquet",
                 "data/archive.zip", "data/cache/x"]:
        status, _ = fetch(bare(served, path))
        assert status == 403, (path, status)
    status, _ = fetch(bare(served, "data/cache/x"), data=b'"x"', method="POST")
    assert status == 403
    wrong = "A" * 43
    assert fetch(bare(served, f"{wrong}/data/metadata.json"))[0] == 403
    assert fetch(bare(served, f"{wrong}/data/query?query={sql}"))[0] == 403
    # with it: the app, its metadata and a query
    status, html = fetch(served.local)
    assert status == 200 and b"Embedding Atlas" in html
    assert rows(served, "SELECT count(*) AS n FROM dataset") == [{"n": tv.rows}]
    status, html = fetch(bare(served, served.token))  # without the trailing slash: redirected into it
    assert status == 200 and b"Embedding Atlas" in html
    assert re.fullmatch(rf"http://127\.0\.0\.1:{served.port}/[A-Za-z0-9_-]{{32,}}/", served.local)


@pytest.mark.slow
def test_another_host_name_is_refused(served):
    for host in [f"attacker.example:{served.port}", "attacker.example", f"127.0.0.1.attacker.example:{served.port}"]:
        status, _ = fetch(served.local + "data/metadata.json", host=host)
        assert status == 403, host
    for host in [f"localhost:{served.port}", f"127.0.0.1:{served.port}"]:
        assert fetch(served.local + "data/metadata.json", host=host)[0] == 200, host


WRITES = [
    "DELETE FROM dataset WHERE row < 100",
    "UPDATE dataset SET token = 'pwned'",
    "INSERT INTO dataset SELECT * FROM dataset",
    "CREATE TABLE big AS SELECT * FROM range(30000000)",
    "CREATE TEMP TABLE big AS SELECT * FROM range(30000000)",
    "CREATE OR REPLACE TABLE dataset AS SELECT 'pwned' AS token",
    "CREATE VIEW v AS SELECT 1",
    "CREATE MACRO m(a) AS a",
    "CREATE SCHEMA other",
    "CREATE TABLE mosaic.dataset AS SELECT 1",
    "DROP TABLE dataset",
    "ALTER TABLE dataset ADD COLUMN z INTEGER",
    "COPY dataset TO 'stolen.csv'",
    "EXPORT DATABASE 'stolen'",
    "ATTACH ':memory:' AS other",
    "DETACH memory",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET memory_limit = '20GB'",
    "RESET lock_configuration",
    "PRAGMA enable_profiling",
    "CALL pragma_version()",
    "CHECKPOINT",
    "BEGIN TRANSACTION",
    "SELECT 1; DELETE FROM dataset",
    "SELECT 1; UPDATE dataset SET token = 'pwned'",
    "PREPARE p AS DELETE FROM dataset",
    "VACUUM",
]


@pytest.mark.slow
def test_sql_that_writes_is_refused_and_the_table_is_unchanged(served, tv):
    table = pd.read_parquet(atlas_table(tv, 1))
    before = rows(served, "SELECT count(*) AS n, sum(row) AS s, count(*) FILTER (token = 'pwned') AS pwned "
                          "FROM dataset")
    assert before == [{"n": len(table), "s": int(table["row"].sum()), "pwned": 0}]
    tables = rows(served, "SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY ALL")
    for sql in WRITES + CTE_WRITES:
        for kind in ["exec", "json", "arrow"]:
            for post in [False, True]:
                status, body = query(served, sql, kind, post)
                assert status >= 400 and b"error" in body, (sql, kind, post, status, body[:200])
    # the same through the selection endpoint's predicate (pasted into "SELECT * FROM dataset WHERE ...")
    for predicate in ["1 = 1; DELETE FROM dataset", "true; UPDATE dataset SET token = 'pwned'"]:
        status, body = fetch(served.local + "data/selection", method="POST",
                             data=json.dumps({"predicate": predicate, "format": "json"}).encode())
        assert status >= 400, (predicate, body[:200])
    assert rows(served, "SELECT count(*) AS n, sum(row) AS s, count(*) FILTER (token = 'pwned') AS pwned "
                        "FROM dataset") == before
    assert rows(served, "SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY ALL") == tables
    # table functions reading files stay off (DuckDB's own lock, as before)
    status, body = query(served, "SELECT * FROM read_csv('/etc/passwd')")
    assert status >= 400 and b"disabled by configuration" in body


@pytest.mark.slow
def test_the_statements_the_atlas_sends_still_answer(served, tv):
    """Reads of every shape the atlas's frontend sends (recorded in Chromium: SELECT, DESCRIBE, DESC SELECT,
    SELECT over a subquery) and Mosaic's pre-aggregation (a table in its own 'mosaic' schema, then dropped)."""
    table = pd.read_parquet(atlas_table(tv, 1))
    assert rows(served, "DESCRIBE dataset")[0]["column_name"] == "x"
    assert [r["column_name"] for r in rows(served, 'DESC SELECT * FROM "dataset"')] == list(table.columns)
    top = rows(served, 'SELECT ("token")::TEXT AS "value", count(*) AS "count" FROM "dataset" GROUP BY 1 '
                       'ORDER BY 2 DESC, 1 LIMIT 3')
    counts = table["token"].value_counts()
    expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert [(r["value"], r["count"]) for r in top] == [(k, int(v)) for k, v in expected]
    got = rows(served, 'WITH s AS (SELECT * FROM "dataset" WHERE "row" < 50) SELECT avg("x") AS mx FROM s')
    np.testing.assert_allclose(got[0]["mx"], table.loc[table["row"] < 50, "x"].astype(np.float64).mean(), rtol=1e-6)
    assert rows(served, "SUMMARIZE dataset")
    status, body = query(served, 'SELECT "x"::FLOAT AS "x", "y"::FLOAT AS "y" FROM "dataset"', kind="arrow")
    assert status == 200 and len(body) > 8 * tv.rows
    preagg = ('CREATE SCHEMA IF NOT EXISTS "mosaic";\nCREATE TABLE IF NOT EXISTS "mosaic"."preagg_1a2b3c" AS '
              'SELECT "token", count(*) AS "n" FROM "dataset" GROUP BY "token"')
    assert query(served, preagg, kind="exec", post=True)[0] == 200
    assert rows(served, 'SELECT sum("n") AS n FROM "mosaic"."preagg_1a2b3c"') == [{"n": tv.rows}]
    assert query(served, 'DROP SCHEMA IF EXISTS "mosaic" CASCADE', kind="exec", post=True)[0] == 200
    assert query(served, 'SELECT * FROM "mosaic"."preagg_1a2b3c"')[0] >= 400


def mebibytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"KiB": 2**-10, "MiB": 1, "GiB": 2**10, "TiB": 2**20}[unit]


@pytest.mark.slow
def test_duckdb_memory_is_bounded(served):
    limit = rows(served, "SELECT current_setting('memory_limit') AS m")[0]["m"]
    assert mebibytes(limit) <= 512 + 64, limit  # the small table's few MB plus the queries' share
    # a sort that needs more than that fails with DuckDB's out-of-memory error; nothing spills to disk; the server
    # answers the next query and stays small
    status, body = query(served, "SELECT count(*) AS n FROM (SELECT * FROM range(60000000) ORDER BY random())")
    assert status >= 400 and b"Out of Memory" in body, body[:300]
    assert rows(served, "SELECT count(*) AS n FROM dataset")[0]["n"] > 0
    assert served.rss_bytes() < 1.5 * 2**30
    assert rows(served, "SELECT current_setting('temp_directory') AS t") == [{"t": ""}]


@pytest.mark.slow
def test_cache_writes_are_capped(served):
    folder = served.cache_folder
    before = folder_bytes(folder)
    big = json.dumps("x" * 9 * 2**20).encode()  # over the 8 MiB a request may carry
    status, body = fetch(served.local + "data/cache/big", data=big, method="POST")
    assert status == 413 and b"bytes" in body, (status, body[:200])
    assert folder_bytes(folder) == before and fetch(served.local + "data/cache/big")[0] == 404
    # small writes are kept, until the cache folder would pass its total
    small = json.dumps({"labels": ["a"] * 50_000}).encode()  # 300 KB
    status, _ = fetch(served.local + "data/cache/one", data=small, method="POST")
    assert status == 200
    assert json.loads(fetch(served.local + "data/cache/one")[1]) == {"labels": ["a"] * 50_000}
    statuses = [fetch(served.local + f"data/cache/n{i}", data=small, method="POST")[0] for i in range(6)]
    assert 413 in statuses and statuses[:statuses.index(413)] == [200] * statuses.index(413), statuses
    assert folder_bytes(folder) <= CACHE_MB * 2**20


# --- fast: the connection and the Host parsing alone ---------------------------------------------------------------

def test_the_connection_runs_reads_only_with_its_limits_set(tv):
    import duckdb

    from ui.atlas_guard import QUERY_MEMORY_MB, RefusedSQL, connect

    table = pd.read_parquet(atlas_table(tv, 1))
    con = connect(table)
    with con.cursor() as cur:
        for sql in WRITES:
            with pytest.raises(RefusedSQL, match="this server answers reads only"):
                cur.sql(sql)
        assert cur.sql("SELECT count(*), sum(row) FROM dataset").fetchall() == [(len(table), int(table["row"].sum()))]
        settings = dict(cur.sql("SELECT name, value FROM duckdb_settings() WHERE name IN ('memory_limit', "
                                "'enable_external_access', 'lock_configuration', 'temp_directory')").fetchall())
    assert settings["enable_external_access"] == "false" and settings["lock_configuration"] == "true"
    assert settings["temp_directory"] == "" and mebibytes(settings["memory_limit"]) <= QUERY_MEMORY_MB + 64
    with con.cursor() as cur:  # a pre-aggregation whose SELECT hides a second statement is refused whole
        with pytest.raises(RefusedSQL):
            cur.sql('CREATE TABLE IF NOT EXISTS mosaic.preagg_ab AS SELECT 1; DROP TABLE dataset')
        with pytest.raises((RefusedSQL, duckdb.Error)):  # DuckDB's parser refuses this one first
            cur.sql('CREATE TABLE IF NOT EXISTS mosaic.preagg_ab AS DELETE FROM dataset')
        assert cur.sql("SELECT count(*) FROM dataset").fetchall() == [(len(table),)]


def test_host_names():
    from ui.atlas_guard import allowed_hosts, host_name

    assert host_name("127.0.0.1:5055") == "127.0.0.1" and host_name("LOCALHOST") == "localhost"
    assert host_name("[::1]:80") == "::1" and host_name("evil.example:5055") == "evil.example"
    assert allowed_hosts("") == {"127.0.0.1", "localhost"}
    assert allowed_hosts("http://gpu-box:{port}/") == {"127.0.0.1", "localhost", "gpu-box"}


CTE_WRITES = [  # typed SELECT by DuckDB's parser: only the database itself can refuse them (issue 43, item 1)
    "WITH d AS (DELETE FROM dataset RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE dataset SET token = 'pwned' RETURNING *) SELECT * FROM u",
    "WITH i AS (INSERT INTO dataset SELECT * FROM dataset RETURNING *) SELECT count(*) FROM i",
    "WITH d AS (DELETE FROM layerlens_data.main.dataset RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE layerlens_data.dataset SET token = 'pwned' RETURNING *) SELECT * FROM u",
    "SELECT * FROM (WITH d AS (DELETE FROM dataset RETURNING *) SELECT * FROM d)",
    "CREATE TABLE IF NOT EXISTS mosaic.preagg_ab AS WITH d AS (DELETE FROM dataset RETURNING *) SELECT * FROM d",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
]


def test_writes_hidden_in_a_select_cannot_change_the_table(tv):
    """The table lives in a database attached read-only: a data-modifying CTE (typed SELECT, so the statement
    check lets it through) fails in DuckDB itself, and every cursor still sees every row."""
    import duckdb

    from ui.atlas_guard import RefusedSQL, connect

    table = pd.read_parquet(atlas_table(tv, 1))
    con = connect(table)
    expected = [(len(table), int(table["row"].sum()), 0)]
    check = "SELECT count(*), sum(row), count(*) FILTER (token = 'pwned') FROM dataset"
    for sql in CTE_WRITES:
        with con.cursor() as cur:
            with pytest.raises((RefusedSQL, duckdb.Error)):
                cur.sql(sql).fetchall()
        with con.cursor() as cur:
            assert cur.sql(check).fetchall() == expected, sql
    with con.cursor() as cur:
        names = cur.sql("SELECT database_name, schema_name, table_name FROM duckdb_tables()").fetchall()
        assert names == [("layerlens_data", "main", "dataset")]
        assert cur.sql("SELECT readonly FROM duckdb_databases() WHERE database_name = 'layerlens_data'"
                       ).fetchall() == [(True,)]
