"""The mirror's layout holds: each module imports only modules above it in the README's order, has a docstring
that says its job, and the README's layout table names every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spark_app"


def readme_order() -> list[str]:
    """The module order the README's layout table gives, e.g. ['config', 'errors', ..., 'dr.formats', ..., 'cli']."""
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `spark_app/` |"))
    order: list[str] = []
    for name, inner in re.findall(r"`(\w+/?)`(?: \(([^)]*)\))?", row.split("|")[2]):
        if name.endswith("/"):
            order += [f"{name[:-1]}.{sub}" for sub in re.findall(r"`(\w+)`", inner)]
        else:
            order.append(name)
    return order


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if name not in ("__init__", "__main__") and not name.endswith(".__init__"):
            found[name] = path
    return found


def imported(path: Path, name: str) -> set[str]:
    """The spark_app modules a module imports (relative imports resolved)."""
    package = name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package if node.level == 1 else package.rpartition(".")[0]
            target = ".".join(p for p in (base, node.module or "") if p)
            if target in ("", package) or node.module is None:
                out |= {".".join(p for p in (target, a.name) if p) for a in node.names}
            else:
                out.add(target)
    return out


def test_the_readme_names_every_module_of_the_mirror_once():
    order = readme_order()
    assert sorted(order) == sorted(modules()), "README's layout table and spark_app/ disagree"
    assert len(order) == len(set(order))


def test_each_module_imports_only_modules_above_it():
    order = readme_order()
    known = set(order)
    wrong = []
    for name, path in modules().items():
        for dep in imported(path, name) & known:
            if order.index(dep) >= order.index(name):
                wrong.append(f"{name} imports {dep}")
    assert wrong == []


def test_each_module_opens_with_a_one_line_summary_of_its_job():
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{name} has no docstring"
        first = doc.splitlines()[0]
        assert first.endswith((".", ":")) or len(first) > 20, f"{name}: {first!r}"


def test_no_module_imports_another_modules_private_name():
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{name} imports {private} from {node.module}"
