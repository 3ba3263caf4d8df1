"""A cloud's preemption notice as a source of preemption: the metadata service says the VM will go.

Spot and preemptible VMs announce their end 30 s to 2 min ahead through the metadata service,
not a signal. ``preemption_notice`` (:class:`~autockpt_core.config.Config`) names where to look:

- ``"aws"``: IMDSv2 (a token from ``PUT /latest/api/token``, then
  ``GET /latest/meta-data/spot/instance-action``: 404 until a notice, then its JSON; without a
  token, IMDSv1's plain GET);
- ``"gce"``: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``
  (``TRUE`` once preempted);
- ``"azure"``: Scheduled Events (``GET /metadata/scheduledevents?api-version=2020-07-01`` with
  ``Metadata: true``; an event of type ``Preempt``);
- an ``http(s)://`` URL: HTTP 200 with a non-empty body is a notice (404, 204 or an empty body:
  none).

A provider's form takes another base URL after a colon (``"aws:http://127.0.0.1:8080"``), for a
proxy or a test server. :class:`NoticeWatch` is a
:class:`~autockpt_core.preemption_sources.PreemptionSource`: a daemon thread polls every
``notice_poll_interval`` (default 5 s) with 1 s timeouts, never on the training thread; a notice
is requested like a SIGTERM (the driver commits the emergency checkpoint at the next step
boundary, agreed over processes, and exits 143). An endpoint that cannot be reached is logged
once (and once more when it answers again), not at every poll.

Call order: :func:`parse_notice` at construction (``Config``); the watch is built by
:func:`~autockpt_core.preemption_sources.preemption_for`, started and stopped with the handler.
"""

from __future__ import annotations

import json
import logging
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .polling_source import PollingSource

log = logging.getLogger("autockpt")

PROVIDERS = {"aws": "http://169.254.169.254", "gce": "http://metadata.google.internal", "azure": "http://169.254.169.254"}
TIMEOUT_S = 1.0


def parse_notice(value: Any) -> tuple[str, str] | None:
    """``(provider, base URL)`` of a ``preemption_notice`` (``provider`` "url" for a plain URL);
    None for None. Raises :class:`ConfigError` for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        provider, _, base = value.partition(":")
        if provider in PROVIDERS and (not base or base.startswith(("http://", "https://"))):
            return provider, (base or PROVIDERS[provider]).rstrip("/")
        if value.startswith(("http://", "https://")):
            return "url", value
    raise ConfigError(
        "preemption_notice", value, "is not a cloud provider or an http(s) URL",
        "pass 'aws', 'gce', 'azure' (optionally with a base URL: 'aws:http://127.0.0.1:8080'), "
        "a URL that answers 200 with a body on a notice, or None",
    )  # fmt: skip


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the user's endpoint
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:  # an answer: 404 and the like
        return error.code, ""


def probe(provider: str, base: str) -> str | None:
    """One look at the endpoint: the notice (a short text) or None. Raises ``OSError`` where the
    endpoint cannot be reached."""
    if provider == "aws":
        status, token = _get(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT")
        headers = {"X-aws-ec2-metadata-token": token} if status == 200 and token else {}
        status, body = _get(f"{base}/latest/meta-data/spot/instance-action", headers)
        return body.strip() if status == 200 and body.strip() else None
    if provider == "gce":
        status, body = _get(f"{base}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
        return "instance/preempted is TRUE" if status == 200 and body.strip().upper() == "TRUE" else None
    if provider == "azure":
        status, body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        data = json.loads(body) if status == 200 and body.strip() else {}
        events = data.get("Events", []) if isinstance(data, dict) else []
        preempts = [e for e in events if e.get("EventType") == "Preempt"]
        return f"a Preempt event (not before {preempts[0].get('NotBefore', '?')})" if preempts else None
    status, body = _get(base, {})
    return body.strip()[:200] if status == 200 and body.strip() else None


class NoticeWatch(PollingSource):
    """Polls one endpoint (see the module docstring); ``noticed``: the notice, once seen."""

    name = "preemption notice"
    thread_name = "autockpt-notice"
    join_timeout_s = TIMEOUT_S * 3

    def __init__(self, provider: str, base: str, *, poll_s: float = 5.0,
                 probe_once: Callable[[str, str], str | None] = probe) -> None:  # fmt: skip
        super().__init__()
        self.provider, self.base, self.poll_s = provider, base, poll_s
        self._probe = probe_once
        self._unreachable = False
        self.noticed: str | None = None

    def check(self, request: Callable[[int, str], None]) -> bool:
        """One poll: request on a notice; True once there was one."""
        try:
            notice = self._probe(self.provider, self.base)
        except (OSError, ValueError) as error:  # unreachable, or an answer that is not the service's
            if not self._unreachable:
                self._unreachable = True
                log.warning("autockpt: cannot read the %s preemption notice at %s (%s); polling goes on every "
                            "%g s", self.provider, self.base, error, self.poll_s)  # fmt: skip
            return False
        if self._unreachable:
            self._unreachable = False
            log.warning("autockpt: the %s preemption notice at %s answers again", self.provider, self.base)
        if notice is None:
            return False
        self.noticed = notice
        log.warning("autockpt: %s preemption notice (%s): taking the emergency checkpoint", self.provider, notice)
        request(signal.SIGTERM, self.name)
        return True

    def wait_s(self) -> float:
        return self.poll_s
