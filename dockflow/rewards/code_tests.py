"""Code-execution reward (built-in ``code_tests``): run each completion's code against the row's tests.

Reward-function convention (TRL GRPOTrainer): ``code_tests(prompts, completions, tests=[...])``, one
``tests`` value per completion, each either

* a string of Python (e.g. ``assert`` lines): all-or-nothing, 1.0 if it runs to the end, else 0.0;
* a list of such strings: partial credit, the fraction that pass (each runs on its own, after the
  solution, in the solution's namespace, so one failing test does not stop the next).

The code is the last fenced ```python block of the completion (else the last ``` block, else the whole
text). It runs in :func:`dockflow.rewards.sandbox.run_sandboxed` (docs/sandbox.md); a syntax error,
crash, timeout or hit limit scores 0.0 and the batch goes on. A test counts only if the harness reaches
the end and prints a result line with a per-run nonce the program never sees in its source, so
``sys.exit(0)`` / ``os._exit(0)`` in the solution scores 0.0 rather than passing.

Limits: keyword-only, so wrap it to change them::

    my_reward = functools.partial(code_tests, sandbox_limits=SandboxLimits(timeout_s=5), max_workers=4)
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from dockflow.rewards.functions import completion_text
from dockflow.rewards.sandbox import SandboxLimits, SandboxResult, run_sandboxed

log = logging.getLogger(__name__)

DEFAULT_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, memory_mb=1024, nproc=32)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}

# The nonce comes on stdin and is read before the solution runs; writes go through os.write captured
# up front, so a solution that swaps sys.stdout or exits early cannot produce the result line.
_HARNESS = """\
import os as _os, sys as _sys, traceback as _tb
def _dockflow_harness(write=_os.write, nonce=_sys.stdin.readline().strip()):
    ns = {{"__name__": "__main__", "__builtins__": __builtins__}}
    exec(compile({code!r}, "solution.py", "exec"), ns)
    tests, passed = {tests!r}, 0
    for i, test in enumerate(tests):
        try:
            exec(compile(test, "test_%d.py" % i, "exec"), ns)
            passed += 1
        except BaseException:
            _tb.print_exc()
    try:
        _sys.stdout.flush()
    except Exception:
        pass
    write(1, ("\\n%s %d %d\\n" % (nonce, passed, len(tests))).encode())
_dockflow_harness()
"""


def extract_code(completion: str) -> str:
    """The last ```python block, else the last fenced block of any language, else the whole text."""
    blocks = _FENCE.findall(completion)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else completion


def build_program(code: str, tests: str | Sequence[str]) -> str:
    """The harness program: run ``code``, then each test; prints ``<nonce> <passed> <total>`` last."""
    return _HARNESS.format(code=code, tests=[tests] if isinstance(tests, str) else list(tests))


def parse_score(result: SandboxResult, nonce: str) -> float:
    """Fraction of tests passed from the harness's result line (0.0 if it never printed one)."""
    for line in reversed(result.stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and parts[2].isdigit():
            return int(parts[1]) / int(parts[2])
    return 0.0


def _check_tests(tests: object, row: int) -> str | list[str]:
    if tests is None:
        raise ValueError(
            f"code_tests needs a 'tests' column (a string of Python or a list of them); row {row} has None"
        )
    if isinstance(tests, str):
        return tests
    if isinstance(tests, Sequence) and tests and all(isinstance(t, str) for t in tests):
        return list(tests)
    raise ValueError(
        f"code_tests: row {row}'s tests must be a string or a non-empty list of strings, got {tests!r:.80}"
    )


def run_completion(
    completion: str, tests: str | Sequence[str], limits: SandboxLimits
) -> tuple[float, SandboxResult]:
    """Score one completion; returns the score and the sandbox result (for logs and tests)."""
    nonce = secrets.token_hex(16)
    program = build_program(extract_code(completion), tests)
    result = run_sandboxed(program, limits, stdin=(nonce + "\n").encode())
    return parse_score(result, nonce), result


def code_tests(
    prompts: Sequence[object],
    completions: Sequence[object],
    tests: Sequence[object],
    *,
    sandbox_limits: SandboxLimits = DEFAULT_LIMITS,
    max_workers: int = 2,
    **kwargs: object,
) -> list[float]:
    """One score in [0, 1] per completion. ``tests`` is required, so a dataset without that column is refused
    where the run starts (``dockflow.rewards.functions.check_columns``). Raises ValueError on a row's missing
    tests, and RuntimeError only if the sandbox itself failed to start for every completion (a broken setup, not
    bad code)."""
    if len(tests) != len(completions):
        raise ValueError(f"code_tests: {len(completions)} completions but {len(tests)} tests values")
    rows = [_check_tests(t, i) for i, t in enumerate(tests)]
    texts = [completion_text(c) for c in completions]  # conversational completions: the last message's content
    if not texts:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(texts)))) as pool:
        outcomes = list(pool.map(run_completion, texts, rows, [sandbox_limits] * len(texts)))
    errors = [r.error for _, r in outcomes if r.status == "error"]
    if errors and len(errors) == len(outcomes):
        raise RuntimeError(f"code_tests: the sandbox could not start: {errors[0]}")
    for err in errors:
        log.warning("code_tests: sandbox error, scored 0.0: %s", err)
    return [score for score, _ in outcomes]
