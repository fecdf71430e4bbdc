"""The code's shape: no function in the project's code (``dockflow/``, ``components/``, ``pipelines/``,
``benchmarks/``) with more than 7 positional parameters, no file there over 400 lines, and no two modules of
``dockflow/``, ``components/`` and ``pipelines/`` with one file name (``shared_file_names``).

Keyword-only parameters (after ``*``) do not count, nor ``self``/``cls`` of a method.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("dockflow", "components", "pipelines", "benchmarks")
MAX_POSITIONAL = 7
MAX_LINES = 400


def _sources() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def positional_count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    """Positional parameters of ``fn`` (positional-only and ordinary), less a method's ``self``/``cls``."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if in_class and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names)


def is_kfp_pipeline(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``@dsl.pipeline`` function: its parameters are the pipeline's run-time parameters, and KFP's compiler
    passes them positionally (keyword-only ones fail to compile), so the rule cannot apply to it."""
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "pipeline":
            return True
    return False


def long_signatures(tree: ast.AST, where: str) -> list[str]:
    """``file:line name (n)`` for every function in ``tree`` with more than ``MAX_POSITIONAL`` positional params
    (KFP pipeline functions excepted: ``is_kfp_pipeline``)."""
    found: list[str] = []

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = positional_count(child, in_class)
                if n > MAX_POSITIONAL and not is_kfp_pipeline(child):
                    found.append(f"{where}:{child.lineno} {child.name} ({n} positional)")
                visit(child, False)
            else:
                visit(child, in_class or isinstance(child, ast.ClassDef))

    visit(tree, False)
    return found


def test_counting_skips_self_and_keyword_only() -> None:
    src = (
        "class A:\n"
        "    def m(self, a, b, c, d, e, f, g): ...\n"
        "    def n(self, a, b, c, d, e, f, g, h): ...\n"
        "    @staticmethod\n"
        "    def s(self, a, b, c, d, e, f, g): ...\n"
        "def k(a, b, c, d, e, f, g, *, h, i, j): ...\n"
        "def p(a, b, c, d, /, e, f, g, h): ...\n"
        "@dsl.pipeline(name='x')\n"
        "def q(a, b, c, d, e, f, g, h): ...\n"
    )
    assert long_signatures(ast.parse(src), "x.py") == [
        "x.py:3 n (8 positional)",
        "x.py:5 s (8 positional)",
        "x.py:7 p (8 positional)",
    ]


def test_no_function_takes_more_than_seven_positional_parameters() -> None:
    found: list[str] = []
    for path in _sources():
        where = str(path.relative_to(ROOT))
        found += long_signatures(ast.parse(path.read_text(), filename=where), where)
    assert not found, "use keyword-only parameters (*, ...) or a typed object:\n" + "\n".join(found)


def test_no_file_is_over_400_lines() -> None:
    found = []
    for path in _sources():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(ROOT)}:{lines} ({lines} lines > {MAX_LINES})")
    assert not found, "split these files:\n" + "\n".join(found)


NAMED_ROOMS = ("dockflow", "components", "pipelines")


def shared_file_names(paths: list[str]) -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) that more than one of ``paths`` (relative, posix) has, less one kind of
    pair that is allowed: a module of ``dockflow/config/`` is named after its config section (``config/tools.py``:
    the ``tools:`` section), so it may share its name with the room that reads the section (``workers/reward.py``).
    """
    by_name: dict[str, list[str]] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name != "__init__.py" and not path.startswith("dockflow/config/"):
            by_name.setdefault(name, []).append(path)
    return {name: sorted(where) for name, where in sorted(by_name.items()) if len(where) > 1}


def test_the_name_check_allows_only_config_sections() -> None:
    paths = ["dockflow/config/tools.py", "dockflow/agents/tools.py", "dockflow/algos/grpo.py",
             "dockflow/algos/recipes/grpo.py", "dockflow/eval/run.py", "dockflow/flow/run.py", "components/run.py",
             "dockflow/a/__init__.py", "dockflow/b/__init__.py"]
    assert shared_file_names(paths) == {
        "grpo.py": ["dockflow/algos/grpo.py", "dockflow/algos/recipes/grpo.py"],
        "run.py": ["components/run.py", "dockflow/eval/run.py", "dockflow/flow/run.py"]}


def test_no_two_modules_share_a_file_name() -> None:
    paths = [p.relative_to(ROOT).as_posix() for room in NAMED_ROOMS for p in (ROOT / room).rglob("*.py")]
    shared = shared_file_names(paths)
    assert not shared, f"name each module after what it holds: {shared}"
