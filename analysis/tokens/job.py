"""The ``tokens`` job kind (:mod:`jobs.kinds`): extract a corpus's token vectors into the shared cache
(:func:`analysis.tokens.vectors.extract`) and build their neighbour indexes (:func:`analysis.tokens.search.index_row`).

Checked at submit (:func:`validate`): the options (:class:`analysis.tokens.options.TokensJobOptions`), the corpus
read as the job will read it (a CoNLL-U treebank whole, so a malformed line is refused now, naming it; texts with
their columns), the layers against the model's config. This module never imports ``jobs``: the browser's check,
the model-config reader, the log, the progress reporter and the stop request are passed in.
"""

from __future__ import annotations

import time
from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import RunRecord
from analysis.tokens.options import TokensJobOptions

NAME = "tokens"
OPTIONS = TokensJobOptions
STAGED = True  # one process; the vectors go to the cache, shard by shard, the artifacts appear whole
OPENED_ON = ("pages/8_Token_atlas.py", "open it among the finished token jobs")


def label(config: dict) -> str:
    """What the store and the pages call the job's work."""
    return "token vectors"


def describe(config: dict) -> list[str]:
    """The job name's parts after its label and model: the corpus, the layers and the index."""
    index = config.get("index", "auto")
    return [Path(str(config.get("corpus"))).name, f"layers {config.get('layers', 'all')}",
            "no index" if index == "none" else f"index {index}"]


def validate(config: dict, browser, model_config) -> tuple[dict, str]:
    """(the options to store, with ``kind``, the device the job will run on); a refusal is an :class:`InputError`
    (an unreadable file too), a ``ModelLoadError`` or a ``ValueError`` whose message says why. ``browser``: None, or
    the browser's check of the options (``browser(options)``: the corpus a file under the
    data roots, the model a hub id or a folder under the model roots), applied before anything is read;
    ``model_config(spec)``: the model's (config, family), or a ``ModelLoadError``."""
    from analysis.core.layers import parse_layers
    from analysis.tokens.corpus import read_source

    try:
        options = TokensJobOptions(**{k: v for k, v in config.items() if k != "kind"})
        if browser:
            options = browser(options)
        path = Path(options.corpus).expanduser()
        if not path.is_file():
            raise InputError(f"corpus {path}: no such file (texts: .txt, .txt.gz, .csv, .tsv, .jsonl; or a CoNLL-U "
                             "treebank: .conllu, .conllu.gz)")
        read_source(path, options.text_column, options.label_column, options.limit)  # as the job reads it
        spec = options.spec().resolved()
        loaded_config, _ = model_config(spec)
        parse_layers(options.layers, loaded_config.num_hidden_layers + 1)
    except OSError as exc:
        raise InputError(str(exc)) from None
    return {"kind": NAME, **options.to_dict()}, spec.device


def run(config: dict, out: Path, control) -> dict:
    """A token-vector job: ``tokens extract`` of the job's corpus (:func:`analysis.tokens.vectors.extract`, into the
    shared cache: the shards a cancelled job of the same options wrote are kept and only the missing ones are
    computed), then, unless ``index`` is ``none``, ``tokens index`` of every extracted layer
    (:func:`analysis.tokens.search.build_index`, recall measured for an approximate index). Progress through
    ``control.reporter()`` (``stage`` extract or index; ``step`` of ``total_steps``: the shards on disk of all
    shards, the layers indexed of all layers; ``fraction`` of the whole: each stage an equal share) and
    ``control.log`` (``extract: shard 3 of 9``, ``index: layer 2 of 5``). Cancel (``control.listen()``: its SIGTERM
    recorded) stops it at the next batch, shard or index block (``control.check()`` raises): the shard being
    written is removed, those written before stay for the next job. ``out`` gets ``run.json`` (``tokens extract
    --out``'s, with ``index``) and, with an index, ``index.csv`` (``tokens index --out``'s). Returns the job's
    metrics."""
    from analysis.core.activations import max_input_length
    from analysis.core.csvout import to_csv
    from analysis.core.layers import parse_layers
    from analysis.core.staging import clean_stale_files
    from analysis.tokens.corpus import read_corpus
    from analysis.tokens.search import index_row
    from analysis.tokens.vectors import extract
    from models.loading import load_model

    options = TokensJobOptions(**{k: v for k, v in config.items() if k != "kind"})
    control.listen()
    loaded = load_model(options.spec())
    layers = sorted(parse_layers(options.layers, loaded.num_layers + 1))
    corpus = read_corpus(loaded.tokenizer, Path(options.corpus), max_input_length(loaded), options.text_column,
                         options.label_column, options.limit)
    say, check = control.log, control.check
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; corpus {options.corpus} "
        f"({len(corpus.encoded):,} texts, {corpus.n_rows:,} tokens); hidden states {', '.join(map(str, layers))}")
    report = control.reporter()
    stages = 2 if options.index != "none" else 1
    where = {"shard": 0, "shards": 0, "todo": [], "on_disk": 0, "done": 0}

    def extract_report(line: str, force: bool = False) -> None:
        report(line, {"stage": "extract", "step": where["on_disk"], "total_steps": where["shards"],
                      "shard": where["shard"], "tokens": where["done"], "total_tokens": corpus.n_rows,
                      "fraction": where["done"] / max(corpus.n_rows, 1) / stages}, force=force)

    def before_shard(shard: int, todo: list[int], shards: int) -> None:
        check()
        if not where["todo"]:
            where.update(todo=todo, shards=shards, on_disk=shards - len(todo))
            say(f"extract: {shards - len(todo)} of {shards} shards already on disk, computing the other {len(todo)}"
                if len(todo) < shards else f"extract: {shards} shards to compute")
        where["shard"] = shard + 1

    def extracting(_stage: str, done: int, total: int) -> None:  # after every batch
        check()
        where["done"] = done
        extract_report(f"extract: shard {where['shard']} of {where['shards']} ({done:,} of {total:,} tokens)")

    def after_shard(shard: int) -> None:  # said at once; a cancel stops here, the shard kept
        where["on_disk"] += 1
        extract_report(f"extract: shard {shard + 1} of {where['shards']} written ({where['done']:,} of "
                       f"{corpus.n_rows:,} tokens)", force=True)
        check()

    start = time.perf_counter()
    tv = extract(loaded, corpus, layers, options.batch_size, options.shard_rows, extracting,
                 before_shard=before_shard, after_shard=after_shard)
    seconds = time.perf_counter() - start
    shards = len(tv.manifest["shards"])
    if not where["todo"]:
        say(f"extract: all {shards} shards already on disk (cached)")
    where.update(shard=shards, shards=shards, on_disk=shards, done=tv.rows)
    extract_report(f"extract: {tv.rows:,} tokens x {len(tv.layers)} layers x {tv.hidden} (float16, "
                   f"{tv.disk_bytes() / 2**20:.1f} MiB) in {tv.directory}", force=True)
    info = tv.run_info(input=options.corpus, source=corpus.source, seconds=round(seconds, 3),
                     disk_bytes=tv.disk_bytes(), shards=shards, processes=1)
    rows = []
    if options.index != "none":
        info["index"] = options.index
        if (tv.directory / "index").is_dir():
            clean_stale_files(tv.directory / "index")  # a killed job's half-written index file
        for n, layer in enumerate(layers):
            def indexing(_stage, done, total, n=n, layer=layer):
                check()
                report(f"index: layer {n + 1} of {len(layers)} (hidden state {layer}; {done:,} of {total:,} rows)",
                       {"stage": "index", "step": n, "total_steps": len(layers), "layer": layer,
                        "fraction": (1 + (n + done / max(total, 1)) / len(layers)) / 2})

            check()
            rows.append(index_row(tv, layer, options.index, seed=options.seed, recall_queries=options.recall_queries,
                                  progress=indexing, before_recall=check))
            report(f"index: layer {n + 1} of {len(layers)} (hidden state {layer}): {rows[-1]['kind']}"
                   + (f", recall@10 {rows[-1]['recall@10']:.3f}" if rows[-1]["recall@10"] is not None else "")
                   + (" (cached)" if rows[-1]["cached"] else f", built in {rows[-1]['build_seconds']:.1f} s"),
                   {"stage": "index", "step": n + 1, "total_steps": len(layers), "layer": layer,
                    "fraction": (1 + (n + 1) / len(layers)) / 2}, force=True)
        import pandas as pd

        to_csv(pd.DataFrame(rows), out / "index.csv")
    out.mkdir(parents=True, exist_ok=True)
    RunRecord("tokens extract", info).write(out)  # what `layerlens tokens extract` writes
    return {"kind": NAME, "vectors": str(tv.directory), "rows": tv.rows, "layers": tv.layers,
            "hidden": tv.hidden, "shards": shards, "computed_shards": len(where["todo"]),
            "disk_bytes": tv.disk_bytes(), "seconds": round(seconds, 3), "index": control.json_safe(rows)}


def stage(progress: dict) -> str:
    """``extract: shard 3 of 9 (1,234 of 5,678 tokens) · 11% of the job`` or ``index: layer 2 of 5 · 60% of the
    job``: where a running tokens job is."""
    p = progress or {}
    if not p:
        return ""
    if p.get("stage") == "index":
        return (f"index: layer {min(p.get('step', 0) + 1, p.get('total_steps', 0))} of {p.get('total_steps', '?')} "
                f"· {p.get('fraction', 0):.0%} of the job")
    return (f"extract: shard {p.get('shard', 0)} of {p.get('total_steps', '?')} ({p.get('tokens', 0):,} of "
            f"{p.get('total_tokens', 0):,} tokens) · {p.get('fraction', 0):.0%} of the job")
