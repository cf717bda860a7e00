"""The pure core (coordinator/core, storage/cells.py, worker/tasks.py) imports nothing but the standard library, itself and xxhash.

`xxhash` is the one exception: a pure function (the token is Spark's xxhash64 rule, see coordinator/core/tokens.py).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_MODULES = sorted((ROOT / "coordinator" / "core").glob("*.py")) + [ROOT / "storage" / "cells.py",
                                                                       ROOT / "worker" / "tasks.py"]
PURE_PACKAGES = ("coordinator.core", "storage.cells", "worker.tasks")
PURE_THIRD_PARTY = ("xxhash",)


def imported_modules(path: Path) -> list[str]:
    """Absolute names of the modules `path` imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(resolve(package, node.module, node.level))
    return names


def resolve(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def allowed(name: str) -> bool:
    top = name.split(".")[0]
    return (top in sys.stdlib_module_names or top == "__future__" or top in PURE_THIRD_PARTY
            or name.startswith(PURE_PACKAGES))


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_only_the_standard_library(path):
    outside = [name for name in imported_modules(path) if not allowed(name)]
    assert outside == [], f"{path.relative_to(ROOT)} imports {outside}; the pure core may import only the standard library (and xxhash)"


def test_the_check_sees_a_third_party_import():
    module = ROOT / "coordinator" / "core" / "schema.py"
    assert all(allowed(name) for name in imported_modules(module))
    assert not allowed("grpc") and not allowed("sqlalchemy.orm") and not allowed("replica.local")
    assert resolve("coordinator.core", "errors", 1) == "coordinator.core.errors"
    assert resolve("coordinator.core", None, 2) == "coordinator"
