"""The task table (tandem.contracts.tasks) is the one place a Celery task's name or queue is typed.

Every process's Celery app registers its tasks from it and routes them by it; the source of every
package is read for a task name, or a queue given to Celery, typed as a literal anywhere else.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.contracts import TASKS, task_routes
from tandem.contracts import tasks as task_table

REPO_ROOT = Path(__file__).resolve().parents[1]
QUEUES = {task.queue for task in TASKS}
SOURCE_DIRS = ("platform", "workers", "trainer", "tandem", "policy", "environments")


def _apps_tasks(code: str, *, cwd: Path = REPO_ROOT) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO_ROOT / "platform"), str(REPO_ROOT)))}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _routes_code(app_expression: str, setup: str) -> str:
    return (
        f"import json\n{setup}\n"
        f"app = {app_expression}\n"
        "app.loader.import_default_modules()\n"
        "names = sorted(n for n in app.tasks if not n.startswith('celery.'))\n"
        "print(json.dumps({n: app.amqp.router.route({}, n)['queue'].name for n in names}))\n"
    )


def test_the_table_names_each_task_once_on_a_known_queue():
    names = [task.name for task in TASKS]
    assert len(names) == len(set(names))
    assert task_routes() == {task.name: {"queue": task.queue} for task in TASKS}
    assert task_table.TASK_TABLE_VERSION >= 1
    assert {task_table.ROLLOUT_QUEUE, task_table.EVALUATION_QUEUE, task_table.PROBE_QUEUE,
                      task_table.EXPORTS_QUEUE, *task_table.PLATFORM_QUEUES} >= QUEUES


@pytest.mark.timeout(420)
def test_every_apps_tasks_are_in_the_table_and_routed_by_it():
    table = {task.name: task.queue for task in TASKS}
    platform = _apps_tasks(_routes_code("__import__('config.celery').celery.app", (
        "import os, django\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings.dev')\n"
        "django.setup()")))
    workers = _apps_tasks(_routes_code("__import__('workers.app').app.app", "import workers.tasks"))
    exports = _apps_tasks(_routes_code("__import__('trainer.export_worker').export_worker.app", ""))
    registered = {**platform, **workers, **exports}
    assert registered == {name: table[name] for name in registered}, "a task outside the table, or routed elsewhere"
    # Each task is declared by exactly one process's app, and every entry of the table by one.
    assert not (platform.keys() & workers.keys()) and not (platform.keys() & exports.keys())
    assert registered.keys() == table.keys()
    assert set(exports) == {task_table.CHECKPOINT_EXPORT.name}
    assert {queue for name, queue in platform.items()} <= set(task_table.PLATFORM_QUEUES)


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_no_task_name_or_queue_is_typed_outside_the_table():
    names = {task.name for task in TASKS}
    table_file = Path(task_table.__file__).resolve()
    found = []
    for directory in SOURCE_DIRS:
        for path in sorted((REPO_ROOT / directory).glob("**/*.py")):
            if path.resolve() == table_file or "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                where = f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', '?')}"
                if (value := _literal(node)) in names:
                    found.append(f"{where}: task name {value!r}")
                # A queue handed to Celery: queue=/queues= keywords and "queue" entries of options.
                if isinstance(node, ast.keyword) and node.arg in ("queue", "queues") \
                        and _literal(node.value) is not None:
                    found.append(f"{where}: {node.arg}={_literal(node.value)!r}")
                if isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values, strict=True):
                        if key is not None and _literal(key) == "queue" and _literal(value) in QUEUES:
                            found.append(f"{where}: 'queue': {_literal(value)!r}")
                # Celery's own settings of a default queue.
                if isinstance(node, ast.Assign | ast.keyword):
                    target = (node.arg if isinstance(node, ast.keyword)
                              else getattr(node.targets[0], "id", ""))
                    if target and target.lower().endswith("task_default_queue") and _literal(node.value) in QUEUES:
                        found.append(f"{where}: {target} = {_literal(node.value)!r}")
    assert not found, "\n".join(found)
