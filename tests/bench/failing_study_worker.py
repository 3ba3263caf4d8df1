"""The stand-in study worker (:mod:`tests.bench.fake_study_worker`), except that it fails the
training runs of the methods named in ``AUTOCKPT_TEST_FAIL`` (comma-separated method names):
those exit with status 1 and write no result, as a worker that crashed."""

from __future__ import annotations

import os
import sys

from autockpt_bench.study.protocol import read_spec
from tests.bench import fake_study_worker


def main() -> int:
    case, spec = sys.argv[1], sys.argv[sys.argv.index("--spec") + 1]
    _workload, method, _spec = read_spec(spec)
    if case == "train" and method["name"] in os.environ.get("AUTOCKPT_TEST_FAIL", "").split(","):
        print(f"stand-in crash of {method['name']}", file=sys.stderr)
        return 1
    return fake_study_worker.main()


if __name__ == "__main__":
    sys.exit(main())
