"""Rules about the code and the suite itself, checked on the files: test modules share helpers through
conftest.py and factories.py, never by importing each other; every batch script the console writes comes
from the one renderer (clusters/slurm/batch.py)."""

import ast
import re
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
RENDERER = ROOT / "clusters" / "slurm" / "batch.py"


def imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or "")
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_it_has_no_test_module_that_imports_another():
    offenders = {
        f"{path.name} imports {name}"
        for path in (ROOT / "tests").glob("test_*.py")
        for name in imported_modules(path)
        if re.match(r"(\.|tests\.)test_", name)
    }
    assert not offenders


def test_it_writes_sbatch_directives_only_in_the_renderer():
    """The product's code (not the tests, which submit scripts as users write them) has one `#SBATCH` writer."""
    writers = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("clusters", "recipes", "console", "scripts", "benchmarks")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".sh") and path != RENDERER
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#SBATCH\s+-", line) and not line.lstrip().startswith("#")  # a directive, not prose
    ]
    assert not writers
