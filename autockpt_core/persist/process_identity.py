"""Which process holds a claim: enough to tell whether a process id on this machine is still it.

A host name and a pid are not enough. Containers with host networking (the usual NCCL setup)
share the host name and have PID namespaces of their own, often each with its job as pid 1; a
pid of another namespace means nothing here, and a pid that ended may be reused. So a claim
records the machine's boot id, the holder's PID namespace and its start time (clock ticks since
boot) besides host and pid (:class:`ProcessIdentity`), and a reader trusts the pid only where
host, boot id and PID namespace are its own (:meth:`ProcessIdentity.shares_pid_space`): then
the process with that pid is the holder exactly when its start time matches
(:func:`still_running`). Anywhere else (another namespace, another boot, a system without
Linux's ``/proc``, a claim written before these fields) the claim is judged as another host's,
by its heartbeat.

A process whose ``/proc`` is not its own namespace's (a container that mounted the host's)
reads pids it cannot trust; :func:`pid_namespace` returns None there, so nothing is trusted.
Pure reads of ``/proc``; any thread.
"""

from __future__ import annotations

import dataclasses
import os
import socket

__all__ = ["ProcessIdentity", "boot_id", "pid_namespace", "start_ticks", "still_running"]


def boot_id() -> str | None:
    """This boot of the machine (Linux), or None where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[inode]``), or None where ``/proc`` is not this
    namespace's (or absent): pids read there would be another namespace's."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid():
            return None
        return os.readlink("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` of this namespace started (clock ticks since boot); None when no
    such process runs (or ``/proc`` cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the command name, in parentheses, may hold spaces: the fields after its last ')'
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """A process as a claim records it; fields None where this system cannot tell them."""

    host: str
    pid: int
    boot: str | None
    pid_ns: str | None
    started: int | None

    @classmethod
    def current(cls) -> ProcessIdentity:
        pid = os.getpid()
        ns = pid_namespace()
        return cls(socket.gethostname(), pid, boot_id(), ns, start_ticks(pid) if ns is not None else None)

    def shares_pid_space(self, host: str, boot: str | None, pid_ns: str | None) -> bool:
        """Whether a pid recorded with ``host``, ``boot`` and ``pid_ns`` names a process this
        one can look up: the same host, boot and PID namespace, all known."""
        return (
            self.boot is not None and self.pid_ns is not None
            and (host, boot, pid_ns) == (self.host, self.boot, self.pid_ns)
        )  # fmt: skip

    def is_process(self, pid: int, started: int | None) -> bool:
        """Whether ``pid``/``started`` (recorded in a space this one shares) is this process."""
        return pid == self.pid and started == self.started


def still_running(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` (ticks; of a PID space this
    process shares) still runs: a pid reused by a later process does not count."""
    now = start_ticks(pid)
    return now is not None and (started is None or now == started)
