"""``layerlens cache verify``: every vector set in the cache checked whole (its manifest, each shard's size, shape
and SHA-256 checksum: :func:`analysis.core.store.verify_set`)."""

from __future__ import annotations

import argparse
import shutil
import sys


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="verify")
    verify = sub.add_parser("verify", help="check every vector set in the cache (LAYERLENS_HOME/cache); a damaged "
                            "one is named, and with --remove removed (it is computed again when next asked for)")
    verify.add_argument("--remove", action="store_true", help="remove the damaged sets")


def cmd_cache(args: argparse.Namespace) -> int:
    from analysis.core.home import cache_dir
    from analysis.core.store import MANIFEST, verify_set

    root = cache_dir()
    sets = sorted(p.parent for p in root.rglob(MANIFEST)) if root.is_dir() else []
    damaged = 0
    for directory in sets:
        why = verify_set(directory)
        if why is not None:
            damaged += 1
            print(f"damaged: {directory}: {why}", file=sys.stderr)
            if args.remove:
                shutil.rmtree(directory, ignore_errors=True)
    print(f"{len(sets) - damaged} of {len(sets)} vector sets in {root} whole"
          + (f"; {damaged} damaged" + (", removed" if args.remove else " (--remove removes them)") if damaged
             else ""))
    return 1 if damaged and not args.remove else 0
