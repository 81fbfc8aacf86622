"""One job's process: ``python -m jobs.run ID [--root DIR]`` (started by the worker).

Runs :func:`analysis.training.finetune.run_options` on the job's stored options with its artifacts in
``<root>/<ID>/artifacts`` (a ``lens`` job: :func:`train_lens`; a ``structure`` job: :func:`run_structure_job`; a
``tokens`` job: :func:`run_tokens_job`),
writes progress (step, epoch, loss, learning rate, per-epoch validation metrics) to the job database at most
once a second and at every epoch, and records ``succeeded`` with the metrics at the end. A failure ends the
process with the traceback in the job's log; the worker records it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time
import traceback
from pathlib import Path

from analysis.core.parallel import is_main_process
from analysis.core.staging import staged
from jobs.store import JobStore, StoreError

LOG_EVERY = 10.0  # seconds between progress lines within an epoch


def say(line: str) -> None:
    """One plain line in the job's log (no progress bars, no escape codes), with the time; from the main
    process only when the job runs in several."""
    if is_main_process():
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


class Reporter:
    """A job's progress for people and for the page: a log line at most every :data:`LOG_EVERY` seconds, the
    store's progress at most once a second; both at once when ``force`` (an epoch's end, the last step)."""

    def __init__(self, store: JobStore, job_id: int):
        self.store, self.job_id = store, job_id
        self.said, self.stored = time.time(), 0.0
        self.skipped = False  # a progress write was skipped (said once in the log)

    def __call__(self, line: str, progress: dict, force: bool = False) -> None:
        now = time.time()
        if force or now - self.said >= LOG_EVERY:
            self.said = now
            say(line)
        if force or now - self.stored >= 1.0:
            self.stored = now
            why = self.store.update_progress(self.job_id, progress)  # never fails the job
            if why and not self.skipped:
                self.skipped = True
                say(f"progress not recorded: {why} (the job goes on; the page shows its progress once the job "
                    "database can be written again; said once)")


def quiet_libraries() -> None:
    """No progress bars or per-tensor notices from transformers / huggingface_hub in a job's log: the job
    says in one line what it loaded and what it does."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def train_lens(store: JobStore, job, out: Path) -> dict:
    """A tuned-lens job: :func:`analysis.probe.lens.train` with its progress in the store. SIGTERM (Cancel) stops it
    after the current step with a checkpoint in the artifacts; a later job of the same options (and weights and
    texts) resumes from the furthest such checkpoint of the earlier jobs."""
    import signal

    from analysis.probe import lens
    from analysis.probe.options import LensOptions
    from models.loading import load_model

    options = LensOptions(**{k: v for k, v in job.config.items() if k != "kind"})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    loaded = load_model(options.spec())
    texts = lens.read_corpus(options)
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; {len(texts):,} texts")
    report = Reporter(store, job.id)

    def progress(step, total, losses):
        report(f"step {step}/{total}: KL summed over layers {sum(losses):.4f}",
               {"step": step, "total_steps": total, "loss": sum(losses)}, force=step == total)

    training = lens.train(loaded, texts, options, out, progress, should_stop=lambda: bool(stop), log=say,
                          earlier=sorted(job.directory.parent.glob("*/artifacts")))
    if training is None:
        raise SystemExit(1)  # the worker records the cancel
    held = training["held_out"]
    say("held-out KL to the final layer (masked positions), raw -> tuned: " + ", ".join(
        f"{r:.3f}->{t:.3f}" for r, t in zip(held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"], strict=True)))
    return {"kind": "lens", "steps": training["steps"], "held_out": held, "seconds": training["seconds"]}


class Cancelled(Exception):
    """A stop was requested (SIGTERM from Cancel): raised from a progress callback, so the run ends at once."""


def structure_phases(options) -> list[str]:
    """The stages a structure run reports, in order (:func:`analysis.structure.run.run_structure`): the word
    vectors of each file, the labelled texts when given, then the probes."""
    return ["train word vectors", "test word vectors", *(["labelled texts"] if options.label_data else []), "probes"]


def run_structure_job(store: JobStore, job, out: Path) -> dict:
    """A linguistic-structure job: :func:`analysis.structure.run.run_structure` on the job's options, its progress
    in the store (``stage``, ``step`` of ``total_steps`` within it, ``fraction`` of the whole: each stage an
    equal share) and the log; SIGTERM (Cancel) stops it at the next progress report (:class:`Cancelled`). The five
    files go to ``out`` (:func:`analysis.structure.output.write_outputs`, as the CLI writes them). Returns the
    job's metrics: where each task lives (``summary.csv``'s rows) and what was scored."""
    import signal

    from analysis.core.inputs import read_file
    from analysis.core.treebank import read_conllu
    from analysis.structure.options import StructureJobOptions
    from analysis.structure.output import run_info, write_outputs
    from analysis.structure.run import run_structure
    from models.loading import load_model

    options = StructureJobOptions(**{k: v for k, v in job.config.items() if k != "kind"})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    train = read_conllu(options.train, options.max_sentences)
    test = read_conllu(options.test, options.max_sentences)
    labelled = (read_file(Path(options.label_data), options.text_column, options.pair_column,
                          label_column=options.label_column) if options.label_data else None)
    loaded = load_model(options.spec())
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; train {train.path} "
        f"({len(train.sentences):,} sentences), test {test.path} ({len(test.sentences):,} sentences); tasks "
        f"{options.tasks}")
    report = Reporter(store, job.id)
    phases = structure_phases(options)

    def progress(stage: str, done: int, total: int) -> None:
        if stop:
            raise Cancelled("cancelled on request")
        name = next((p for p in phases if stage.startswith(p)), stage)
        phase = phases.index(name) if name in phases else len(phases) - 1
        fraction = (phase + done / max(total, 1)) / len(phases)
        line = (f"probes: {done} of {total} steps (fits, MDL blocks, structural epochs)" if stage == "probes" else
                f"{stage}: {done} of {total} {'texts' if name == 'labelled texts' else 'sentences'}")
        report(line, {"stage": stage, "step": done, "total_steps": total, "fraction": fraction}, force=done == total)

    result = run_structure(loaded, train, test, options.analysis(), progress=progress, labelled=labelled,
                           label_pooling=options.label_pooling)
    write_outputs(result, out, run_info(result, loaded, label_data=options.label_data))
    for name in ("train", "test"):
        info = result.info[name]
        if info["dropped_too_long"] + info["dropped_no_subword"]:
            say(f"{name}: dropped {info['dropped_too_long']} sentence(s) longer than the model's "
                f"{result.info['max_tokens']} tokens (special tokens included) and {info['dropped_no_subword']} "
                f"with a word that has no subword, of {info['sentences']} (ids in run.json)")
    say(f"word vector: {result.info['word_vector_text']}")
    say(f"summary intervals: {result.info['summary_interval']}")
    for row in result.summary.to_dict("records"):
        say(f"{row['task']}: best layer {row['best_layer']} ({row['metric']} {row['best_score']:.4f}), center of "
            f"gravity {row['center_of_gravity']:.2f}")
    return {"kind": "structure", "summary": json_safe(result.summary.to_dict("records")),
            "test_sentences_scored": result.info["test_sentences_scored"],
            "word_vector": result.info["word_vector"]}


def run_tokens_job(store: JobStore, job, out: Path) -> dict:
    """A token-vector job: ``tokens extract`` of the job's corpus (:func:`analysis.tokens.vectors.extract`, into the
    shared cache: the shards a cancelled job of the same options wrote are kept and only the missing ones are
    computed), then, unless ``index`` is ``none``, ``tokens index`` of every extracted layer
    (:func:`analysis.tokens.search.build_index`, recall measured for an approximate index). Progress in the store
    (``stage`` extract or index; ``step`` of ``total_steps``: the shards on disk of all shards, the layers indexed
    of all layers; ``fraction`` of the whole: each stage an equal share) and in the log (``extract: shard 3 of
    9``, ``index: layer 2 of 5``). SIGTERM (Cancel) stops it at the next batch, shard or index block
    (:class:`Cancelled`): the shard being written is removed, those written before stay for the next job. ``out``
    gets ``run.json`` (``tokens extract --out``'s, with ``index``) and, with an index, ``index.csv`` (``tokens
    index --out``'s). Returns the job's metrics."""
    import signal

    from analysis.core.activations import max_input_length
    from analysis.core.csvout import to_csv
    from analysis.core.layers import parse_layers
    from analysis.tokens.corpus import read_corpus
    from analysis.tokens.options import TokensJobOptions
    from analysis.tokens.search import index_row
    from analysis.tokens.vectors import clean_stale, extract
    from models.loading import load_model

    options = TokensJobOptions(**{k: v for k, v in job.config.items() if k != "kind"})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    loaded = load_model(options.spec())
    layers = sorted(parse_layers(options.layers, loaded.num_layers + 1))
    corpus = read_corpus(loaded.tokenizer, Path(options.corpus), max_input_length(loaded), options.text_column,
                         options.label_column, options.limit)
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; corpus {options.corpus} "
        f"({len(corpus.encoded):,} texts, {corpus.n_rows:,} tokens); hidden states {', '.join(map(str, layers))}")
    report = Reporter(store, job.id)
    stages = 2 if options.index != "none" else 1
    where = {"shard": 0, "shards": 0, "todo": [], "on_disk": 0, "done": 0}

    def check() -> None:
        if stop:
            raise Cancelled("cancelled on request")

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
            clean_stale(tv.directory / "index")  # a killed job's half-written index file
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
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")  # as the CLI's write_json
    return {"kind": "tokens", "vectors": str(tv.directory), "rows": tv.rows, "layers": tv.layers,
            "hidden": tv.hidden, "shards": shards, "computed_shards": len(where["todo"]),
            "disk_bytes": tv.disk_bytes(), "seconds": round(seconds, 3), "index": json_safe(rows)}


def json_safe(records: list[dict]) -> list[dict]:
    """Records with NaN as None (the store keeps JSON) and numpy numbers as Python numbers."""
    import math

    def value(v):
        v = v.item() if hasattr(v, "item") else v
        return None if isinstance(v, float) and math.isnan(v) else v

    return [{k: value(v) for k, v in r.items()} for r in records]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_id", type=int)
    p.add_argument("--root", type=Path)
    a = p.parse_args()
    store = JobStore(a.root)
    job = store.get(a.job_id)
    main_process = is_main_process()
    from analysis.core.inputs import InputError
    from analysis.training.finetune import run_options
    from analysis.training.options import resolve
    from models.loading import ModelLoadError

    quiet_libraries()
    report = Reporter(store, job.id)

    def progress(event, state, control):
        if not main_process:
            return
        if event == "epoch":
            h = state.history[-1]
            line = (f"epoch {h['epoch']}/{options.epochs}: train loss {h['train_loss']:.4f}, validation loss "
                    f"{h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, macro-F1 {h['val_macro_f1']:.4f}")
        else:
            line = (f"step {state.step}/{state.total_steps} (epoch {state.epoch}): loss {state.last_loss:.4f}, "
                    f"lr {state.lr:.3g}")
        report(line, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                      "epochs": options.epochs, "loss": state.last_loss, "lr": state.lr, "history": state.history},
               force=event == "epoch")

    try:
        out = job.directory / "artifacts"
        say(f"job {job.id}: {job.name}")
        if job.config.get("kind") == "lens":  # checkpoints go straight to the artifacts (to resume), file by file
            out.mkdir(parents=True, exist_ok=True)
            metrics = train_lens(store, job, out)
        elif job.config.get("kind") == "structure":  # one process; the artifacts appear whole when complete
            with staged(out) as stage:
                metrics = run_structure_job(store, job, stage)
        elif job.config.get("kind") == "tokens":  # one process; the vectors go to the cache, shard by shard
            with staged(out) as stage:
                metrics = run_tokens_job(store, job, stage)
        elif main_process:  # the artifacts appear whole when the run is complete (analysis.core.staging)
            options = resolve(job.config)
            with staged(out) as stage:
                metrics = run_options(options, stage, [progress], log=say)
        else:  # another process of a multi-process job: it writes nothing
            metrics = run_options(resolve(job.config), out, [progress], log=say)
    except Cancelled:
        say("stopped: cancelled on request")
        return 1
    except (InputError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    if main_process:
        try:
            store.finish(job.id, "succeeded", metrics=metrics)
        except (sqlite3.Error, StoreError) as exc:  # the result is complete on disk; the worker records the exit
            print(f"error: the job's result could not be recorded in {store.path} ({exc}); its artifacts are "
                  f"complete in {job.artifacts}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
