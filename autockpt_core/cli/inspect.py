"""``autockpt inspect DIR``: the checkpoints in a directory in commit order (newest last), with
checksum status, the framework and the run that wrote each, why each was taken, and which one a
rerun resumes from (per framework: the newest whose file verifies, as the callbacks choose;
without verifying, the newest listed). Under the table: the resume point and, where the
directory has a status file, the state its last run ended in (finished, preempted, failed)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os

from rich.console import Console
from rich.table import Table

from ..persist.manifest import MANIFEST_NAME, read_manifest, verify
from ..persist.storage import Storage, storage_for
from ..run_status import STATUS_NAME, read_status
from ..units import format_size

HELP = "list the checkpoints in a directory with step, time, size and checksum status"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirpath", help="checkpoint directory (or URL)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-verify", action="store_true", help="skip reading files to verify checksums")
    parser.add_argument(
        "--storage-options",
        type=storage_options_arg,
        default=None,
        metavar="JSON",
        help="fsspec options for a URL, as a JSON object, e.g. "
        "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (or a YAML/TOML file holding the "
        "callback's config, whose storage_options are used)",
    )


def storage_options_arg(text: str) -> dict[str, object]:
    """``--storage-options``: a JSON object, or the path of a config file with storage_options."""
    if text.lstrip().startswith("{"):
        value = json.loads(text)
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError("--storage-options must be a JSON object")
        return value
    from ..config import Config

    options = Config.from_file(text).storage_options
    if options is None:
        raise argparse.ArgumentTypeError(f"{text} has no storage_options")
    return dict(options)


def checkpoint_storage(dirpath: str, storage_options: dict[str, object] | None) -> Storage:
    """The storage of an autockpt directory (or URL); ``ValueError`` naming it where it is missing,
    not a directory, or holds no manifest (``inspect`` and ``export`` read one)."""
    if "://" not in dirpath and not os.path.isdir(dirpath):
        raise ValueError(f"{dirpath} {'is not a directory' if os.path.exists(dirpath) else 'does not exist'}")
    storage = storage_for(dirpath, storage_options)
    if not storage.exists(MANIFEST_NAME):
        raise ValueError(f"no autockpt manifest ({MANIFEST_NAME}) in {storage.location}")
    return storage


def run(args: argparse.Namespace) -> int:
    storage = checkpoint_storage(args.dirpath, args.storage_options)
    records = read_manifest(storage)
    rows = []
    for r in records:
        status = "unchecked" if args.no_verify else (verify(storage, r) or "ok")
        rows.append(
            {
                "seq": r.seq,
                "name": r.name,
                "step": r.step,
                "epoch": r.epoch,
                "created": dt.datetime.fromtimestamp(r.created).isoformat(timespec="seconds"),
                "size": r.size,
                "checksum": f"{r.algorithm}:{r.checksum}",
                "status": status,
                "framework": r.framework,
                "run": r.run,
                "reason": r.meta.get("reason"),
                "exact": not r.meta.get("not_exact"),
                "resume": False,
            }
        )
    resumes = _resume_rows(rows)
    for row in resumes:
        row["resume"] = True
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0 if all(row["status"] in ("ok", "unchecked") for row in rows) else 1
    table = Table(title=f"autockpt checkpoints in {storage.location}")
    for col in ("seq", "step", "epoch", "created", "size", "checksum", "status", "framework", "run", "why", "name"):
        table.add_column(col, justify="right" if col in ("seq", "step", "epoch", "size") else "left")
    for row in rows:
        table.add_row(
            str(row["seq"]) + (" *" if row["resume"] else ""),
            str(row["step"]),
            "" if row["epoch"] is None else str(row["epoch"]),
            str(row["created"]),
            format_size(int(row["size"])),  # type: ignore[arg-type]
            str(row["checksum"]),
            str(row["status"]) + ("" if row["exact"] else " (not exact)"),
            str(row["framework"]),
            str(row["run"] or "")[:8],  # the first 8 hex digits tell runs apart
            str(row["reason"] or ""),
            str(row["name"]),
        )
    console = Console(width=160)
    console.print(table)
    for line in _footer(args.dirpath, resumes, bool(rows)):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0 if all(row["status"] in ("ok", "unchecked") for row in rows) else 1


def _resume_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per framework, the row a rerun resumes from: the newest that verified (or was not checked)."""
    newest: dict[object, dict[str, object]] = {}
    for row in rows:
        if row["status"] in ("ok", "unchecked"):
            newest[row["framework"]] = row
    return list(newest.values())


def _footer(dirpath: str, resumes: list[dict[str, object]], listed: bool) -> list[str]:
    """The lines under the table: the resume point per framework and the last run's end state."""
    lines = [
        f"* a rerun resumes from step {row['step']} ({row['name']}, {row['framework']})"
        + ("" if row["status"] == "ok" else ", not verified")
        for row in resumes
    ]
    if listed and not resumes:
        lines.append("no checkpoint verifies: a rerun starts from scratch (the files are kept)")
    status = read_status(dirpath) if "://" not in dirpath else None
    if status is not None and status.get("state"):
        lines.append(f"last run: {status['state']} ({STATUS_NAME}; autockpt status {dirpath} for more)")
    return lines
