"""A deadline as a source of preemption: the emergency checkpoint starts early enough to be durable before it.

Slurm time limits and reserved slots end a job at a known time, mid-interval. ``deadline``
(:class:`~autockpt_core.config.Config`) names that time: a duration from the process start
(``"3h50m"``, or seconds), a wall time (``"2026-11-28T23:00:00+00:00"``; without an offset, the
machine's local time), ``"slurm"`` (the default: Slurm's end time of the job where the
environment gives it, ``SLURM_JOB_END_TIME``, else ``squeue``; nothing outside Slurm), or None.

:class:`DeadlineWatch` is a :class:`~autockpt_core.preemption_sources.PreemptionSource`: a
daemon thread that, once ``now ≥ end − lead``, requests the emergency checkpoint the way a
signal does (``SIGTERM``): the driver takes it at the next step boundary, agreed over processes,
and the run exits with the preemption status (143: non-zero, so a scheduler that requeues on
failure requeues it; the rerun resumes there). ``lead`` is the measured cost of an emergency
checkpoint now (stall + persist, and one step to reach a boundary) × 1.5 + 2 s, or
:data:`UNMEASURED_LEAD_S` before anything was measured.

Call order: :func:`resolve` at construction (``Config``) and at the fit's start
(:func:`~autockpt_core.preemption_sources.preemption_for`); the watch is started when the
preemption handler installs and stopped when it uninstalls. Threading: the watch's own thread
reads the lead (a float the training thread updates) and calls the handler's ``request``.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError
from .polling_source import PollingSource
from .units import parse_duration

log = logging.getLogger("autockpt")

UNMEASURED_LEAD_S = 10.0  # before a checkpoint was measured: the emergency checkpoint's guess
MARGIN_S = 2.0
_IMPORTED_AT = time.time()


def process_start() -> float:
    """This process's start (Unix seconds): from /proc on Linux, else when autockpt was imported."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time since boot
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def slurm_end(environ: Mapping[str, str] | None = None) -> float | None:
    """The Slurm job's end time (Unix seconds), where the environment gives it; None outside Slurm."""
    env = os.environ if environ is None else environ
    end = env.get("SLURM_JOB_END_TIME", "")
    if end.isdigit():
        return float(end)
    job = env.get("SLURM_JOB_ID")
    if not job or shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=5)
        return datetime.datetime.fromisoformat(out.stdout.strip()).timestamp()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def resolve(value: Any, *, started: float | None = None, environ: Mapping[str, str] | None = None) -> float | None:
    """``deadline``'s end time in Unix seconds (None: no deadline). ``started``: the process start
    a duration counts from (default :func:`process_start`). Raises :class:`ConfigError` for a
    value that is none of the forms in the module docstring."""
    if value is None or value is False or value == "off":
        return None
    if value == "slurm":
        return slurm_end(environ)
    if isinstance(value, str) and len(value) >= 10 and value[4:5] == "-" and value[7:8] == "-":
        try:
            return datetime.datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    else:
        try:
            seconds = parse_duration(value)
        except (TypeError, ValueError):
            seconds = None
        if seconds is not None and seconds > 0:
            return (process_start() if started is None else started) + seconds
    raise ConfigError(
        "deadline", value,
        "must be a duration from the process start, an ISO wall time, 'slurm' or None",
        "pass e.g. deadline='3h50m', deadline='2026-11-28T23:00:00+00:00', 'slurm' (Slurm's end time) or None",
    )  # fmt: skip


class DeadlineWatch(PollingSource):
    """Requests the emergency checkpoint ``lead()`` seconds before ``end`` (see the module docstring).

    ``lead``: the measured emergency cost (seconds, or None before a measurement); ``wall``: the
    clock (injected in tests). ``requested_at``: when it asked (None: not yet).
    """

    name = "deadline"
    thread_name = "autockpt-deadline"

    def __init__(self, end: float, lead: Callable[[], float | None] = lambda: None, *,
                 wall: Callable[[], float] = time.time, poll_s: float = 0.5) -> None:  # fmt: skip
        super().__init__()
        self.end = end
        self.lead = lead
        self._wall = wall
        self._poll_s = poll_s
        self.requested_at: float | None = None

    def start_s(self) -> float:
        """When the request goes out, given the lead measured now (Unix seconds)."""
        measured = self.lead()
        lead = UNMEASURED_LEAD_S if measured is None else 1.5 * measured + MARGIN_S
        return self.end - lead

    def check(self, request: Callable[[int, str], None]) -> bool:
        """One look at the clock: request once it is time; True when it did (now or before)."""
        if self.requested_at is None and self._wall() >= self.start_s():
            self.requested_at = self._wall()
            log.warning("autockpt: the deadline (%s) is %.0f s away: taking the emergency checkpoint",
                        time.strftime("%H:%M:%S", time.localtime(self.end)), self.end - self.requested_at)  # fmt: skip
            request(signal.SIGTERM, self.name)
        return self.requested_at is not None

    def wait_s(self) -> float:
        return max(0.05, min(self._poll_s, self.start_s() - self._wall()))
