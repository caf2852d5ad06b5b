"""Property-based pass with schemathesis over the OpenAPI document, against the real server.

Every answer must be a non-5xx that matches its documented schema. Runs use a fake runner
that crashes at once, so generated run requests stay cheap. (schemathesis' pytest plugin
does not work with pytest 9, so operations are driven through hypothesis directly.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.support.helpers import end_run_leftovers
from tests.support.live_server import LiveServer


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    var: Path = tmp_path_factory.mktemp("fuzz") / "var"
    env = {
        "RLCS_RUNNER_MODULE": "tests.support.fake_runners.runner",
        "FAKE_RUNNER_MODE": "crash",
        "RLCS_MAX_CONCURRENT_RUNS": "1",
    }
    with LiveServer(var, **env) as server:
        yield server.url
    # A run that crashed as the server stopped is never settled: its `sleep` is left over.
    end_run_leftovers(var)


def operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_conforms(server_url: str) -> None:
    ops = operations(server_url)
    assert len(ops) >= 10
    for operation in ops:

        @given(case=operation.as_strategy())
        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case) -> None:
            # Schema-valid is not always acceptable (an unknown field name in a free-form map,
            # a name that is not in the catalog): those get a 4xx by design.
            case.call_and_validate(
                base_url=server_url, timeout=20, excluded_checks=[positive_data_acceptance]
            )

        check()
