"""Object storage errors name their cause and the fix: credentials, endpoint, bucket, permission.

The classifier (:func:`diagnose`) is checked on the exceptions botocore and s3fs raise, built
as they build them; the session's probe against real moto S3 server processes on 127.0.0.1
(``tests/s3_server.py``): no credentials, a closed port as the endpoint, a missing bucket, and,
on a server with authentication turned on, rejected credentials and a policy that denies.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
import urllib.request
import uuid
from typing import Any, Callable, Iterator

import pytest

from autockpt_core import CheckpointSession, Config
from autockpt_core.errors import ConfigError, StorageError
from autockpt_core.persist.failures import fix_for
from autockpt_core.persist.storage import storage_for
from autockpt_core.persist.storage_errors import (
    BUCKET,
    CREDENTIALS,
    ENDPOINT,
    PERMISSION,
    check_reachable,
    diagnose,
    storage_error,
)
from tests.s3_server import CREDENTIALS as TEST_KEYS

LOCATION = "s3://ckpts/run"


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No credentials from the environment or ~/.aws, and never the instance metadata service
    (botocore would ask 169.254.169.254 when it finds none)."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the classifier, on the exceptions botocore and s3fs raise ---------------------------------


def botocore_error(name: str, **kwargs: Any) -> Callable[[], BaseException]:
    def make() -> BaseException:
        exceptions = pytest.importorskip("botocore.exceptions")
        return getattr(exceptions, name)(**kwargs)

    return make


def s3fs_error(code: str, operation: str = "PutObject") -> Callable[[], BaseException]:
    """What s3fs raises for an S3 error response: a Python exception, the ClientError as cause."""

    def make() -> BaseException:
        exceptions = pytest.importorskip("botocore.exceptions")
        errors = pytest.importorskip("s3fs.errors")
        return errors.translate_boto_error(
            exceptions.ClientError({"Error": {"Code": code, "Message": f"{code} said the server"}}, operation)
        )

    return make


def raised_while_handling(inner: Callable[[], BaseException]) -> Callable[[], BaseException]:
    def make() -> BaseException:
        try:
            try:
                raise inner()
            except Exception:
                raise OSError(errno.EIO, "wrapped by another library")
        except OSError as outer:
            return outer

    return make


CASES = [
    ("no credentials", botocore_error("NoCredentialsError"), CREDENTIALS, "no credentials", "AWS_ACCESS_KEY_ID"),
    ("half the credentials", botocore_error("PartialCredentialsError", provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
     CREDENTIALS, "no credentials", '"anon": True'),
    ("unknown profile", botocore_error("ProfileNotFound", profile="nope"), CREDENTIALS, "profile", "AWS_PROFILE"),
    ("unknown key", s3fs_error("InvalidAccessKeyId"), CREDENTIALS, "rejected the credentials", '"secret"'),
    ("wrong secret", s3fs_error("SignatureDoesNotMatch"), CREDENTIALS, "rejected the credentials", "AWS_SECRET_ACCESS_KEY"),
    ("expired token", s3fs_error("ExpiredToken"), CREDENTIALS, "rejected the credentials", "AWS_SESSION_TOKEN"),
    ("refused", botocore_error("EndpointConnectionError", endpoint_url="http://127.0.0.1:9"), ENDPOINT,
     "cannot be reached", '"endpoint_url"'),
    ("connect timeout", botocore_error("ConnectTimeoutError", endpoint_url="http://127.0.0.1:9"), ENDPOINT,
     "cannot be reached", "AWS_ENDPOINT_URL"),
    ("read timeout", botocore_error("ReadTimeoutError", endpoint_url="http://127.0.0.1:9"), ENDPOINT,
     "did not answer", "read_timeout"),
    ("malformed endpoint", lambda: ValueError("Invalid endpoint: 127.0.0.1:9"), ENDPOINT, "malformed", '"endpoint_url"'),
    ("missing bucket", s3fs_error("NoSuchBucket", "ListObjectsV2"), BUCKET, "bucket 'ckpts' does not exist",
     "create the bucket, or fix its name in dirpath"),
    ("bucket of another account", s3fs_error("BucketAlreadyExists", "CreateBucket"), BUCKET, "another account",
     "bucket of your own"),
    ("denied", s3fs_error("AccessDenied"), PERMISSION, "access denied", "s3:PutObject"),
    ("denied, a HEAD without body", s3fs_error("403", "HeadObject"), PERMISSION, "HTTP 403", "check the credentials"),
    ("cause found in the context", raised_while_handling(botocore_error("NoCredentialsError")), CREDENTIALS,
     "no credentials", "AWS_PROFILE"),
]


@pytest.mark.parametrize(("make", "cause", "problem", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_cause_is_named_with_its_fix(make: Callable[[], BaseException], cause: str, problem: str, fix: str) -> None:
    error = make()
    found = diagnose(error, LOCATION)
    assert found is not None, f"{error!r} was not diagnosed"
    assert (found.cause, problem in found.problem, fix in found.fix) == (cause, True, True), found
    assert "\n" not in found.sentence() and found.sentence().endswith(found.fix)
    assert fix_for(error) == found.fix  # what a failed checkpoint write says, too


NOT_OBJECT_STORAGE = [
    ("local permission", lambda: PermissionError(errno.EACCES, "Permission denied")),
    ("local I/O error", lambda: OSError(errno.EIO, "Input/output error")),
    ("missing object", s3fs_error("NoSuchKey", "GetObject")),
    ("a bug", lambda: RuntimeError("boom")),
]


@pytest.mark.parametrize("make", [c[1] for c in NOT_OBJECT_STORAGE], ids=[c[0] for c in NOT_OBJECT_STORAGE])
def test_other_errors_are_left_to_the_errno_fix(make: Callable[[], BaseException]) -> None:
    assert diagnose(make(), LOCATION) is None


def test_local_errors_keep_their_errno_fix() -> None:
    assert fix_for(PermissionError(errno.EACCES, "Permission denied"), "mirror").startswith("this process may not write")
    assert fix_for(OSError(errno.EIO, "Input/output error")) == "check free space, permissions and the storage backend"


def test_the_fix_names_the_field_and_a_storage_error_carries_its_diagnosis() -> None:
    error = storage_error(s3fs_error("NoSuchBucket", "ListObjectsV2")(), "s3://my-bucket/run", field="mirror")
    assert isinstance(error, StorageError) and isinstance(error, OSError)
    assert error.cause == BUCKET and error.location == "s3://my-bucket/run" and "mirror" in error.fix
    assert str(error).startswith("s3://my-bucket/run: the bucket 'my-bucket' does not exist (")
    assert str(error).endswith(f"Fix: {error.fix}")
    again = diagnose(error)
    assert again is not None and (again.cause, again.fix) == (BUCKET, error.fix)
    assert storage_error(RuntimeError("boom"), LOCATION) is None


def test_only_object_storage_is_checked(tmp_path: Any) -> None:
    check_reachable(storage_for(str(tmp_path / "local")))  # no request, no error
    check_reachable(storage_for(f"memory://autockpt-{uuid.uuid4().hex[:8]}"))
    assert not (tmp_path / "local").exists()


# -- the probe, against real servers -------------------------------------------------------------


def open_session(url: str, options: dict[str, Any], mirror: str | None = None) -> CheckpointSession:
    session = CheckpointSession(Config(dirpath=url, mirror=mirror, storage_options=options), framework="np", suffix=".st")
    session.open()
    return session


def refused_open(url: str, options: dict[str, Any]) -> tuple[ConfigError, float]:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        open_session(url, {**options, "skip_instance_cache": True})
    return info.value, time.monotonic() - start


def test_no_credentials_fails_at_train_start_naming_them(s3_server: Any) -> None:
    error, _ = refused_open(s3_server.url("run"), {"endpoint_url": s3_server.endpoint})
    assert error.field == "dirpath" and "cannot be written: no credentials were found" in str(error)
    assert "AWS_ACCESS_KEY_ID" in str(error) and '"anon": True' in str(error)
    assert "check free space" not in str(error)


def test_a_closed_endpoint_fails_in_one_attempt(s3_server: Any) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    error, seconds = refused_open(s3_server.url("run"), {"endpoint_url": endpoint, **TEST_KEYS})
    assert "the storage endpoint cannot be reached" in str(error) and endpoint in str(error)
    assert '"endpoint_url"' in str(error) and "AWS_ENDPOINT_URL" in str(error)
    assert seconds < 5, f"{seconds:.1f}s: botocore's retries were not skipped"  # about 20 s with them


def test_a_missing_bucket_is_named_not_created(s3_server: Any) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    error, _ = refused_open(f"s3://{bucket}/run", s3_server.storage_options)
    assert f"the bucket '{bucket}' does not exist" in str(error) and "create the bucket" in str(error)
    assert not s3_server.filesystem().exists(bucket)  # s3fs' makedirs would have created it


def test_a_mirror_names_its_field(s3_server: Any, tmp_path: Any) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError) as info:
        open_session(str(tmp_path / "fast"), s3_server.storage_options, mirror=f"s3://{bucket}/run")
    assert info.value.field == "mirror" and "fix its name in mirror" in str(info.value)


def test_a_reachable_bucket_still_opens(s3_server: Any) -> None:
    session = open_session(s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options)
    session.close()


@pytest.fixture(scope="module")
def auth_server() -> Iterator[tuple[Any, dict[str, dict[str, str]]]]:
    """A second moto server, with authentication on: (server, user -> storage_options). ``nobody``
    may do nothing; ``reader`` may list and read but not write."""
    pytest.importorskip("moto.server")
    botocore_session = pytest.importorskip("botocore.session")
    from tests.s3_server import S3Server

    server = S3Server().start()
    try:
        iam = botocore_session.get_session().create_client(
            "iam", endpoint_url=server.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )
        users: dict[str, dict[str, str]] = {}
        # moto authorizes s3fs' HeadBucket as s3:HeadBucket (AWS: s3:ListBucket)
        for user, actions in [("nobody", []), ("reader", ["s3:ListBucket", "s3:HeadBucket", "s3:GetObject"])]:
            iam.create_user(UserName=user)
            if actions:
                policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
                iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = {"endpoint_url": server.endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
        request = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).close()  # every request from now on is authorized
        yield server, users
    finally:
        server.stop()


def test_rejected_credentials_are_named(auth_server: Any) -> None:
    server, users = auth_server
    wrong_key = {"endpoint_url": server.endpoint, "key": "AKIAWRONGWRONGWRONG0", "secret": "x"}
    wrong_secret = {**users["reader"], "secret": "not-the-secret"}
    for options in (wrong_key, wrong_secret):
        error, _ = refused_open(server.url("run"), options)
        assert "the server rejected the credentials" in str(error) and "AWS_SECRET_ACCESS_KEY" in str(error)


def test_a_policy_that_denies_is_named(auth_server: Any) -> None:
    server, users = auth_server
    error, _ = refused_open(server.url("run"), users["nobody"])  # denied at the first request
    assert "access denied (AccessDenied" in str(error) and "s3:ListBucket" in str(error)
    error, _ = refused_open(server.url("run"), users["reader"])  # listed, then denied the write
    assert "PutObject" in str(error) and "access denied" in str(error) and "s3:PutObject" in str(error)
