"""``tandem login``, ``tandem runs ...``, ``tandem eval ...`` and ``tandem envs ...``: the platform's API from a shell.

Built on :mod:`tandem.sdk.client`. Where to connect comes from ``$TANDEM_URL`` and
``$TANDEM_TOKEN`` when set, else from the file ``tandem login`` writes
(``$XDG_CONFIG_HOME/tandem/config.json``, by default under ``~/.config``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tandem.configs.changes import merge_changes
from tandem.contracts import (
    EVALUATION_LEADING_METRICS,
    EVALUATION_TOOL_METRICS,
    REWARD_MEAN_METRIC,
    SUCCESS_RATE_METRIC,
    RunStatus,
)
from tandem.sdk.client import (
    EndpointUnavailable,
    EvaluationProgress,
    LoginMissing,
    Run,
    TandemAPIError,
    TandemClient,
    save_login,
)

BAR_WIDTH = 24


class CommandError(Exception):
    """A mistake of the caller's that the command reports in one line (exit code 2)."""


def _client() -> TandemClient:
    try:
        return TandemClient.from_login()
    except LoginMissing as exc:
        raise CommandError(str(exc)) from None


# --- parsing values -----------------------------------------------------------

def parse_assignments(assignments: list[str], *, option: str) -> dict[str, Any]:
    """``["model.num_layers=2", "algorithm=dapo"]`` as a nested dict; values are JSON when they parse."""
    result: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key:
            raise CommandError(f"{option} {assignment!r}: expected key=value")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        node = result
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CommandError(f"{option} {assignment!r}: {part} was already given a value")
        node[leaf] = value
    return result


def _config_from_args(args) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if getattr(args, "config", None):
        try:
            config = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"--config {args.config}: {exc}") from None
        if not isinstance(config, dict):
            raise CommandError(f"--config {args.config}: expected a JSON object")
    return merge_changes(config, parse_assignments(args.set or [], option="--set"))


# --- output -----------------------------------------------------------------

def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _progress(run: Run, step: int | None = None) -> str:
    done = max(step or 0, run.trainer_step)
    total = run.total_steps
    return f"{done}/{total}" if total else str(done)


def _format_value(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def watch_line(run: Run, step: int | None, latest: dict[str, float | None], *, bar: bool,
               idle: bool = False) -> str:
    """One progress line of a run; with ``idle``, the trainer's idle share too (``tandem up --demo``'s)."""
    done = max(step or 0, run.trainer_step)
    total = run.total_steps
    parts = [f"run {run.id} [{run.status}]"]
    if bar and total:
        filled = min(BAR_WIDTH, round(BAR_WIDTH * done / total))
        parts.append("[" + "#" * filled + "-" * (BAR_WIDTH - filled) + f"] {min(done / total, 1):4.0%}")
    parts += [
        f"step {_progress(run, step)}",
        f"reward {_format_value(latest.get(REWARD_MEAN_METRIC))}",
        f"success {_format_value(latest.get(SUCCESS_RATE_METRIC), '.2f')}",
        f"policy v{run.policy_version}",
    ]
    if idle:
        parts.append(f"trainer idle {_format_value(latest.get('trainer_idle_fraction'), '.0%')}")
    return " ".join(parts)


# --- commands ---------------------------------------------------------------

def cmd_login(args) -> int:
    with TandemClient(args.url, args.token) as client:
        projects = list(client.projects.list())  # proves the URL and the token before saving them
    path = save_login(args.url, args.token)
    names = ", ".join(project.name for project in projects) or "none yet"
    print(f"logged in to {args.url}; projects: {names}")
    print(f"saved to {path}")
    return 0


def cmd_runs_create(args) -> int:
    with _client() as client:
        run = client.runs.create(environment=args.env, config=_config_from_args(args), name=args.name,
                                 project=args.project)
    if args.json:
        _print_json(run.model_dump(mode="json"))
    else:
        print(f"run {run.id} {run.status}: {run.urls.get('page', '')}")
    return 0


def cmd_runs_list(args) -> int:
    with _client() as client:
        runs = []
        for run in client.runs.list(status=args.status):
            runs.append(run)
            if args.limit and len(runs) >= args.limit:
                break
    if args.json:
        _print_json([run.model_dump(mode="json") for run in runs])
        return 0
    rows = [("ID", "STATUS", "STEP", "ENVIRONMENT", "NAME", "CREATED")]
    rows += [(str(run.id), run.status, _progress(run), run.environment, run.name or "-",
              (run.created_at or "")[:19]) for run in runs]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _show_run(run: Run, *, as_json: bool) -> None:
    if as_json:
        _print_json(run.model_dump(mode="json"))
        return
    print(f"run {run.id}: {run.name or '(unnamed)'}")
    fields = [
        ("status", run.status + (f" ({run.status_reason})" if run.status_reason else "")),
        ("environment", run.environment),
        ("project", str(run.project)),
        ("progress", f"step {_progress(run)}, policy v{run.policy_version}, attempt {run.attempts}"),
        ("created", run.created_at or "-"),
        ("started", run.started_at or "-"),
        ("finished", run.finished_at or "-"),
        ("page", run.urls.get("page", "-")),
    ]
    for label, value in fields:
        print(f"  {label + ':':13}{value}")
    print("  config:")
    for line in json.dumps(run.config, indent=2, sort_keys=True).splitlines():
        print(f"    {line}")


def cmd_runs_show(args) -> int:
    with _client() as client:
        _show_run(client.runs.get(args.run_id), as_json=args.json)
    return 0


def _run_action(action: str):
    def command(args) -> int:
        with _client() as client:
            run = getattr(client.runs, action)(args.run_id)
        print(f"run {run.id} {run.status}")
        return 0

    return command


def cmd_runs_clone(args) -> int:
    with _client() as client:
        run = client.runs.clone(args.run_id, config=parse_assignments(args.set or [], option="--set"),
                                name=args.name)
    print(f"run {run.id} {run.status} (clone of {args.run_id}): {run.urls.get('page', '')}")
    return 0


def cmd_runs_watch(args) -> int:
    """A live progress bar on a terminal; one line per change otherwise (logs, CI)."""
    interactive = sys.stdout.isatty() if args.tty == "auto" else args.tty == "yes"
    latest: dict[str, float | None] = {}
    step: int | None = None
    run: Run | None = None
    last_line = ""
    last_printed_at = 0.0
    with _client() as client:
        for event in client.runs.follow(args.run_id, idle_check_s=args.poll_s):
            if event.metrics is not None:
                step = event.metrics.step
                latest.update(event.metrics.values)
            if event.run is not None:
                run = event.run
            if run is None:
                continue
            line = watch_line(run, step, latest, bar=interactive)
            if line == last_line:
                continue
            now = time.monotonic()
            if interactive:
                print("\r" + line.ljust(len(last_line)), end="", flush=True)
            elif now - last_printed_at >= args.every_s or run.status != _status_of(last_line):
                print(line, flush=True)
                last_printed_at = now
            else:
                continue
            last_line = line
    assert run is not None
    final = watch_line(run, step, latest, bar=interactive)
    if interactive:
        print("\r" + final.ljust(len(last_line)))
    elif final != last_line:
        print(final)
    if run.status_reason:
        print(f"run {run.id} {run.status}: {run.status_reason}")
    return 0 if run.status == RunStatus.FINISHED else 1


def _status_of(line: str) -> str:
    start, end = line.find("["), line.find("]")
    return line[start + 1:end] if start >= 0 else ""


def _metric_cell(evaluation, name: str) -> str:
    value = evaluation.metrics.get(name)
    if value is None:
        return "-"
    interval = evaluation.intervals.get(name)
    return f"{value:.3f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def cmd_eval_list(args) -> int:
    """A run's evaluations as a table: success rate, mean reward, pass@k, and where the environment offers
    tools the tool-call rate, calls per episode and parse failures, with their 95% intervals."""
    with _client() as client:
        evaluations = client.runs.evaluations(args.run_id)
    if args.json:
        _print_json([evaluation.model_dump(mode="json") for evaluation in evaluations])
        return 0
    if not evaluations:
        print(f"run {args.run_id} has no evaluations (its config has no evaluation section, or none ended yet)")
        return 0
    pass_k = sorted({name for e in evaluations for name in e.metrics if name.startswith("pass@")},
                    key=lambda name: int(name.split("@")[1]))
    tool_use = [name for name in EVALUATION_TOOL_METRICS if any(name in e.metrics for e in evaluations)]
    columns = [*EVALUATION_LEADING_METRICS, *pass_k, *tool_use]
    rows = [("#", "STEP", "VERSION", "ENVIRONMENT", "STATUS", "EPISODES", *(name.upper() for name in columns))]
    rows += [(str(e.index), str(e.step), f"v{e.policy_version}", e.environment, e.status, str(e.episodes),
              *(_metric_cell(e, name) for name in columns)) for e in evaluations]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def evaluation_wait_line(run: Run, progress: list[EvaluationProgress] | None, *, bar: bool) -> str:
    """The run's status and its newest evaluation's episodes: received of expected, and the share."""
    parts = [f"run {run.id} [{run.status}]"]
    if not progress:
        # Queued, loading the model, or a platform that cannot say (its Redis is away).
        parts.append("evaluation not asked for yet" if progress == [] else "evaluating")
        return " ".join(parts)
    current = progress[-1]
    parts.append(f"evaluation {current.evaluation}")
    if bar:
        filled = round(BAR_WIDTH * current.fraction)
        parts.append("[" + "#" * filled + "-" * (BAR_WIDTH - filled) + f"] {current.fraction:4.0%}")
    else:
        parts.append(f"{current.fraction:.0%}")
    parts.append(f"{current.episodes_received}/{current.episodes_expected} episodes")
    if current.status != "running":
        parts.append(current.status)
    return " ".join(parts)


def _evaluation_progress(client: TandemClient, run_id: int) -> list[EvaluationProgress] | None:
    try:
        return client.runs.evaluation_progress(run_id)
    except EndpointUnavailable:
        return None  # an older platform: the wait shows the run's status alone


def _wait_for_evaluation(client: TandemClient, run: Run, args) -> Run:
    """Poll until ``run`` ends: one bar redrawn on a terminal, a line per change otherwise (logs, CI)."""
    interactive = sys.stdout.isatty() if args.tty == "auto" else args.tty == "yes"
    last_line = ""
    while True:
        run = client.runs.get(run.id)
        line = evaluation_wait_line(run, _evaluation_progress(client, run.id), bar=interactive)
        if line != last_line:
            if interactive:
                print("\r" + line.ljust(len(last_line)), end="", flush=True)
            else:
                print(line, flush=True)
            last_line = line
        if run.ended:
            break
        time.sleep(args.poll_s)
    if interactive:
        print()
    return run


def _create_evaluation_run(client: TandemClient, args) -> Run:
    """An evaluation-only run of RUN_ID's kept checkpoint, or of the model in --model; says which it made."""
    evaluation = parse_assignments(args.set or [], option="--set")
    if args.run_id is not None and args.model is not None:
        raise CommandError("give a RUN_ID or --model DIR, not both")
    if args.run_id is None and args.model is None:
        raise CommandError("give a RUN_ID (to evaluate one of its kept checkpoints) or --model DIR "
                           "(to evaluate a model as it is)")
    if args.model is None:
        misplaced = [option for option, value in (("--environment", args.environment), ("--project", args.project),
                                                   ("--config-set", args.config_set)) if value]
        if misplaced:
            raise CommandError(f"{', '.join(misplaced)}: only with --model (RUN_ID's evaluation keeps its environment, "
                               "project and config)")
        run = client.runs.evaluate(args.run_id, step=args.step, evaluation=evaluation or None, name=args.name)
        print(f"run {run.id} {run.status}: evaluates run {args.run_id} step {run.config['start_from']['step']}: "
              f"{run.urls.get('page', '')}")
        return run
    if args.environment is None:
        raise CommandError("--model needs --environment NAME[@VERSION]: the environment to evaluate it on")
    if args.step is not None:
        raise CommandError("--step: only with RUN_ID (a model directory has no checkpoints)")
    # The platform's hosts read the directory; a relative one means the caller's current directory.
    model_dir = os.path.abspath(args.model)
    run = client.runs.evaluate_model(model_dir, environment=args.environment, evaluation=evaluation,
                                     config=parse_assignments(args.config_set or [], option="--config-set"),
                                     project=args.project, name=args.name)
    print(f"run {run.id} {run.status}: evaluates {model_dir} on {run.environment}: {run.urls.get('page', '')}")
    return run


def cmd_eval_create(args) -> int:
    """An evaluation-only run of a run's kept checkpoint or of a model directory; with --wait, a progress bar
    until it ends, then its results."""
    with _client() as client:
        run = _create_evaluation_run(client, args)
        if not args.wait:
            return 0
        run = _wait_for_evaluation(client, run, args)
    if run.status_reason:
        print(f"run {run.id} {run.status}: {run.status_reason}")
    if run.status != RunStatus.FINISHED:
        return 1
    return cmd_eval_list(argparse.Namespace(run_id=run.id, json=False))


def cmd_eval_show(args) -> int:
    with _client() as client:
        evaluation = next((e for e in client.runs.evaluations(args.run_id) if e.index == args.index), None)
    if evaluation is None:
        raise CommandError(f"run {args.run_id} has no evaluation {args.index}")
    if args.json:
        _print_json(evaluation.model_dump(mode="json"))
        return 0
    print(f"run {args.run_id} evaluation {evaluation.index}: step {evaluation.step}, policy v{evaluation.policy_version}, "
          f"{evaluation.environment}, {evaluation.status}" + (f" ({evaluation.reason})" if evaluation.reason else ""))
    print(f"  {evaluation.tasks} tasks x {evaluation.samples_per_task} samples, temperature {evaluation.temperature:g}, "
          f"{evaluation.episodes} episodes")
    for name in sorted(evaluation.metrics):
        print(f"  {name + ':':24}{_metric_cell(evaluation, name)}")
    return 0


def cmd_envs_register(args) -> int:
    settings = parse_assignments(args.setting or [], option="--setting")
    if args.settings:
        try:
            settings = merge_changes(json.loads(args.settings), settings)
        except ValueError as exc:
            raise CommandError(f"--settings: {exc}") from None
    tools = None
    if args.tools:
        try:
            tools = json.loads(Path(args.tools).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"--tools: {exc}") from None
    extra = parse_assignments(args.field or [], option="--field")
    for option, field, value in (("--tool-server", "command", args.tool_server),
                                 ("--tool-server-url", "url", args.tool_server_url)):
        if value:
            # Merged with what --field gave (e.g. tool_server.probe_calls), not in its place.
            given = extra.get("tool_server", {})
            if not isinstance(given, dict):
                raise CommandError(f"{option}: --field tool_server is not an object; give its fields as "
                                   "--field tool_server.<name>=<value>")
            extra["tool_server"] = {**given, field: value}
    if baseline := _baseline(args):
        extra["baseline"] = baseline
    with _client() as client:
        environment = client.environments.register(
            args.name, entrypoint=args.entrypoint, kind=args.kind, settings=settings or None, tools=tools,
            project=args.project, **extra,
        )
    version = environment.latest_version or {}
    print(f"environment {environment.name} registered (id {environment.id}, project {environment.project}); "
          f"version {version.get('number', '?')} is {version.get('status', '?')}")
    return 0


def cmd_envs_list(args) -> int:
    with _client() as client:
        environments = list(client.environments.list(project=args.project))
    if args.json:
        _print_json([environment.model_dump(mode="json") for environment in environments])
        return 0
    rows = [("NAME", "KIND", "PROJECT", "VERSION", "STATUS", "ENTRYPOINT")]
    rows += [(env.name, env.kind, str(env.project), str((env.latest_version or {}).get("number", "-")),
              (env.latest_version or {}).get("status", "-"), (env.latest_version or {}).get("entrypoint") or "-")
             for env in environments]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_envs_probe(args) -> int:
    """Probe again and print the report; exit 0 passed, 1 failed, 4 still pending after --wait."""
    with _client() as client:
        try:
            probe = client.environments.probe(args.name, project=args.project, wait_s=args.wait,
                                              baseline=_baseline(args))
        except EndpointUnavailable:
            print(f"the platform at {client.base_url} has no environment probe endpoint; "
                  "upgrade the platform to probe environments", file=sys.stderr)
            return 3
    if args.json:
        _print_json(probe)
    else:
        print(f"probe {probe['id']} of {args.name}: {probe['status']}")
        for check in probe.get("checks") or []:
            latency = check.get("latency_s")
            timing = f"{latency * 1000:.0f} ms" if isinstance(latency, int | float) else "-"
            print(f"  {check.get('name', '?'):<12} {check.get('status', '?'):<8} {timing:>8}  "
                  f"{check.get('message', '')}".rstrip())
    return {"passed": 0, "failed": 1}.get(probe["status"], 4)


def _baseline(args) -> dict[str, Any] | None:
    """The registration's or probe's ``baseline`` from --baseline-model and --baseline-episodes."""
    if not args.baseline_model:
        if args.baseline_episodes is not None:
            raise CommandError("--baseline-episodes: give the model with --baseline-model")
        return None
    baseline: dict[str, Any] = {"model": args.baseline_model}
    if args.baseline_episodes is not None:
        baseline["episodes"] = args.baseline_episodes
    return baseline


def _add_baseline_options(parser) -> None:
    parser.add_argument("--baseline-model", metavar="DIR",
                        help="an imported model's directory under the operator's model roots: the probe then "
                        "plays a few held-out episodes of it and reports how often it calls the tools")
    parser.add_argument("--baseline-episodes", type=int, metavar="N", help="those episodes (default 8, at most 64)")


def _json_file(path: str, *, option: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"{option} {path}: {exc}") from None


def cmd_sweep_create(args) -> int:
    base_config = _json_file(args.config, option="--config") if args.config else {}
    base_config = merge_changes(base_config, parse_assignments(args.set or [], option="--set"))
    with _client() as client:
        sweep = client.sweeps.create(
            environment=args.environment, search_space=_json_file(args.space, option="--space"), metric=args.metric,
            max_runs=args.max_runs, base_config=base_config, sampler=args.sampler, pruner=args.pruner,
            goal=args.goal, concurrency=args.concurrency, seed=args.seed, name=args.name, project=args.project)
    print(f"sweep {sweep['id']} {sweep['status']}: {len(sweep['trials'])} trial(s) started")
    return 0


def cmd_sweep_cancel(args) -> int:
    with _client() as client:
        sweep = client.sweeps.cancel(args.sweep_id)
    print(f"sweep {sweep['id']} {sweep['status']}")
    return 0


def cmd_sweep_show(args) -> int:
    with _client() as client:
        sweep = client.sweeps.get(args.sweep_id)
    if args.json:
        _print_json(sweep)
        return 0
    print(f"sweep {sweep['id']} {sweep['name']}: {sweep['status']} {sweep['status_reason']}".rstrip())
    print(f"{sweep['sampler']} sampler, {sweep['pruner']} pruner; {sweep['metric']} ({sweep['goal']})")
    for trial in sweep["trials"]:
        value = "—" if trial["value"] is None else f"{trial['value']:.4g}"
        print(f"  #{trial['number']:<3} run {trial['run'] or '—'}  {trial['state']:<8} {value:>8}  "
              f"{json.dumps(trial['params'], sort_keys=True)}  {trial['reason']}".rstrip())
    if sweep["best"]:
        print(f"best: trial {sweep['best']['number']} (run {sweep['best']['run']}), {sweep['best']['value']:.6g}")
    for name, share in sorted(sweep["importances"].items(), key=lambda item: -item[1]):
        print(f"importance of {name}: {share:.3f}")
    return 0


def _handled(command):
    def run(args) -> int:
        try:
            return command(args)
        except CommandError as exc:
            print(f"tandem: {exc}", file=sys.stderr)
            return 2
        except TandemAPIError as exc:
            print(f"tandem: {exc.message} ({exc.status_code} {exc.code})", file=sys.stderr)
            for field, messages in exc.fields.items():
                for message in messages:
                    print(f"  {field}: {message}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130

    return run


def register_subcommands(commands: argparse._SubParsersAction) -> None:
    """Add ``login``, ``runs`` and ``envs`` to the ``tandem`` command's subcommands."""
    login = commands.add_parser("login", help="save the platform's URL and your API token")
    login.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8000")
    login.add_argument("--token", required=True, help="your API token (the dashboard shows it)")
    login.set_defaults(func=_handled(cmd_login))

    runs = commands.add_parser("runs", help="create, list, show, cancel and watch runs")
    run_commands = runs.add_subparsers(dest="runs_command", required=True)

    create = run_commands.add_parser("create", help="queue a run")
    create.add_argument("--env", required=True, help="environment name")
    create.add_argument("--config", help="a JSON file with a (partial) RunConfig")
    create.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a config value, dotted for nested keys (model.num_layers=2); repeatable")
    create.add_argument("--name", default="")
    create.add_argument("--project", type=int, help="default: your only project")
    create.add_argument("--json", action="store_true", help="print the run as JSON")
    create.set_defaults(func=_handled(cmd_runs_create))

    list_ = run_commands.add_parser("list", help="your runs, newest first")
    list_.add_argument("--status", choices=[status.value for status in RunStatus])
    list_.add_argument("--limit", type=int, help="at most this many runs")
    list_.add_argument("--json", action="store_true")
    list_.set_defaults(func=_handled(cmd_runs_list))

    show = run_commands.add_parser("show", help="one run with its config")
    show.add_argument("run_id", type=int)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_handled(cmd_runs_show))

    for action, text in [("cancel", "stop a run for good"), ("pause", "checkpoint a run and let it wait"),
                         ("resume", "queue a paused or failed run again")]:
        sub = run_commands.add_parser(action, help=text)
        sub.add_argument("run_id", type=int)
        sub.set_defaults(func=_handled(_run_action(action)))

    clone = run_commands.add_parser("clone", help="a new run with the original's config and your changes")
    clone.add_argument("run_id", type=int)
    clone.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config change; repeatable")
    clone.add_argument("--name", default="")
    clone.set_defaults(func=_handled(cmd_runs_clone))

    watch = run_commands.add_parser(
        "watch", help="live progress until the run ends (exit 0 if it finished, 1 otherwise)")
    watch.add_argument("run_id", type=int)
    watch.add_argument("--tty", choices=["auto", "yes", "no"], default="auto",
                       help="redraw one progress bar (yes) or print lines (no); auto: bar on a terminal")
    watch.add_argument("--every-s", type=float, default=1.0,
                       help="without a terminal, at most one line this often (status changes always print)")
    watch.add_argument("--poll-s", type=float, default=5.0,
                       help="ask the REST API after this long without a WebSocket message")
    watch.set_defaults(func=_handled(cmd_runs_watch))

    evaluations = commands.add_parser("eval", help="a run's held-out evaluations")
    evaluation_commands = evaluations.add_subparsers(dest="eval_command", required=True)
    eval_list = evaluation_commands.add_parser("list", help="a run's evaluations, with their 95%% intervals")
    eval_list.add_argument("run_id", type=int)
    eval_list.add_argument("--json", action="store_true")
    eval_list.set_defaults(func=_handled(cmd_eval_list))
    eval_create = evaluation_commands.add_parser(
        "create", help="evaluate a run's kept checkpoint, or a model directory, in a run of its own, with no training",
        description="Give RUN_ID to evaluate one of its kept checkpoints, or --model DIR --environment NAME "
        "to evaluate a Hugging Face model as it is.")
    eval_create.add_argument("run_id", type=int, nargs="?", metavar="RUN_ID",
                             help="the run whose kept checkpoint to evaluate")
    eval_create.add_argument("--step", type=int, help="with RUN_ID: the checkpoint's step (default: the newest kept one)")
    eval_create.add_argument("--model", metavar="DIR",
                             help="a model directory on the platform's hosts, under the operator's TANDEM_MODEL_ROOTS "
                             "(tandem models import puts models there); relative: from the current directory")
    eval_create.add_argument("--environment", metavar="NAME[@VERSION]", help="with --model: the environment")
    eval_create.add_argument("--project", type=int, help="with --model: the project (default: your only one)")
    eval_create.add_argument("--set", action="append", metavar="KEY=VALUE",
                             help="an evaluation setting, e.g. tasks=64 or pass_k=[1,4] (default: the run's own, "
                             "or the defaults); repeatable")
    eval_create.add_argument("--config-set", action="append", metavar="KEY=VALUE",
                             help="with --model: a run config value, dotted for nested keys "
                             "(sampling.max_new_tokens=48); repeatable")
    eval_create.add_argument("--name", default="")
    eval_create.add_argument("--wait", action="store_true",
                             help="show its progress until it ends, then its results (exit 0 if it finished)")
    eval_create.add_argument("--tty", choices=["auto", "yes", "no"], default="auto",
                             help="with --wait: redraw one progress bar (yes) or print a line per change (no); "
                             "auto: bar on a terminal")
    eval_create.add_argument("--poll-s", type=float, default=1.0, help=argparse.SUPPRESS)
    eval_create.set_defaults(func=_handled(cmd_eval_create))
    eval_show = evaluation_commands.add_parser("show", help="one evaluation's every metric")
    eval_show.add_argument("run_id", type=int)
    eval_show.add_argument("index", type=int)
    eval_show.add_argument("--json", action="store_true")
    eval_show.set_defaults(func=_handled(cmd_eval_show))

    sweeps = commands.add_parser("sweep", help="sweeps: runs over a search space, sampled and pruned by Optuna")
    sweep_commands = sweeps.add_subparsers(dest="sweep_command", required=True)
    sweep_create = sweep_commands.add_parser(
        "create", help="start a sweep", description="Runs of a base config over a search space (a JSON file of "
        'config paths and distributions, e.g. {"rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, '
        '"log": true}}), judged by --metric.')
    sweep_create.add_argument("--environment", required=True, metavar="NAME[@VERSION]")
    sweep_create.add_argument("--space", required=True, metavar="FILE", help="the search space, a JSON file")
    sweep_create.add_argument("--metric", required=True, help="the series a trial is judged by, e.g. reward_mean")
    sweep_create.add_argument("--max-runs", type=int, required=True)
    sweep_create.add_argument("--config", metavar="FILE", help="the base run config, a JSON file")
    sweep_create.add_argument("--set", action="append", metavar="KEY=VALUE", help="a base config value; repeatable")
    sweep_create.add_argument("--sampler", choices=["grid", "random", "tpe"], default="tpe")
    sweep_create.add_argument("--pruner", choices=["none", "median", "successive_halving"], default="none")
    sweep_create.add_argument("--goal", choices=["maximize", "minimize"], default="maximize")
    sweep_create.add_argument("--concurrency", type=int, default=1, help="runs at a time")
    sweep_create.add_argument("--seed", type=int, default=0)
    sweep_create.add_argument("--name", default="")
    sweep_create.add_argument("--project", type=int, help="default: your only project")
    sweep_create.set_defaults(func=_handled(cmd_sweep_create))
    sweep_cancel = sweep_commands.add_parser("cancel", help="stop a sweep: its running trials' runs are cancelled")
    sweep_cancel.add_argument("sweep_id", type=int)
    sweep_cancel.set_defaults(func=_handled(cmd_sweep_cancel))
    sweep_show = sweep_commands.add_parser("show", help="a sweep's trials, best run and parameter importances")
    sweep_show.add_argument("sweep_id", type=int)
    sweep_show.add_argument("--json", action="store_true")
    sweep_show.set_defaults(func=_handled(cmd_sweep_show))

    envs = commands.add_parser("envs", help="register, list and probe environments")
    env_commands = envs.add_subparsers(dest="envs_command", required=True)

    register = env_commands.add_parser("register", help="register an environment in a project")
    register.add_argument("name")
    register.add_argument("--entrypoint", help="module:Class, importable by rollout producers")
    register.add_argument("--kind", help="default: the platform's (python)")
    register.add_argument("--settings", help="the class's or adapter's keyword arguments as a JSON object")
    register.add_argument("--setting", action="append", metavar="KEY=VALUE",
                          help="one keyword argument; repeatable")
    register.add_argument("--tools", metavar="FILE", help="a JSON file: the tools' schemas, a list")
    register.add_argument("--tool-server", metavar="NAME",
                          help="an MCP server of the operator's TANDEM_MCP_SERVERS that episodes also take tools "
                          "from (declare its tools with --tools; the probe lists them)")
    register.add_argument("--tool-server-url", metavar="URL",
                          help="instead, a streamable-HTTP MCP server's endpoint that episodes take tools from, "
                          "under the environment URL rules (declare its tools with --tools)")
    register.add_argument("--field", action="append", metavar="KEY=VALUE",
                          help="any other registration field the platform accepts, sent as is; repeatable")
    register.add_argument("--project", type=int, help="default: your only project")
    _add_baseline_options(register)
    register.set_defaults(func=_handled(cmd_envs_register))

    env_list = env_commands.add_parser("list", help="environments of your projects")
    env_list.add_argument("--project", type=int)
    env_list.add_argument("--json", action="store_true")
    env_list.set_defaults(func=_handled(cmd_envs_list))

    probe = env_commands.add_parser("probe", help="probe an environment's newest version again and show the report")
    probe.add_argument("name")
    probe.add_argument("--project", type=int)
    probe.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a worker to run it")
    probe.add_argument("--json", action="store_true")
    _add_baseline_options(probe)
    probe.set_defaults(func=_handled(cmd_envs_probe))
