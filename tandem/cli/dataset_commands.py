"""``tandem datasets register|list|show``: SFT datasets from a shell (see docs/datasets.md)."""

from __future__ import annotations

import argparse
import json
import sys

from tandem.cli.client_commands import CommandError, _client, _handled, _print_json


def cmd_datasets_register(args) -> int:
    if (args.file is None) == (args.path is None):
        raise CommandError("give a FILE to upload, or --path for a file on the platform's host")
    with _client() as client:
        accepted = client.datasets.register(args.name, args.file, path=args.path, project=args.project, wait=False)
        checked = accepted.latest_version or {}
        if not args.no_wait:
            print(f"dataset {accepted.name} version {checked.get('number', '?')} checked: "
                  f"{checked.get('row_count', '?')} rows; waiting for the platform to store them", file=sys.stderr)
            dataset = client.datasets.wait_ready(accepted.id, accepted.version, timeout=args.timeout)
        else:
            dataset = accepted
    version = dataset.latest_version or {}
    if args.no_wait:
        print(f"dataset {dataset.name} version {version.get('number', '?')} accepted (id {dataset.id}, project "
              f"{dataset.project}): {version.get('row_count', '?')} rows being stored; "
              f"`tandem datasets show {dataset.name}` says when it is ready")
        return 0
    print(f"dataset {dataset.name} version {version.get('number', '?')} registered (id {dataset.id}, "
          f"project {dataset.project}): {version.get('row_count', '?')} rows, {version.get('size_bytes', '?')} bytes")
    return 0


def cmd_datasets_list(args) -> int:
    with _client() as client:
        datasets = list(client.datasets.list(project=args.project))
    if args.json:
        _print_json([dataset.model_dump(mode="json") for dataset in datasets])
        return 0
    rows = [("NAME", "PROJECT", "VERSION", "ROWS", "BYTES")]
    rows += [(dataset.name, str(dataset.project), str(dataset.version or "-"), str(dataset.row_count),
              str((dataset.latest_version or {}).get("size_bytes", "-"))) for dataset in datasets]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_datasets_show(args) -> int:
    """The dataset's versions, and with --rows N its first N rows of a version as JSONL."""
    with _client() as client:
        dataset = client.datasets.get(args.name, project=args.project)
        if args.rows:
            for index, row in enumerate(client.datasets.rows(args.name, version=args.version, project=args.project)):
                if index >= args.rows:
                    break
                print(json.dumps({"messages": row["messages"], "metadata": row["metadata"]}))
            return 0
    if args.json:
        _print_json(dataset.model_dump(mode="json"))
        return 0
    print(f"dataset {dataset.name} (id {dataset.id}, project {dataset.project})")
    for version in dataset.versions or []:
        state = "" if version.get("status", "ready") == "ready" else f" [{version['status']}]"
        print(f"  v{version['number']}{state}: {version['row_count']} rows, {version['size_bytes']} bytes, "
              f"{version['source']} {version['source_name']}, sha256 {version['sha256'][:12]}")
    return 0


def register_dataset_subcommands(commands: argparse._SubParsersAction) -> None:
    """Add ``datasets`` to the ``tandem`` command's subcommands."""
    datasets = commands.add_parser("datasets", help="register and list SFT datasets (JSONL chat conversations)")
    dataset_commands = datasets.add_subparsers(dest="datasets_command", required=True)

    register = dataset_commands.add_parser(
        "register", help="upload a JSONL file as the next version of a dataset (version 1 for a new name)")
    register.add_argument("name")
    register.add_argument("file", nargs="?", help="the JSONL file to upload")
    register.add_argument("--path", help="instead: a file on the platform's host, under TANDEM_DATASET_ROOTS")
    register.add_argument("--project", type=int, help="default: your only project")
    register.add_argument("--no-wait", action="store_true",
                          help="return once the file is checked, before the platform has stored its rows")
    register.add_argument("--timeout", type=float, default=1800.0,
                          help="seconds to wait for the rows to be stored (default 1800)")
    register.set_defaults(func=_handled(cmd_datasets_register))

    list_ = dataset_commands.add_parser("list", help="datasets of your projects")
    list_.add_argument("--project", type=int)
    list_.add_argument("--json", action="store_true")
    list_.set_defaults(func=_handled(cmd_datasets_list))

    show = dataset_commands.add_parser("show", help="a dataset's versions, or its rows with --rows")
    show.add_argument("name")
    show.add_argument("--project", type=int)
    show.add_argument("--version", type=int, help="with --rows: default the newest")
    show.add_argument("--rows", type=int, default=0, help="print the first N rows as JSONL")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_handled(cmd_datasets_show))
