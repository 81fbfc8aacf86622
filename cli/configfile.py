"""The options files ``finetune --config``, ``jobs submit --config`` and ``lens train --config`` read: YAML or JSON,
bounded in size and in YAML aliases (a "billion laughs" file is refused)."""

from __future__ import annotations

import json
from pathlib import Path

from cli.common import UserError

CONFIG_MAX_BYTES = 2**20  # a config file is a few lines; more is a mistake or an attack
CONFIG_MAX_ALIASES = 50  # YAML anchors/aliases allowed ("billion laughs" files are refused)
CONFIG_MAX_NODES = 100_000  # YAML values once aliases are expanded (an alias counts its whole target)


def read_config_file(path: Path) -> dict:
    """The option mapping in a .yaml/.yml or .json file: at most 1 MB, YAML with at most
    :data:`CONFIG_MAX_ALIASES` aliases and :data:`CONFIG_MAX_NODES` nodes counted as if every alias were
    expanded (an alias bomb is refused after parsing, before any value is built)."""
    if not path.is_file():
        raise UserError(f"no such config file: {path}")
    if path.stat().st_size > CONFIG_MAX_BYTES:
        raise UserError(f"{path} is {path.stat().st_size:,} bytes: a config file may have at most "
                        f"{CONFIG_MAX_BYTES:,}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a text file (a config file is YAML or JSON)") from None
    try:
        values = _yaml(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
    except Exception as exc:
        raise UserError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of option names to values")
    return values


def _yaml(text: str):
    """``yaml.safe_load`` with the alias and expanded-size limits: the document is composed (aliases are shared
    nodes, nothing is copied), its expanded size counted, and only then constructed."""
    import yaml

    class Limited(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                Limited.aliases += 1
                if Limited.aliases > CONFIG_MAX_ALIASES:
                    raise yaml.YAMLError(f"more than {CONFIG_MAX_ALIASES} YAML aliases")
            return super().compose_node(parent, index)

    loader = Limited(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_nodes(root) -> int:
    """The number of nodes under ``root`` with every alias expanded (a node reached twice counts twice), computed
    once per distinct node; a ``YAMLError`` above :data:`CONFIG_MAX_NODES` or for an alias inside its own anchor."""
    import yaml

    def children(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in children(node))
            if size > CONFIG_MAX_NODES:
                raise yaml.YAMLError(f"more than {CONFIG_MAX_NODES:,} YAML nodes once its aliases are expanded")
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise yaml.YAMLError(f"a YAML alias refers to itself (line {node.start_mark.line + 1})")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]
