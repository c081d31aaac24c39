"""schemathesis generates requests from the server's OpenAPI document (valid and invalid ones) and
checks that none gets a 5xx. The scripted model answers in microseconds, so the runtime is the
requests themselves; ``max_seq_len`` 256 bounds what any generated request can ask for.

Cases are drawn through hypothesis directly (``APIOperation.as_strategy``), one operation at a
time, rather than through schemathesis' pytest plugin."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.server.conftest import ScriptedFactory

EXAMPLES_PER_OPERATION = int(os.environ.get("ATLAS_FUZZ_EXAMPLES", "30"))
"""Cases per operation; raise it locally (e.g. 300) for a longer search."""


@pytest.fixture(scope="module")
def operations(scripted: ScriptedFactory) -> dict[str, schemathesis.APIOperation]:
    server = scripted({"[": "a short scripted answer"}, max_seq_len=256, request_timeout=20)
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    found = [result.ok() for result in schema.get_all_operations()]
    return {f"{op.method.upper()} {op.path}": op for op in found}


PATHS = [
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}",
    "GET /v1/models",
    "GET /v1/models/{model_id}",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /tokenize",
    "POST /detokenize",
    "GET /health",
    "GET /metrics",
]


def test_the_document_lists_every_operation(operations: dict[str, schemathesis.APIOperation]) -> None:
    assert sorted(operations) == sorted(PATHS)


@pytest.mark.parametrize("name", PATHS)
def test_no_server_errors(operations: dict[str, schemathesis.APIOperation], name: str) -> None:
    @given(case=operations[name].as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def check(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = "scripted"  # unknown models are a 404 before anything else is looked at
        if case.path_parameters and "model_id" in case.path_parameters:
            case.path_parameters["model_id"] = "scripted"
        response = case.call(timeout=60)
        assert response.status_code < 500, (
            case.method,
            case.path,
            case.body,
            response.status_code,
            response.text[:500],
        )

    check()
