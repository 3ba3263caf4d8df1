"""Why object storage failed, and what to do about it: credentials, endpoint, bucket, permission.

:func:`diagnose` reads an exception raised through fsspec, s3fs or botocore (the exception, its
``__cause__`` and ``__context__``, outermost first) and names the cause with a one-line fix. It
goes by class names and S3 error codes (``ClientError.response["Error"]["Code"]``; s3fs raises
``PermissionError``/``FileNotFoundError`` with the ``ClientError`` as ``__cause__``), so this
module imports neither botocore nor s3fs: the core stays importable without them. A plain local
``OSError`` is not diagnosed here: :func:`~.failures.fix_for` answers it from its errno.

:func:`check_reachable` sends one request to an ``s3://`` location with the storage's own
settings but no retries, so that a wrong endpoint fails in one connect attempt instead of
botocore's and s3fs' retries (about 20 s against a closed port), and a missing bucket is named
instead of created (s3fs' ``makedirs`` creates it) or read as an empty directory. The session's
probe (:func:`~.directory.probe`) and every ``autockpt`` command on an ``s3://`` DIR
(``autockpt_core.cli.commands``) call it first; both then say the same thing, from :func:`diagnose`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator

from ..errors import StorageError
from .storage import FsspecStorage, Storage

CREDENTIALS, ENDPOINT, BUCKET, PERMISSION = "credentials", "endpoint", "bucket", "permission"
"""The causes :func:`diagnose` tells apart (``Diagnosis.cause``, ``StorageError.cause``)."""

GIVE_CREDENTIALS = (
    'set storage_options={"key": ..., "secret": ...}, or the variables AWS_ACCESS_KEY_ID and '
    'AWS_SECRET_ACCESS_KEY (or AWS_PROFILE); for a public bucket, storage_options={"anon": True}'
)
POLICY = (
    "the credentials' policy must allow s3:ListBucket on the bucket and s3:GetObject, s3:PutObject "
    "and s3:DeleteObject on the objects under {field} (autockpt inspect needs s3:ListBucket and s3:GetObject)"
)


@dataclasses.dataclass(frozen=True)
class _Rule:
    """One cause: the exception class names (anywhere in an exception's MRO) or S3 error codes
    that show it, what to say and the fix (``{field}`` and ``{bucket}`` are filled in)."""

    cause: str
    problem: str
    fix: str
    names: frozenset[str] = frozenset()
    codes: frozenset[str] = frozenset()


RULES: tuple[_Rule, ...] = (
    _Rule(CREDENTIALS, "no credentials were found", GIVE_CREDENTIALS,
          names=frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"})),
    _Rule(CREDENTIALS, "the AWS profile does not exist",
          "name a profile of ~/.aws/config in AWS_PROFILE (or storage_options={\"profile\": ...}), "
          f"or unset it and {GIVE_CREDENTIALS}",
          names=frozenset({"ProfileNotFound"})),
    _Rule(CREDENTIALS, "the server rejected the credentials",
          'check the key and secret (and the token of temporary credentials) in storage_options={"key": ..., '
          '"secret": ..., "token": ...}, which win over the variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, '
          "AWS_SESSION_TOKEN and AWS_PROFILE; renew expired ones",
          codes=frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                           "TokenRefreshRequired", "InvalidClientTokenId"})),
    _Rule(ENDPOINT, "the storage endpoint cannot be reached",
          'check storage_options={"endpoint_url": ...} (or AWS_ENDPOINT_URL): http or https, host and port, '
          "and that the server is up and reachable from this machine (network, proxy, firewall)",
          names=frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError",
                           "ClientConnectorError", "SSLError"})),
    _Rule(ENDPOINT, "the storage endpoint did not answer in time",
          'check that the server at storage_options={"endpoint_url": ...} (or AWS_ENDPOINT_URL) is healthy, '
          'or allow longer: storage_options={"config_kwargs": {"read_timeout": SECONDS}}',
          names=frozenset({"ReadTimeoutError"})),
    _Rule(BUCKET, "the bucket {bucket} does not exist",
          "create the bucket, or fix its name in {field}",
          codes=frozenset({"NoSuchBucket"})),
    _Rule(BUCKET, "the bucket {bucket} does not exist and its name belongs to another account",
          "create a bucket of your own and point {field} to it",
          codes=frozenset({"BucketAlreadyExists"})),
    _Rule(PERMISSION, "access denied", POLICY,
          codes=frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem"})),
    _Rule(PERMISSION, "access denied (HTTP 403 without detail: wrong credentials, or a policy that forbids it)",
          f"check the credentials ({GIVE_CREDENTIALS}); {POLICY}",
          codes=frozenset({"403"})),
)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: ``cause`` (one of :data:`CREDENTIALS`, :data:`ENDPOINT`,
    :data:`BUCKET`, :data:`PERMISSION`), ``problem`` (a phrase), ``detail`` (the exception's type
    and message) and ``fix``."""

    cause: str
    problem: str
    detail: str
    fix: str

    def sentence(self) -> str:
        """``problem (detail). Fix: fix``, as ``autockpt`` prints it (the callbacks' ``ConfigError``
        and :class:`~autockpt_core.errors.StorageError` put the location first)."""
        return f"{self.problem} ({self.detail}). Fix: {self.fix}"


def diagnose(error: BaseException, location: str | None = None, field: str = "dirpath") -> Diagnosis | None:
    """The cause of an object storage error, or None when it shows none of :data:`RULES` (a local
    ``OSError``, say). ``location`` (the URL) names the bucket, ``field`` the setting that points
    there (``dirpath`` or ``mirror``). A :class:`~autockpt_core.errors.StorageError` gives its own."""
    if isinstance(error, StorageError):
        return Diagnosis(error.cause, error.problem, error.detail, error.fix)
    for exc in _chain(error):
        names = {klass.__name__ for klass in type(exc).__mro__}
        code = _error_code(exc)
        for rule in RULES:
            if names & rule.names or code in rule.codes:
                bucket = _bucket(location) or "named in " + field
                return Diagnosis(rule.cause, rule.problem.replace("{bucket}", bucket), _detail(exc),
                                 rule.fix.replace("{field}", field).replace("{bucket}", bucket))
        if isinstance(exc, ValueError) and str(exc).startswith("Invalid endpoint"):  # botocore's, at client creation
            return Diagnosis(ENDPOINT, "the endpoint URL is malformed", _detail(exc),
                             'set storage_options={"endpoint_url": "http(s)://HOST:PORT"} (or AWS_ENDPOINT_URL)')
    return None


def storage_error(error: BaseException, location: str, field: str = "dirpath") -> StorageError | None:
    """:func:`diagnose` as the exception to raise (``from error``), or None when it finds no cause."""
    found = diagnose(error, location, field)
    if found is None:
        return None
    return StorageError(location, found.cause, found.problem, found.detail, found.fix)


def check_reachable(storage: Storage, field: str = "dirpath") -> None:
    """One listing request (``list_objects_v2``, at most one key) to an ``s3://`` ``storage``, with
    its own options and timeouts but no retries; a failure :func:`diagnose` explains is raised as
    ``StorageError`` (``from`` the original), any other is left to the caller's real requests (they
    retry). A no-op for other storages. Blocking, one round trip; call it from the thread that opens
    the storage, before its first real request."""
    if not isinstance(storage, FsspecStorage) or not storage.protocols & {"s3", "s3a"}:
        return
    fs: Any = storage.fs
    config = dict(fs.storage_options.get("config_kwargs") or {})
    config["retries"] = {"total_max_attempts": 1, "mode": "standard"}  # botocore: the first attempt only
    bucket, _, prefix = storage.root.partition("/")
    try:
        quick = type(fs)(**{**fs.storage_options, "config_kwargs": config, "skip_instance_cache": True})
        quick.retries = 1  # s3fs' own retries of timeouts and HTTP client errors
        quick.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix.rstrip("/") + "/" if prefix else "", MaxKeys=1)
    except Exception as exc:  # noqa: BLE001 - only the causes diagnose() names are raised here
        error = storage_error(exc, storage.location, field)
        if error is not None:
            raise error from exc


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then its causes and contexts, outermost first, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        exc = todo.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)


def _detail(exc: BaseException) -> str:
    """``Type: message`` on one line, without botocore's retry count (one attempt is no news) and
    without the query strings of the URLs in it."""
    text = re.sub(r" \(reached max retries: \d+\)", "", f"{type(exc).__name__}: {exc}")
    text = re.sub(r"(https?://[^\s\"'?]*)\?[^\s\"']*", r"\1", text)
    return " ".join(text.split())


def _error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ``ClientError`` (``"403"`` for a HEAD, which has no body)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = (response.get("Error") or {}).get("Code")
    return str(code) if code is not None else None


def _bucket(location: str | None) -> str | None:
    """The bucket of an ``s3://bucket/prefix`` URL, quoted; None for anything else."""
    if location is None or "://" not in location:
        return None
    name = location.split("://", 1)[1].split("/", 1)[0]
    return repr(name) if name else None
