"""What a new user copies must work: the docs' Python examples name nothing they do not define,
the pinned dependencies are ones PySpark supports, and ``make run`` installs only the project."""

from __future__ import annotations

import ast
import builtins
import pathlib
import re
import subprocess
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Names a fragment of the docs may take from the reader's context: a session and a DataFrame.
CONTEXT = {"spark", "df"}


def _python_blocks(md: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", md.read_text(), re.S)


def undefined_names(blocks: list[str]) -> list[str]:
    """Names read but never imported or assigned, in a document's blocks taken in order.  A
    block that does not parse (a fragment with ``...``) is skipped."""
    defined = set(dir(builtins)) | CONTEXT
    missing = []
    for code in blocks:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            assert "..." in code, f"a Python block that is not Python:\n{code}"
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                defined.add(node.name)
        missing += [f"{n.id} (line {n.lineno})" for n in ast.walk(tree)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in defined]
    return missing


def test_the_check_finds_an_unimported_name():
    assert undefined_names(["import disd.spark\nx = F.sum('Size')\n"]) == ["F (line 2)"]
    assert undefined_names(["from pyspark.sql import functions as F\nF.sum('Size')\n"]) == []
    assert undefined_names(["try:\n    pass\nexcept ValueError as e:\n    print(e)\n"]) == []


@pytest.mark.parametrize("md", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                                *sorted((ROOT / "examples").glob("*.md"))], ids=lambda p: p.name)
def test_python_examples_in_the_docs_define_what_they_use(md):
    assert undefined_names(_python_blocks(md)) == [], md


def test_installed_pandas_is_one_pyspark_supports():
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PySpark warns (FutureWarning) on a pandas it does not support
        require_minimum_pandas_version()


def test_make_run_installs_the_project_without_the_test_extra(tmp_path):
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "run", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    installs = [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("[test]" not in line for line in installs), out
    assert out.strip().splitlines()[-1].endswith("dis demo")
