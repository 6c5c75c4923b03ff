"""Policy files (reports/gate.yaml, lanes/*.yaml) read strictly: a key given twice is an
error rather than the last one silently winning, every key keeps the line it is written on
so that an error can name it, and a number is a number in any YAML 1.1 or 1.2 spelling
(`2e-05`, `1E-3` and `2.0e-5` alike: YAML 1.1, which PyYAML implements, reads the first two
as strings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, SequenceNode

# Floats YAML 1.1's resolver leaves as strings: an exponent without a '.' or without a sign.
_MORE_FLOATS = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")


class PolicyError(ValueError):
    """A policy file that does not parse or says something it may not; names file and line."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 exponent floats as floats."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            self.flatten_mapping(node)
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeConstructor names it
                if first is not None:
                    raise ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"duplicate key {key!r} (first on line {first}): the second would silently replace the first",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _MORE_FLOATS, list("-+0123456789."))


@dataclass
class Document:
    """A parsed file: `data`, and the line (1-based) of every key and item by its path."""

    path: Path
    data: object
    lines: dict = field(default_factory=dict)

    def where(self, *keys) -> str:
        """`file:line` of the deepest of `keys` the file holds (the file alone when none)."""
        for n in range(len(keys), -1, -1):
            if keys[:n] in self.lines:
                return f"{self.path}:{self.lines[keys[:n]]}"
        return str(self.path)


def load(path) -> Document:
    """`path` parsed strictly; PolicyError (a ValueError) names the file and line."""
    path = Path(path)
    text = path.read_text()
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
        lines: dict = {}
        if node is not None:
            _lines(loader, node, (), lines, set())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise PolicyError(f"{path}{line}: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise PolicyError(f"{path}: {e}") from None
    except RecursionError:  # a pull request's file nested thousands deep
        raise PolicyError(f"{path}: nested too deeply to read") from None
    finally:
        loader.dispose()
    return Document(path, data, lines)


def _lines(loader, node, path: tuple, out: dict, seen: set) -> None:
    """Record the line of `node` under `path`, then of its keys and items (each node once:
    aliases and anchors may share or nest them)."""
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            try:
                key = loader.construct_object(key_node, deep=True)
                hash(key)
            except (yaml.YAMLError, TypeError):
                continue
            out[path + (key,)] = key_node.start_mark.line + 1
            _lines(loader, value_node, path + (key,), out, seen)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _lines(loader, item, path + (i,), out, seen)
