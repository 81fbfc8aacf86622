"""``tokens extract|index|neighbours|geometry|map``: token vectors of a corpus per layer, nearest tokens, each
layer's geometry and token map (:mod:`analysis.tokens`; ``docs/tokens.md`` describes every file written). Five
tasks, one options schema each (:mod:`analysis.tokens.options`). ``--out`` is optional for each: without it the
result is printed and nothing is written (the vectors, indexes and maps live in the shared cache either way).
``tokens extract``'s job is the hand-written ``tokens`` kind (:mod:`analysis.tokens.job`: extract, then index, with
the shards a cancelled job wrote kept); the other actions run as their own job kinds."""

from __future__ import annotations

import time
from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import Context, Result, RunRecord, Task
from analysis.tokens.options import (
    TokensExtractOptions,
    TokensGeometryOptions,
    TokensIndexOptions,
    TokensMapOptions,
    TokensNeighboursOptions,
)

PAGE = "pages/8_Token_atlas.py"
CORPUS = "tests/data/english_valid_400.txt.gz"


def extract(options: TokensExtractOptions, ctx: Context):
    """``(vectors, corpus, seconds, processes)`` of ``options.input`` (into the shared cache; a launcher's processes
    share the work), or None in a launcher's helper process."""
    from analysis.core.activations import max_input_length
    from analysis.core.layers import parse_layers
    from analysis.core.parallel import ranks_for
    from analysis.tokens.corpus import read_corpus
    from analysis.tokens.vectors import extract as extract_vectors
    from models.loading import load_model

    path = Path(options.input).expanduser()
    if not path.is_file():
        raise InputError(f"--input {options.input}: no such file (texts or a CoNLL-U treebank)")
    ranks = ranks_for(options.device)
    loaded = load_model(options.spec(ranks.device_for(options.device)))
    layers = parse_layers(options.layers, loaded.num_layers + 1)
    corpus = read_corpus(loaded.tokenizer, path, max_input_length(loaded), options.text_column,
                         options.label_column, options.limit)
    note = f" ({ranks.count} processes)" if ranks.count > 1 else ""
    start = time.perf_counter()
    tv = extract_vectors(loaded, corpus, sorted(layers), options.batch_size, options.shard_rows,
                         (lambda stage, done, total: ctx.progress(stage + note, done, total)) if ranks.is_main
                         else None, ranks=ranks)
    return None if tv is None else (tv, corpus, time.perf_counter() - start, ranks.count)


def vectors(options, action: str, ctx: Context):
    """The extraction an action reads: ``--vectors``, or ``--input`` extracted first (None in a helper process)."""
    from analysis.tokens.vectors import TokenVectors

    if options.vectors is not None:
        return TokenVectors.open(options.vectors)
    if options.input is None:
        raise InputError(f"tokens {action} needs --vectors DIR (from tokens extract) or --input FILE")
    done = extract(options, ctx)
    return None if done is None else done[0]


def chosen_layers(layers: str, tv) -> list[int]:
    """The hidden states ``layers`` names among those extracted (one line for one that was not)."""
    if layers in (None, "all"):
        return tv.layers
    from analysis.core.layers import parse_layers

    chosen = parse_layers(layers, max(tv.layers) + 1)
    for layer in chosen:
        tv.layer_slot(layer)
    return chosen


class TokensRun(Result):
    """An action's tables (file name -> DataFrame), its ``run.json`` facts, what it prints on stdout and its last
    line on stderr (none for most)."""

    def __init__(self, action: str, tables: dict, facts: dict, printed: str, said: str = ""):
        self.action, self.tables, self.facts, self.printed, self.said = action, tables, facts, printed, said

    def write(self, out: Path) -> list[str]:
        from analysis.core.csvout import to_csv

        for name, table in self.tables.items():
            to_csv(table, Path(out) / name)
        RunRecord(f"tokens {self.action}", self.facts).write(out)
        return [*self.tables, "run.json"]

    def summary(self) -> str:
        return self.printed

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return self.said


class TokensTask(Task):
    """An action of ``layerlens tokens``."""

    flags = {"text_column": "--column"}
    page = PAGE
    out_optional = True


class TokensExtract(TokensTask):
    name = "tokens extract"
    help = "token vectors per layer to disk (cached, resumable)"
    writes = "tokens extract writes run.json"
    Options = TokensExtractOptions
    kind = "tokens"  # extract, then (unless index is none) index: the hand-written job
    example = {"input": CORPUS, "limit": 20}

    def job_config(self, values: dict) -> dict:
        """A ``tokens`` job that extracts only (``index: none``): its corpus is ``input``."""
        values = dict(values)
        return {"kind": "tokens", "corpus": str(values.pop("input")), "index": "none", **values}

    def job_options(self, config: dict) -> TokensExtractOptions:
        """A ``tokens`` job's options read back: its corpus is ``input``."""
        values = {k: v for k, v in config.items() if k not in ("kind", "corpus")}
        return self.Options.from_dict({**values, "input": config.get("corpus")})

    def run(self, options: TokensExtractOptions, ctx: Context) -> TokensRun | None:
        if options.input is None:
            raise InputError("tokens extract needs --input FILE (texts or a CoNLL-U treebank)")
        done = extract(options, ctx)
        if done is None:
            return None
        tv, corpus, seconds, processes = done
        src = corpus.source
        if src.get("truncated"):
            ctx.log(f"note: {src['truncated']} text(s) cut to the model's {corpus.encoded.max_length} tokens")
        if src.get("dropped_too_long") or src.get("dropped_no_subword"):
            ctx.log(f"note: left out {src['dropped_too_long']} sentence(s) over the model's limit and "
                    f"{src['dropped_no_subword']} with a word without subwords")
        facts = tv.run_info(input=str(options.input), source=src, seconds=round(seconds, 3),
                            disk_bytes=tv.disk_bytes(), shards=len(tv.manifest["shards"]), processes=processes)
        said = (f"{tv.rows} tokens x {len(tv.layers)} layers x {tv.hidden} ({tv.storage}, "
                f"{tv.disk_bytes() / 2**20:.1f} MiB) in {seconds:.1f} s")
        return TokensRun("extract", {}, facts, str(tv.directory), said)


class TokensIndex(TokensTask):
    name = "tokens index"
    help = "a nearest-neighbour index per layer"
    writes = "tokens index writes index.csv, run.json"
    Options = TokensIndexOptions
    opened_on = (PAGE, "its index lies beside the vector set it indexed: open that extraction among the finished "
                 "token jobs there")
    example = {"input": CORPUS, "limit": 20, "layers": "0,2"}

    def run(self, options: TokensIndexOptions, ctx: Context) -> TokensRun | None:
        import pandas as pd

        from analysis.tokens.search import index_row

        tv = vectors(options, "index", ctx)
        if tv is None:
            return None
        layers, rows = chosen_layers(options.layers, tv), []
        for done, layer in enumerate(layers):
            rows.append(index_row(tv, layer, options.index, options.threads, options.seed, options.rebuild,
                                  options.recall_queries))
            ctx.progress("index", done + 1, len(layers))
        table = pd.DataFrame(rows)
        return TokensRun("index", {"index.csv": table}, tv.run_info(index=options.index), table.to_string(index=False))


class TokensNeighbours(TokensTask):
    name = "tokens neighbours"
    help = "the nearest tokens of one token at each layer"
    writes = "tokens neighbours writes neighbours.csv, summary.csv, run.json"
    Options = TokensNeighboursOptions
    aliases = {"k": ("-k",)}
    example = {"input": CORPUS, "limit": 20, "word": "the", "k": 3}

    def run(self, options: TokensNeighboursOptions, ctx: Context) -> TokensRun | None:
        from analysis.tokens.search import across_layers, find_rows, summary

        tv = vectors(options, "neighbours", ctx)
        if tv is None:
            return None
        tokens = tv.tokens()
        if options.row is None and options.text_id is None and options.word is None:
            raise InputError("choose the query token: --row N, --text-id N with --position P or --word W, or --word W")
        row = int(find_rows(tokens, options.text_id, options.position, options.word, options.row)[0])
        found = across_layers(tv, row, options.k, None if options.exact else options.index,
                              chosen_layers(options.layers, tv), options.standardize)
        query = tokens.iloc[row]
        table = summary(query, found)
        facts = tv.run_info(query={k: (v.item() if hasattr(v, "item") else v) for k, v in query.to_dict().items()},
                            k=options.k, standardized=options.standardize,
                            search="brute force" if options.exact or options.standardize else options.index)
        text = tv.texts().set_index("text_id").loc[int(query["text_id"]), "text"]
        s, e = int(query["start"]), int(query["end"])
        lines = [f"query: row {row}, text {int(query['text_id'])}, position {int(query['position'])}, token "
                 f"'{query['token']}', word '{query['word']}': {text[:s]}[[{text[s:e]}]]{text[e:]}" if s >= 0 else
                 f"query: row {row}: {text}"]
        for layer, group in found.groupby("layer", sort=False):
            lines.append(f"layer {layer}:")
            lines += [f"  {r['rank']:>3} {r['cosine']:.3f} {r['token']!r:>14} {_window(r['marked'])}"
                      for _, r in group.iterrows()]
        lines.append(table.drop(columns=[c for c in ("upos", "deprel", "words") if c in table]).to_string(index=False))
        return TokensRun("neighbours", {"neighbours.csv": found, "summary.csv": table}, facts, "\n".join(lines))


def _window(marked: str, width: int = 100) -> str:
    """``width`` characters of a marked text around its ``[[token]]``."""
    at = marked.find("[[")
    start = max(0, min(at - width // 2, len(marked) - width)) if at >= 0 else 0
    return ("..." if start else "") + marked[start:start + width] + ("..." if start + width < len(marked) else "")


class TokensGeometry(TokensTask):
    name = "tokens geometry"
    help = "anisotropy, self-similarity, intra-sentence similarity, variance, rogue dimensions per layer"
    writes = "tokens geometry writes geometry.csv, rogue_dims.csv, run.json"
    Options = TokensGeometryOptions
    example = {"input": CORPUS, "limit": 20, "boots": 10, "blocks": 5}
    unit = "layer"

    def run(self, options: TokensGeometryOptions, ctx: Context) -> TokensRun | None:
        tv = vectors(options, "geometry", ctx)
        return None if tv is None else self.compute(None, tv, options, ctx)

    def compute(self, loaded, data, options: TokensGeometryOptions, ctx: Context) -> TokensRun:
        """The geometry of the extraction ``data`` (a page's: the one it opened; no model is read)."""
        from analysis.tokens.geometry import geometry

        tv = data
        table, rogue = geometry(tv, chosen_layers(options.layers, tv), options.blocks, options.boots,
                                options.min_count, options.max_types, max_texts=options.max_texts, seed=options.seed,
                                progress=ctx.progress)
        cols = ["layer", "anisotropy", "self_similarity", "intra_similarity", "top1_variance", "effective_rank",
                "rogue_dims", "rogue_top3_share"]
        return TokensRun("geometry", {"geometry.csv": table, "rogue_dims.csv": rogue},
                         tv.run_info(blocks=options.blocks, boots=options.boots, seed=options.seed),
                         table[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))


class TokensMap(TokensTask):
    name = "tokens map"
    help = "every token's 2-D coordinates at one layer (PCA or UMAP), cached beside the vectors"
    writes = "tokens map writes run.json"
    Options = TokensMapOptions
    example = {"input": CORPUS, "limit": 20}

    def run(self, options: TokensMapOptions, ctx: Context) -> TokensRun | None:
        from analysis.tokens.maps import layer_map

        tv = vectors(options, "map", ctx)
        if tv is None:
            return None
        layer = tv.layers[-1] if options.layer is None else options.layer
        tv.layer_slot(layer)  # a layer not extracted: one error line
        kw = {"sample": options.sample, "seed": options.seed} if options.method == "umap" else {}
        start = time.perf_counter()
        coords, info = layer_map(tv, layer, options.method, force=options.rebuild, **kw)
        path = tv.directory / "maps" / info["file"]
        facts = tv.run_info(layer=layer, method=options.method, coordinates=str(path),
                            description=str(path.with_suffix(".json")),
                            seconds=round(time.perf_counter() - start, 3), map=info)
        said = f"{coords.shape[0]} tokens x {coords.shape[1]} coordinates ({options.method}, hidden state {layer})"
        return TokensRun("map", {}, facts, str(path), said)


TASKS = (TokensExtract(), TokensIndex(), TokensNeighbours(), TokensGeometry(), TokensMap())
