"""``layerlens info``: what a checkpoint is (family, layers, heads, its MLM head) without running it."""

from __future__ import annotations

import argparse
import sys

from cli.common import (
    prepare_out,
    spec_from_args,
    write_json,
)


def cmd_info(args: argparse.Namespace) -> int:
    """Load the model and describe it: family, layers, sizes, where it runs."""
    from models.loading import load_model

    summary = load_model(spec_from_args(args)).summary()
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    if write_json(prepare_out(args.out) if args.out else None, "info.json", summary):
        print(f"wrote {args.out}/info.json", file=sys.stderr)
    return 0
