"""``python -m analysis tokens extract|index|neighbours|geometry|map``: token vectors of a corpus per layer,
nearest tokens, each layer's geometry and token map (:mod:`analysis.tokens`, ``docs/tokens.md`` describes every
file written)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.core.task import RunRecord
from cli.common import (
    StageBars,
    UserError,
    launched,
    nonnegative_int,
    positive_int,
    prepare_out,
    processes_note,
)

ACTIONS = ("extract", "index", "neighbours", "geometry", "map")
MAP_METHODS = ("pca", "umap")  # analysis.tokens.maps.METHODS (not imported: the parser stays light)
INDEX_KINDS = ("auto", "flat", "hnsw", "ivf")  # analysis.tokens.search (not imported: the parser stays light)
OUTPUTS = {"extract": "run.json", "index": "index.csv, run.json",
           "neighbours": "neighbours.csv, summary.csv, run.json", "geometry": "geometry.csv, rogue_dims.csv, run.json",
           "map": "run.json"}


HELPS = {"extract": "token vectors per layer to disk (cached, resumable)",
         "index": "a nearest-neighbour index per layer",
         "neighbours": "the nearest tokens of one token at each layer",
         "geometry": "anisotropy, self-similarity, intra-sentence similarity, variance, rogue dimensions per layer",
         "map": "every token's 2-D coordinates at one layer (PCA or UMAP), cached beside the vectors"}


def add_tokens_arguments(p: argparse.ArgumentParser) -> None:
    """One parser per action, each with the model flags and only its own flags (``tokens ACTION --help``)."""
    from cli.common import model_options

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions = {name: sub.add_parser(name, parents=[model_options()], help=text, description=text)
               for name, text in HELPS.items()}
    for name, a in actions.items():
        title = "corpus" if name == "extract" else "corpus (read and extracted first when --input is given)"
        g = a.add_argument_group(title)
        g.add_argument("--input", type=Path, help="texts (.txt one per line, .txt.gz, .csv, .tsv, .jsonl) or a "
                       "CoNLL-U treebank (.conllu, .conllu.gz: tokens get UPOS and DEPREL)")
        g.add_argument("--column", default="text", help="text column of a .csv/.tsv/.jsonl (default: text)")
        g.add_argument("--label-column", help="a label column kept with each token")
        g.add_argument("--limit", type=positive_int, help="read at most this many texts (sentences)")
        g.add_argument("--layers", default="all", help="hidden states to keep (extract) or to use: all (default), a "
                       "slice such as -4: or a list such as 0,6,12")
        g.add_argument("--shard-rows", type=positive_int, help="tokens per shard (default: about 256 MB a shard)")
        if name != "extract":
            a.add_argument_group("vectors").add_argument(
                "--vectors", type=Path, help="an extraction directory (printed by extract) or extract's --out")
        if name in ("index", "map", "geometry"):
            a.add_argument("--seed", type=nonnegative_int, default=0, help={
                "index": "seed of the IVF training sample and the recall queries",
                "map": "seed of UMAP's sample and fit", "geometry": "seed of the samples and the bootstrap"}[name])
    g = actions["index"].add_argument_group("index")
    g.add_argument("--index", choices=INDEX_KINDS, default="auto", help="index kind (default auto: flat, exact, up "
                   "to 1,000,000 tokens, ivf above; measured in docs/tokens.md)")
    g.add_argument("--rebuild", action="store_true", help="build again even when cached")
    g.add_argument("--recall-queries", type=nonnegative_int, default=200, help="tokens on which recall@10 "
                   "against exact search is measured for an approximate index (default 200; 0: none)")
    g.add_argument("--threads", type=positive_int, help="faiss threads (default: faiss's own)")
    g = actions["neighbours"].add_argument_group("query")
    g.add_argument("--index", choices=INDEX_KINDS, default="auto", help="the index searched (default auto)")
    g.add_argument("--exact", action="store_true", help="brute-force search over the shards, no index")
    g.add_argument("--standardize", action="store_true", help="cosine of vectors z-scored per dimension over the "
                   "corpus (Timkey & van Schijndel 2021: no rogue dimension dominates; brute force)")
    g.add_argument("--row", type=nonnegative_int, help="the query token's row in tokens.parquet")
    g.add_argument("--text-id", type=nonnegative_int, help="the query's text (with --position or --word)")
    g.add_argument("--position", type=nonnegative_int, help="the query's token position in its text")
    g.add_argument("--word", help="the query's word or token (first match, or within --text-id)")
    g.add_argument("-k", "--k", type=positive_int, default=10, help="neighbours per layer (default 10)")
    g = actions["map"].add_argument_group("map")
    g.add_argument("--layer", type=int, help="the hidden state (default: the last extracted)")
    g.add_argument("--method", choices=MAP_METHODS, default="pca", help="pca (exact, every token) or umap "
                   "(fitted on --sample random tokens, the others transformed); default pca")
    g.add_argument("--sample", type=positive_int, default=20_000, help="tokens UMAP is fitted on (default 20,000)")
    g.add_argument("--rebuild", action="store_true", help="compute again even when cached")
    g = actions["geometry"].add_argument_group("geometry")
    g.add_argument("--blocks", type=positive_int, default=20, help="contiguous text blocks of the intervals "
                   "(bootstrap; jackknife for the variance statistics; default 20)")
    g.add_argument("--boots", type=positive_int, default=200, help="bootstrap replicates (default 200)")
    g.add_argument("--min-count", type=positive_int, default=5, help="occurrences a word type needs for "
                   "self-similarity (default 5)")
    g.add_argument("--max-types", type=positive_int, default=1000, help="word types sampled (default 1000)")
    g.add_argument("--max-texts", type=positive_int, default=1000, help="texts sampled for intra-sentence "
                   "similarity (default 1000)")


def _extract(args: argparse.Namespace, ranks, spec, progress=None):
    from analysis.core.activations import max_input_length
    from analysis.core.layers import parse_layers
    from analysis.tokens.corpus import read_corpus
    from analysis.tokens.vectors import extract
    from models.loading import load_model

    if not args.input.is_file():
        raise UserError(f"--input {args.input}: no such file (texts or a CoNLL-U treebank)")
    loaded = load_model(spec)
    layers = parse_layers(args.layers, loaded.num_layers + 1)
    corpus = read_corpus(loaded.tokenizer, args.input, max_input_length(loaded), args.column, args.label_column,
                         args.limit)
    start = time.perf_counter()
    tv = extract(loaded, corpus, sorted(layers), args.batch_size, args.shard_rows, progress, ranks=ranks)
    return tv, corpus, time.perf_counter() - start


def _vectors(args: argparse.Namespace):
    from analysis.tokens.vectors import TokenVectors

    if args.vectors is not None:
        return TokenVectors.open(args.vectors)
    if args.input is None:
        raise UserError(f"tokens {args.action} needs --vectors DIR (from tokens extract) or --input FILE")
    ranks, spec = launched(args)
    return _extract(args, ranks, spec, StageBars())[0]


def cmd_tokens(args: argparse.Namespace) -> int:
    return {"extract": _cmd_extract, "index": _cmd_index, "neighbours": _cmd_neighbours,
            "geometry": _cmd_geometry, "map": _cmd_map}[args.action](args)


def _cmd_extract(args: argparse.Namespace) -> int:
    if args.input is None:
        raise UserError("tokens extract needs --input FILE (texts or a CoNLL-U treebank)")
    ranks, spec = launched(args)
    with StageBars(processes_note(ranks)) as bars:
        tv, corpus, seconds = _extract(args, ranks, spec, bars if ranks.is_main else None)
    if not ranks.is_main:
        return 0
    info = tv.run_info(input=str(args.input), source=corpus.source, seconds=round(seconds, 3),
                     disk_bytes=tv.disk_bytes(), shards=len(tv.manifest["shards"]), processes=ranks.count)
    if args.out is not None:
        RunRecord(f"tokens {args.action}", info).write(prepare_out(args.out))
    src = corpus.source
    if src.get("truncated"):
        print(f"note: {src['truncated']} text(s) cut to the model's {corpus.encoded.max_length} tokens",
              file=sys.stderr)
    if src.get("dropped_too_long") or src.get("dropped_no_subword"):
        print(f"note: left out {src['dropped_too_long']} sentence(s) over the model's limit and "
              f"{src['dropped_no_subword']} with a word without subwords", file=sys.stderr)
    print(f"{tv.rows} tokens x {len(tv.layers)} layers x {tv.hidden} ({tv.storage}, {tv.disk_bytes() / 2**20:.1f} "
          f"MiB) in {seconds:.1f} s", file=sys.stderr)
    print(tv.directory)
    return 0


def _layers_of(args, tv) -> list[int]:
    if args.layers in (None, "all"):
        return tv.layers
    from analysis.core.layers import parse_layers

    chosen = parse_layers(args.layers, max(tv.layers) + 1)
    for layer in chosen:
        tv.layer_slot(layer)
    return chosen


def _cmd_index(args: argparse.Namespace) -> int:
    import pandas as pd

    from analysis.core.csvout import to_csv
    from analysis.tokens.search import index_row

    tv = _vectors(args)
    rows = []
    with StageBars() as bars:
        layers = _layers_of(args, tv)
        for done, layer in enumerate(layers):
            rows.append(index_row(tv, layer, args.index, args.threads, args.seed, args.rebuild, args.recall_queries))
            bars("index", done + 1, len(layers))
    table = pd.DataFrame(rows)
    if args.out is not None:
        out = prepare_out(args.out)
        to_csv(table, out / "index.csv")
        RunRecord(f"tokens {args.action}", tv.run_info(index=args.index)).write(out)
    print(table.to_string(index=False))
    return 0


def _cmd_neighbours(args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv
    from analysis.tokens.search import across_layers, find_rows, summary

    tv = _vectors(args)
    tokens = tv.tokens()
    if args.row is None and args.text_id is None and args.word is None:
        raise UserError("choose the query token: --row N, --text-id N with --position P or --word W, or --word W")
    row = int(find_rows(tokens, args.text_id, args.position, args.word, args.row)[0])
    found = across_layers(tv, row, args.k, None if args.exact else args.index, _layers_of(args, tv),
                          args.standardize)
    query = tokens.iloc[row]
    table = summary(query, found)
    if args.out is not None:
        out = prepare_out(args.out)
        to_csv(found, out / "neighbours.csv")
        to_csv(table, out / "summary.csv")
        RunRecord(f"tokens {args.action}", tv.run_info(query={k: (v.item() if hasattr(v, "item") else v)
                                                          for k, v in query.to_dict().items()},
                                              k=args.k, standardized=args.standardize,
                                              search="brute force" if args.exact or args.standardize
                                              else args.index)).write(out)
    text = tv.texts().set_index("text_id").loc[int(query["text_id"]), "text"]
    s, e = int(query["start"]), int(query["end"])
    print(f"query: row {row}, text {int(query['text_id'])}, position {int(query['position'])}, token "
          f"'{query['token']}', word '{query['word']}': {text[:s]}[[{text[s:e]}]]{text[e:]}" if s >= 0 else
          f"query: row {row}: {text}")
    for layer, group in found.groupby("layer", sort=False):
        print(f"layer {layer}:")
        for _, r in group.iterrows():
            print(f"  {r['rank']:>3} {r['cosine']:.3f} {r['token']!r:>14} {_window(r['marked'])}")
    print(table.drop(columns=[c for c in ("upos", "deprel", "words") if c in table]).to_string(index=False))
    return 0


def _window(marked: str, width: int = 100) -> str:
    """``width`` characters of a marked text around its ``[[token]]``."""
    at = marked.find("[[")
    start = max(0, min(at - width // 2, len(marked) - width)) if at >= 0 else 0
    return ("..." if start else "") + marked[start:start + width] + ("..." if start + width < len(marked) else "")


def _cmd_geometry(args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv
    from analysis.tokens.geometry import geometry

    tv = _vectors(args)
    with StageBars() as bars:
        table, rogue = geometry(tv, _layers_of(args, tv), args.blocks, args.boots, args.min_count, args.max_types,
                                max_texts=args.max_texts, seed=args.seed, progress=bars)
    if args.out is not None:
        out = prepare_out(args.out)
        to_csv(table, out / "geometry.csv")
        to_csv(rogue, out / "rogue_dims.csv")
        RunRecord(f"tokens {args.action}", tv.run_info(blocks=args.blocks, boots=args.boots,
                                                       seed=args.seed)).write(out)
    cols = ["layer", "anisotropy", "self_similarity", "intra_similarity", "top1_variance", "effective_rank",
            "rogue_dims", "rogue_top3_share"]
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


def _cmd_map(args: argparse.Namespace) -> int:
    from analysis.tokens.maps import layer_map

    tv = _vectors(args)
    layer = tv.layers[-1] if args.layer is None else args.layer
    tv.layer_slot(layer)  # a layer not extracted: one error line
    kw = {"sample": args.sample, "seed": args.seed} if args.method == "umap" else {}
    start = time.perf_counter()
    coords, info = layer_map(tv, layer, args.method, force=args.rebuild, **kw)
    path = tv.directory / "maps" / info["file"]
    if args.out is not None:
        RunRecord(f"tokens {args.action}", tv.run_info(
            layer=layer, method=args.method, coordinates=str(path), description=str(path.with_suffix(".json")),
            seconds=round(time.perf_counter() - start, 3), map=info)).write(prepare_out(args.out))
    print(f"{coords.shape[0]} tokens x {coords.shape[1]} coordinates ({args.method}, hidden state {layer})",
          file=sys.stderr)
    print(path)
    return 0
