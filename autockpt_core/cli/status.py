"""``autockpt status DIR``: what stopping the job that writes DIR would cost now.

Reads ``DIR/autockpt-status.json`` (:mod:`autockpt_core.run_status`); a directory without one
(a URL, a run with ``status_file=False``, or one written before the file existed) is answered from
its manifest: the last durable checkpoint, the other figures unknown. A directory that has
neither is not autockpt's: a clear error. ``--json`` prints the keys of
:data:`~autockpt_core.run_status.KEYS` (``state`` ``unknown`` where only the manifest spoke).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
from typing import Any

from rich.console import Console
from rich.table import Table

from ..persist.manifest import MANIFEST_NAME, read_manifest
from ..persist.storage import storage_for
from ..run_status import KEYS, STATUS_NAME, read_status

HELP = "what stopping the job that writes a checkpoint directory would cost now (its status file)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirpath", help="checkpoint directory (or URL: its manifest only)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def status_of(dirpath: str) -> dict[str, Any]:
    """The status of ``dirpath``; ``ValueError`` naming it where it is not autockpt's."""
    local = "://" not in dirpath
    if local and not os.path.isdir(dirpath):
        raise ValueError(f"{dirpath} is not a directory")
    found = read_status(dirpath) if local else None
    if found is not None:
        return {key: found.get(key) for key in KEYS} | {"source": STATUS_NAME}
    storage = storage_for(dirpath)
    if not storage.exists(MANIFEST_NAME):
        raise ValueError(f"{dirpath} is not an autockpt directory: it has no {STATUS_NAME} and no {MANIFEST_NAME}")
    records = read_manifest(storage)
    newest = max(records, key=lambda r: r.seq) if records else None
    status: dict[str, Any] = dict.fromkeys(KEYS)
    status.update(state="unknown", source=MANIFEST_NAME)
    if newest is not None:
        status.update(last_durable_step=newest.step, last_durable_time=newest.created, run=newest.run)
    return status


def _process(status: dict[str, Any]) -> str:
    host, pid = status.get("host"), status.get("pid")
    if host is None or pid is None:
        return "-"
    if host != socket.gethostname():
        return f"{pid} on {host} (another host: not checked)"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return f"{pid} on {host}: not running"
    except PermissionError:
        pass
    return f"{pid} on {host}: running"


def _when(seconds: Any) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(float(seconds)).isoformat(sep=" ", timespec="seconds")


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f} s"


def run(args: argparse.Namespace) -> int:
    status = status_of(args.dirpath)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    table = Table(title=f"autockpt status of {args.dirpath} (from {status['source']})", show_header=False)
    table.add_column("", justify="left")
    table.add_column("", justify="left")
    rows = [
        ("state", str(status["state"])),
        ("step", "-" if status["step"] is None else str(status["step"])),
        ("last durable step", "-" if status["last_durable_step"] is None else str(status["last_durable_step"])),
        ("last durable at", _when(status["last_durable_time"])),
        ("work at risk", _seconds(status["work_at_risk_s"])),
        ("emergency checkpoint", _seconds(status["emergency_checkpoint_s"])),
        ("next checkpoint step", "-" if status["next_checkpoint_step"] is None else str(status["next_checkpoint_step"])),
        *([("signal to durable", _seconds(status["signal_to_durable_s"]))] if status["signal_to_durable_s"] else []),
        ("process", _process(status)),
        ("updated", _when(status["updated"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(width=120).print(table)
    return 0
