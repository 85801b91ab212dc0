"""The package's layers import only the layers before them, so dependencies point one way."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"

# Each layer may import itself and the layers before it in this list.
LAYERS = [
    {"units", "errors", "progress", "kinds", "invariants"},
    {"config"},
    {"observe"},       # recording and metrics over plain arrays: used by the hardware models' spans
    {"hardware"},
    {"workloads"},
    {"pipelines"},
    {"api", "sweep", "plan", "validate", "coverage", "calibrate", "report", "runfolder", "project"},
    {"commands", "cli", "__main__", "__init__"},
]


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"simulator.{name} belongs to no layer")


def imported_parts(path: Path) -> set[str]:
    """Top-level simulator sub-packages/modules a source file imports (relative or absolute)."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parts[:-node.level])
                target = base + (node.module.split(".") if node.module else [])
                # ``from . import x`` inside a sub-package stays in it; at the top it names modules.
                parts.update([target[0]] if target else [a.name for a in node.names])
            elif node.module and node.module.startswith("simulator."):
                parts.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            parts.update(a.name.split(".")[1] for a in node.names if a.name.startswith("simulator."))
    return parts


def test_dependencies_point_one_way():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for dep in imported_parts(path) - {own}:
            if layer_of(dep) > layer_of(own):
                wrong.append(f"{path.relative_to(PACKAGE)} imports simulator.{dep}")
    assert not wrong, "\n".join(sorted(wrong))
