"""The package's layers import only the layers before them, so dependencies point one way."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"

# Each layer may import itself and the layers before it in this list.
LAYERS = [
    {"units", "errors", "progress", "kinds", "invariants", "forked"},
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


LLM = PACKAGE / "pipelines" / "llm"
RECORDS = {"step", "prev"}
"""Names of :class:`~simulator.pipelines.llm.engine.Step` records: a launched step's plain record, filled
in as it runs by the engine and by a closed-form run that made it."""


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_of_the_llm_pipeline_is_longer_than_a_screen():
    long = [f"{path.name}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for path in sorted(LLM.glob("*.py")) for f in _functions(ast.parse(path.read_text()))
            if f.end_lineno - f.lineno + 1 > 80]
    assert not long, "\n".join(long)


def _foreign_writes(path: Path) -> list[str]:
    """Attribute stores in ``path`` on anything but ``self``, a Step record, or an object the same
    function made of a class the module defines."""
    tree = ast.parse(path.read_text())
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    wrong = []
    for f in _functions(tree):
        made = {t.id for n in ast.walk(f) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and isinstance(n.value.func, ast.Name) and n.value.func.id in own
                for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(f):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            for store in (a for t in targets for a in ast.walk(t) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store)):
                base = store.value
                if not (isinstance(base, ast.Name) and base.id in {"self", "cls"} | RECORDS | made):
                    wrong.append(f"{path.name}:{n.lineno} writes {ast.unparse(store)}")
    return wrong


def test_the_llm_pipeline_writes_no_attribute_of_an_object_it_does_not_own():
    # each component keeps its own state and offers methods (a run settles a process's totals with
    # CPUProcess.settle_run, a scheduler takes its step's registrations with take_registrations)
    wrong = [w for path in sorted(LLM.glob("*.py")) for w in _foreign_writes(path)]
    assert not wrong, "\n".join(wrong)
