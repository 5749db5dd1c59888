"""The README's layering sentence is true: every import inside stager/ points left.

The sentence lists every package and top-level module of ``stager/`` in one
order; a package may import only packages to its left (imports inside
functions count too).  Servers never import the client, and the client never
imports server code.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "stager"
SERVERS = {"data", "meta", "storage", "web"}
CLIENT_SIDE = {"client", "fs", "loader", "stage", "mount", "torch"}


def readme_order() -> list[str]:
    """The names of the README's layering paragraph, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("The code is layered one way")
    para = text[start:text.index("Servers never", start)]
    return [name.rstrip("/") for name in re.findall(r"`([^`]+)`", para)]


def top_level(path: Path) -> str:
    """The package or module of ``stager/`` that ``path`` belongs to."""
    first = path.relative_to(PACKAGE).with_suffix("").parts[0]
    return "(root)" if first == "__init__" else first


def module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ["stager", *parts[:-1]] if parts[-1] == "__init__" else ["stager", *parts]


def imports() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) top-level names of stager -> where, for every import."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        src = top_level(path)
        here = module_name(path)
        package = here if path.name == "__init__.py" else here[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                names = [".".join([*base, *([node.module] if node.module else [])])]
                if not node.module:     # from . import x, y: each is a module
                    names = [f"{names[0]}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "stager":
                    continue
                dst = parts[1] if len(parts) > 1 else "(root)"
                if dst != src:
                    edges[(src, dst)].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges


def test_the_readme_names_every_package_and_module() -> None:
    order = readme_order()
    present = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert sorted(present - set(order) - {"__main__"}) == []
    assert sorted(set(order) - present) == []


def test_every_import_points_left() -> None:
    order = readme_order() + ["__main__", "(root)"]
    rank = {name: i for i, name in enumerate(order)}
    wrong = {edge: where for edge, where in imports().items()
             if rank.get(edge[1], len(order)) >= rank.get(edge[0], len(order))}
    assert wrong == {}


def test_servers_and_client_never_import_each_other() -> None:
    edges = imports()
    wrong = {edge: where for edge, where in edges.items()
             if (edge[0] in SERVERS and edge[1] in CLIENT_SIDE)
             or (edge[0] in CLIENT_SIDE and edge[1] in SERVERS)}
    assert wrong == {}
