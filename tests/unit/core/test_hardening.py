"""Hostile and random input: parsers raise only InputError, uploads never choose paths, nothing is evaluated."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.core.inputs import InputError, parse, safe_suffix
from analysis.core.layers import parse_layers
from analysis.duplication.plan import parse_plan

NAMES = ["x.txt", "x.csv", "x.tsv", "x.jsonl"]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), name=st.sampled_from(NAMES), column=st.sampled_from(["text", "label", "a"]))
def test_parse_raises_only_input_errors_on_any_bytes(data, name, column):
    try:
        out = parse(data, name, column if name != "x.txt" else "text")
    except InputError:
        return
    assert len(out.texts) == len(out.ids) and all(t.strip() for t in out.texts)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.text(max_size=30), st.text(max_size=8)), min_size=1, max_size=20))
def test_jsonl_rows_round_trip_as_data(rows):
    import json

    text = "\n".join(json.dumps({"text": t, "label": lab}) for t, lab in rows)
    try:
        out = parse(text, "x.jsonl", label_column="label")
    except InputError:
        assert all(not " ".join(t.split()) or not " ".join(lab.split()) for t, lab in rows)
        return
    kept = [(" ".join(t.split()), " ".join(lab.split())) for t, lab in rows]
    assert list(out.texts) == [t for t, lab in kept if t and lab]


@settings(max_examples=300, deadline=None)
@given(plan=st.lists(st.integers(min_value=0, max_value=11), min_size=1, max_size=40))
@pytest.mark.slow
def test_valid_plans_parse_back(plan):
    assert parse_plan(",".join(map(str, plan)), 12) == plan
    assert parse_plan(" ".join(map(str, plan)), 12) == plan


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40))
def test_any_plan_text_is_a_plan_or_an_input_error(text):
    try:
        plan = parse_plan(text, 12)
    except InputError:
        return
    assert plan and all(0 <= i < 12 for i in plan)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=20))
def test_any_layers_text_is_layers_or_an_input_error(text):
    try:
        layers = parse_layers(text, 13)
    except InputError:
        return
    assert layers and all(0 <= i < 13 for i in layers) and len(set(layers)) == len(layers)


def test_formula_prefixes_are_kept_as_text():
    hostile = 'text,label\n"=cmd|\' /C calc\'!A0",1\n+SUM(A1:A2),0\n@import,1\n-2+3,0\n'
    out = parse(hostile, "x.csv", label_column="label")
    assert out.texts == ("=cmd|' /C calc'!A0", "+SUM(A1:A2)", "@import", "-2+3")


@pytest.mark.parametrize("name, suffix", [("../../etc/passwd.csv", ".csv"), ("..\\..\\x.tsv", ".tsv"),
                                          ("/abs/path/data.jsonl", ".jsonl"), ("a.b.c.TXT", ".txt")])
def test_uploaded_names_never_become_paths(name, suffix):
    assert safe_suffix(name) == suffix


@pytest.mark.parametrize("name", ["x.exe", "x", "x.csv.py"])
def test_wrong_upload_types(name):
    with pytest.raises(InputError, match="cannot read"):
        safe_suffix(name)


def test_huge_line_counts_are_capped_not_loaded_whole():
    data = "text\n" + "a line\n" * 200_000
    out = parse(data, "x.csv", limit=2000)  # reading stops at the limit (issue 34.2): the rest is not counted
    assert len(out) == 2000 and out.dropped_over_limit == 1 and "not read (row limit)" in out.notes()[0]


@pytest.mark.slow
def test_two_sessions_probing_one_cached_model_at_once_agree(tiny_dirs):
    """Streamlit runs each browser session in its own thread over the one shared cached model."""
    import threading

    import pandas as pd

    from analysis.core.inputs import TextInputs
    from analysis.probe.reconstruction import ProbeConfig, probe
    from models.cache import ModelCache
    from models.loading import ModelSpec

    cache = ModelCache()
    spec = ModelSpec(str(tiny_dirs["bert"]), device="cpu")
    texts = TextInputs(tuple(f"the film is good {'very ' * (i % 5)}fun ." for i in range(40)))
    expected = probe(cache.get(spec), texts, ProbeConfig(batch_size=4)).layers
    results, errors = [], []

    def session():
        try:
            for _ in range(3):
                results.append(probe(cache.get(spec), texts, ProbeConfig(batch_size=4)).layers)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=session) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 12
    for layers in results:
        pd.testing.assert_frame_equal(layers, expected)


def test_server_defaults_bind_localhost_with_xsrf_and_no_usage_statistics():
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[3]
    config = tomllib.loads((root / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert config["server"]["enableXsrfProtection"] is True
    assert config["server"]["maxUploadSize"] == 50
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["showErrorDetails"] == "none"  # no tracebacks in the browser
    assert "--server.address=0.0.0.0" in (root / "Dockerfile").read_text()  # the container binds on purpose


def test_remote_code_in_a_model_directory_is_never_run(tiny_dirs, tmp_path):
    """A checkpoint whose config points at its own Python code: loading must not import that code."""
    import json
    import shutil

    from models.loading import ModelLoadError, ModelSpec, load_model

    directory = tmp_path / "evil"
    shutil.copytree(tiny_dirs["bert"], directory)
    marker = tmp_path / "executed"
    (directory / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                       "from transformers import BertConfig, BertForMaskedLM\n"
                                       "class EvilConfig(BertConfig):\n    pass\n"
                                       "class EvilModel(BertForMaskedLM):\n    pass\n")
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForMaskedLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    try:
        loaded = load_model(ModelSpec(str(directory), device="cpu"))
        assert type(loaded.model).__name__ == "BertForMaskedLM"  # the library's class, not the directory's
    except ModelLoadError:
        pass  # refusing is fine too
    assert not marker.exists()


def test_a_job_cannot_choose_where_its_artifacts_go(tmp_path):
    """A job's artifacts always go to <job>/artifacts: no option names a place, and 'out'/'config' are refused."""
    from jobs.submit import SubmitError, validate

    with pytest.raises(SubmitError, match=r"unknown option\(s\) config, out"):
        validate({"model": "demo", "train": "demo", "head": "cls", "epochs": 1, "out": str(tmp_path / "elsewhere"),
                  "config": "/etc/passwd"})
    config, _ = validate({"model": "demo", "train": "demo", "head": "cls", "epochs": 1})
    assert not {"out", "config"} & set(config)
