"""Import cycles among the modules of a package: every import statement,
those inside functions included, and every __import__ / import_module call
with a literal absolute name, is an edge; prints each strongly connected
component of more than one module with its edges, or "no import cycles".
Exit 1 when there is one.

    python scripts/check_import_cycles.py [python/intdet]
"""

from __future__ import annotations

import ast
import os
import re
import sys


def modules(root: str) -> dict[str, str]:
    """module name -> file, for the package at ``root``."""
    base = os.path.dirname(os.path.abspath(root))
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            stem = f.split(".")[0]
            if f.endswith(".py") or f.endswith((".so", ".pyd")) and stem.isidentifier():  # extensions: leaves
                rel = os.path.relpath(os.path.join(d, stem), base).split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out.setdefault(".".join(rel), os.path.join(d, f))
    # Extension modules a clean clone has not built yet: CMake installs them
    # into the package (install(TARGETS _core DESTINATION intdet)).
    cmake = os.path.join(base, "..", "CMakeLists.txt")
    if os.path.exists(cmake):
        with open(cmake, encoding="utf-8") as f:
            for target, dest in re.findall(r"install\(TARGETS\s+(\w+)\s+DESTINATION\s+([\w/]+)\)", f.read()):
                out.setdefault(".".join(dest.split("/") + [target]), cmake)
    return out


def edges(name: str, path: str, mods) -> dict[str, int]:
    """Modules of ``mods`` that ``name`` imports -> the first line doing so."""
    is_pkg = path.endswith("__init__.py")
    if not path.endswith(".py"):
        return {}
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = {}

    def add(target, line):
        if target in mods and target != name:
            out.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                    isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")
                    or isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"):
            add(node.args[0].value, node.lineno)  # __import__("a.b"), importlib.import_module("a.b")
        elif isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                add(sub if sub in mods else base, node.lineno)
    return out


def cycles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(root: str = "python/intdet") -> int:
    mods = modules(root)
    graph = {m: edges(m, p, mods) for m, p in mods.items()}
    found = cycles(graph)
    for comp in found:
        print(f"import cycle: {', '.join(comp)}")
        for m in comp:
            for t, line in sorted(graph[m].items()):
                if t in comp:
                    print(f"  {os.path.relpath(mods[m])}:{line} imports {t}")
    if not found:
        print(f"no import cycles ({len(mods)} modules, {sum(map(len, graph.values()))} imports)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
