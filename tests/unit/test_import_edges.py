"""Import edges that made cycles or reached sideways, read from the source (lazy imports inside functions
included), plus the order that used to need the cycle: each rule names the edge and where it went instead."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dockflow"


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement in ``path``, at any depth."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def offenders(files: list[Path], prefix: str) -> list[str]:
    return [f"{f.relative_to(PACKAGE.parent)} imports {m}" for f in files for m, _ in imports(f)
            if m == prefix or m.startswith(prefix + ".")]


def room(name: str) -> list[Path]:
    return sorted((PACKAGE / name).rglob("*.py"))


@pytest.mark.parametrize(("importer", "imported", "instead"), [
    ("reshard", "dockflow.engines", "dockflow.reshard.accelerator"),
    ("config", "dockflow.rewards", "dockflow.flow.run_setup.check_reward_functions, at run start"),
    ("rollout", "dockflow.workers", "what the workers pass in: dockflow.rollout sits below them"),
    ("rollout", "dockflow.flow", "what the driver passes in: dockflow.rollout sits below it"),
    ("engines", "dockflow.agents", "dockflow.rollout.multi_turn (tool rollouts over an engine)"),
    ("models", "dockflow.eval", "dockflow.flow.sft (the SFT warm start validates through eval, above models)"),
    ("models", "dockflow.rewards", "dockflow.flow.sft (the SFT warm start scores with the task verifier)"),
    ("config", "dockflow.algos", "dockflow.config.algorithm's registry, which each algorithm module registers with"),
])
def test_a_lower_room_does_not_import_a_higher_one(importer: str, imported: str, instead: str) -> None:
    assert offenders(room(importer), imported) == [], f"use {instead}"


def test_only_the_cli_imports_the_cli_driver() -> None:
    files = [f for f in PACKAGE.rglob("*.py") if f.name not in ("cli.py", "trainer.py")]
    assert offenders(files, "dockflow.flow.trainer") == [], "shared run set-up lives in dockflow.flow.run_setup"


def test_workers_and_rollouts_import_no_generation_backend() -> None:
    backends = ("dockflow.engines.hf_generation", "dockflow.engines.vllm_generation", "dockflow.engines.cost_model")
    found = [o for b in backends for room_name in ("workers", "rollout") for o in offenders(room(room_name), b)]
    assert found == [], "workers use the engine interfaces and dockflow.engines.token_layout"


def test_no_module_imports_another_modules_private_name() -> None:
    found = [f"{f.relative_to(PACKAGE.parent)}: {m}.{n}" for f in PACKAGE.rglob("*.py") for m, names in imports(f)
             if m.startswith("dockflow") for n in names if n.startswith("_") and not n.startswith("__")]
    assert found == []


def test_the_formerly_cyclic_modules_import_first_in_a_fresh_process() -> None:
    """Loading a config imports no reward module; each module that sat on a cycle imports before its partner,
    and the pipeline drivers without the CLI driver; nothing imports scikit-learn, SciPy's optimizer or minio."""
    code = (
        "import sys\n"
        "from dockflow.config import load_config\n"
        "load_config('configs/grpo_arith.yaml')\n"
        "assert not [m for m in sys.modules if m.startswith('dockflow.rewards')], 'the config imported rewards'\n"
        "import dockflow.reshard.ledger, dockflow.engines.fsdp_training\n"
        "import dockflow.rewards.sequence_classifier, dockflow.flow.sft\n"
        "import dockflow.flow.pipeline_tasks, dockflow.flow.supervisor\n"
        "assert 'dockflow.flow.trainer' not in sys.modules, 'a pipeline driver imported the CLI driver'\n"
        # dockflow.lazy_imports: a model's Transformers modules import neither scikit-learn nor SciPy's optimizer,
        # and dockflow.storage not minio (seconds of every worker's start-up)
        "import transformers.generation.candidate_generator, transformers.loss.loss_utils\n"
        "assert not {'sklearn', 'scipy.optimize', 'minio'} & set(sys.modules), 'an import that could wait'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_importing_the_engines_does_not_import_transformers() -> None:
    """The engines' interfaces import without transformers (2-3 s here): the HF engine and the log-prob functions
    import its cache classes when they run."""
    probe = "import sys, dockflow.engines; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_reward_worker_imports_no_engine_backend_or_model_class() -> None:
    """The reward worker only decodes: it imports the token layout, not the HF engine, the trainer, the model
    classes or ``AutoTokenizer`` (about 1 s of each run's start-up here); a name neither package exports is an
    ``AttributeError`` that names the package."""
    code = (
        "import sys, dockflow.workers.reward, dockflow.engines as e\n"
        "heavy = {'dockflow.engines.hf_generation', 'dockflow.engines.torch_training', 'dockflow.engines.create',\n"
        "         'transformers.models.qwen2.modeling_qwen2', 'transformers.models.auto.tokenization_auto'}\n"
        "assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))\n"
        "try:\n"
        "    e.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert \"module 'dockflow.engines' has no attribute 'no_such_name'\" == str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
