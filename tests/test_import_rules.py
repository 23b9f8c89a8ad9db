"""The arrows between packages: import-linter's contracts, and what a process loads when it starts.

import-linter reads every import statement, including those inside functions, and the platform
has no exception: even checkpoint exports run elsewhere (trainer/export_worker.py). The subprocess
checks below import modules as their processes do.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "flax", "optax", "orbax")


def _loaded_after(code: str, *, cwd: Path = REPO_ROOT, extra_path: str = "") -> set[str]:
    """Top-level modules loaded by a fresh interpreter that runs ``code``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra_path, str(REPO_ROOT)) if p)}
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_import_linter_contracts_are_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports)], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": "platform"}, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _ground_floor_contract() -> dict:
    contracts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = (c for c in contracts if c.get("source_modules") == ["tandem"] and c["type"] == "forbidden")
    return contract


def test_tandem_imports_none_of_the_processes_and_tools_it_starts_not_even_inside_a_command():
    """`tandem trainer`, `worker`, `platform-worker` and `models import` start python -m trainer, python -m
    workers, python -m celery -A config and python -m policy as programs: no import of theirs anywhere
    in tandem/ (lazy ones included), and the ground floor's contract ignores none."""
    contract = _ground_floor_contract()
    assert not contract.get("ignore_imports"), contract["ignore_imports"]
    above = set(contract["forbidden_modules"])
    assert {"trainer", "workers", "config", "policy", "jax"} <= above
    for path in sorted((REPO_ROOT / "tandem").glob("**/*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            wrong = [name for name in names if name.split(".")[0] in above]
            assert not wrong, f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {wrong}"
    # The whole command line, every command's parser built, loads none of them either.
    loaded = _loaded_after("from tandem.cli.commands import build_parser\nbuild_parser()")
    assert "tandem.cli.client_commands" in loaded
    unwanted = {name for name in loaded if name.split(".")[0] in above}
    assert not unwanted, sorted(unwanted)[:20]


def test_the_platform_loads_every_module_without_jax_or_the_processes():
    platform_dir = REPO_ROOT / "platform"
    modules = sorted(
        ".".join(path.relative_to(platform_dir).with_suffix("").parts)
        for path in platform_dir.glob("*/**/*.py")
        if "migrations" not in path.parts and path.name != "__init__.py"
    )
    assert "checkpoints.tasks" in modules and "runs.views" in modules
    code = (
        "import os, importlib, django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings.test')\n"
        # The production settings refuse to load without their secrets (tests/platform/test_deploy_config.py).
        "os.environ.setdefault('DJANGO_SECRET_KEY', 'x' * 48)\n"
        "os.environ.setdefault('ALLOWED_HOSTS', 'tandem.example.com')\n"
        "django.setup()\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
    )
    loaded = _loaded_after(code, cwd=platform_dir, extra_path=str(platform_dir))
    assert "checkpoints.tasks" in loaded
    unwanted = {name for name in loaded if name.split(".")[0] in (*HEAVY, "policy", "environments", "trainer", "workers")}
    assert not unwanted, sorted(unwanted)[:20]


def test_checkpoint_export_loads_no_run_loop_celery_or_redis():
    loaded = _loaded_after("import trainer.checkpoint_export")
    assert "jax" in loaded  # it does load JAX: that is its job
    unwanted = {name for name in loaded if name.split(".")[0] in ("celery", "redis", "workers")}
    assert "trainer.run_loop" not in loaded
    assert not unwanted, sorted(unwanted)[:20]


def test_the_export_worker_forks_its_children_before_any_jax():
    """Its prefork parent imports neither JAX nor the model code (each export loads them in the child),
    nor the platform's Django."""
    loaded = _loaded_after("import trainer.export_worker")
    unwanted = {name for name in loaded if name.split(".")[0] in (*HEAVY, "policy", "workers", "config")}
    assert "trainer.checkpoint_export" not in loaded and "django.db" not in loaded
    assert not unwanted, sorted(unwanted)[:20]


def test_no_trainer_module_loads_environment_code():
    """Demonstrations come from the producers (trainer/demonstrations.py): the trainer has no way to
    import a run's environment. import-linter cannot say it: the trainer does use the
    ``environments`` package (``Tool``), whose face imports its loader, so it is checked by name."""
    loaders = {"load_environment_class", "EnvironmentLoadError", "import_module", "__import__"}
    for path in sorted((REPO_ROOT / "trainer").glob("**/*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                imported = {alias.name for alias in node.names}
                assert not imported & loaders, f"{path.name} imports {sorted(imported & loaders)}"
                assert not (node.module or "").startswith(("environments.", "importlib")), path.name
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith(("environments.", "importlib")) for alias in node.names), path.name
            elif isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                assert name not in loaders, f"{path.name} uses {name}"
    # Nor does the process load any environment's module when it starts.
    loaded = _loaded_after("import trainer.main")
    assert not {name for name in loaded if name.startswith(("environments.builtin", "tests."))}
