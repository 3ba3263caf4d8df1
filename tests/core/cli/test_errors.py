"""A user's error is one line on stderr and a non-zero exit; ``--debug`` shows the traceback.

Object storage through the installed ``autockpt`` command against the moto S3 server process
(127.0.0.1, ``tests/s3_server.py``): no credentials, a closed port as the endpoint, a missing
bucket. The dispatch itself (exit statuses, a bug's traceback) in process, on stub commands.
"""

from __future__ import annotations

import argparse
import errno
import json
import time
import uuid
from typing import Any, Callable

import pytest

from autockpt_core.cli import main
from autockpt_core.errors import ConfigError
from tests.console import autockpt
from tests.s3_server import CREDENTIALS
from tests.core.persist.test_storage_errors import closed_port, no_aws_environment  # noqa: F401 - autouse


def inspect_cases(server: Any) -> dict[str, tuple[str, dict[str, Any], str, str]]:
    """case -> (URL, storage options, the cause as printed, a piece of the fix)."""
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    return {
        "no credentials": (server.url("run"), {"endpoint_url": server.endpoint},
                           "no credentials were found (NoCredentialsError", "AWS_ACCESS_KEY_ID"),
        "closed endpoint": (server.url("run"), {"endpoint_url": f"http://127.0.0.1:{closed_port()}", **CREDENTIALS},
                            "the storage endpoint cannot be reached (EndpointConnectionError", '"endpoint_url"'),
        "missing bucket": (f"s3://{missing}/run", server.storage_options,
                           f"the bucket '{missing}' does not exist", "create the bucket"),
    }


@pytest.mark.parametrize("case", ["no credentials", "closed endpoint", "missing bucket"])
def test_inspect_says_the_cause_and_the_fix_in_one_line(s3_server: Any, case: str) -> None:
    url, options, cause, fix = inspect_cases(s3_server)[case]
    start = time.monotonic()
    done = autockpt("inspect", url, "--storage-options", json.dumps(options), timeout=60)
    seconds = time.monotonic() - start
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and done.stdout == ""
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"autockpt inspect: error: {url}: {cause}"), lines[0]
    assert "Fix: " in lines[0] and fix in lines[0].split("Fix: ", 1)[1]
    assert seconds < 8, f"{seconds:.1f}s"  # the closed endpoint took 5-20 s with botocore's retries


@pytest.mark.parametrize("where", ["before the command", "after the command"])
def test_debug_shows_the_traceback(s3_server: Any, where: str) -> None:
    url, options, _, _ = inspect_cases(s3_server)["no credentials"]
    arguments = ["inspect", url, "--storage-options", json.dumps(options)]
    done = autockpt(*(["--debug", *arguments] if where == "before the command" else [*arguments, "--debug"]), timeout=60)
    assert done.returncode != 0
    assert done.stderr.startswith("Traceback") and "NoCredentialsError" in done.stderr
    assert "StorageError: s3://ckpts/run: no credentials were found" in done.stderr.splitlines()[-1]


def stub(error: BaseException | None) -> dict[str, Any]:
    """A command registry of one command, ``fail``, that raises ``error`` (or returns 0)."""

    def run(args: argparse.Namespace) -> int:
        if error is not None:
            raise error
        return 0

    return {"fail": (lambda parser: None, run, "fails")}


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (ValueError("--budget must be positive"), 2, "--budget must be positive"),
        (ConfigError("mtbf", "-1h", "must be positive", "give a duration"),
         2, "mtbf='-1h': must be positive. Fix: give a duration"),
        (PermissionError(errno.EACCES, "Permission denied", "/ckpts/x"), 1, "[Errno 13] Permission denied: '/ckpts/x'"),
        (OSError(errno.EIO, "first line\n  second line"), 1, "[Errno 5] first line second line"),
    ],
    ids=["value", "config", "permission", "multi-line"],
)
def test_a_users_error_is_one_line_and_a_status(error: BaseException, status: int, line: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fail"], stub(error)) == status
    captured = capsys.readouterr()
    assert captured.err == f"autockpt fail: error: {line}\n" and captured.out == ""


def test_an_object_storage_error_raised_anywhere_names_its_fix(capsys: pytest.CaptureFixture[str]) -> None:
    exceptions = pytest.importorskip("botocore.exceptions")
    assert main(["fail"], stub(exceptions.NoCredentialsError())) == 1
    err = capsys.readouterr().err
    assert err.startswith("autockpt fail: error: no credentials were found (NoCredentialsError: Unable to locate")
    assert "AWS_ACCESS_KEY_ID" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--debug", "fail"], ["fail", "--debug"]])
def test_debug_raises_a_users_error(argv: list[str]) -> None:
    with pytest.raises(ValueError, match="bad input"):
        main(argv, stub(ValueError("bad input")))


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        main(["fail"], stub(ZeroDivisionError("division by zero")))


def test_debug_does_not_change_a_success() -> None:
    for argv in (["fail"], ["--debug", "fail"], ["fail", "--debug"]):
        assert main(argv, stub(None)) == 0


def test_local_directories_are_not_checked_before_the_command(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Callable[..., Any]] = []

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dirpath")

    def run(args: argparse.Namespace) -> int:
        seen.append(run)
        return 0

    assert main(["look", str(tmp_path / "not-yet")], {"look": (add, run, "look")}) == 0
    assert seen and not (tmp_path / "not-yet").exists() and capsys.readouterr().err == ""
