"""Property-based fuzzing of the OpenAPI document (schemathesis + Hypothesis) against the API served by
uvicorn on a throwaway PostgreSQL, auth on, with an API key: every operation gets a fixed budget of valid
(positive) and schema-violating (negative) requests from a fixed seed. The properties: no 5xx at all; every
4xx is an RFC 9457 problem (``application/problem+json`` with its type, title and matching status); no
answer shows a traceback, SQL driver names, server paths or the database's address that the request did not
carry itself; an artifact route serves only the job's own artifact names. The operations on one job or
dataset are fuzzed twice: with generated ids (mostly unknown: 404) and with the ids of a real finished job
(with an artifact) and a real dataset, so the fuzzer also reaches the code behind the lookups.

Beside the generated requests, the inputs issue 11 found 5xx causes with (NaN, Infinity and 1e400 in a spec,
NUL characters in ids, filters and file names, a cut-off multipart upload, a control character in a
header) go through the same checks, each with the status class it must get.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.reliability import figures
from tests.reliability.conftest import Servers
from tests.reliability.stack import ServiceStack, service_stack, submit, wait_terminal

pytestmark = [pytest.mark.reliability, pytest.mark.servers]

SEED = 20261123
# Per operation and generation mode: 14 operations x 2 modes x 90 = 2,520 at most (operations with few
# distinct inputs, such as /healthz, exhaust theirs sooner); then the 7 operations on one job or dataset
# again with the id of a real one (a finished job with an artifact, a dataset), 2 x 40 each.
EXAMPLES_PER_OPERATION_AND_MODE = 90
EXAMPLES_WITH_REAL_IDS = 40
PROBLEM_MEDIA_TYPE = "application/problem+json"
# Markers of internal detail an answer must not show unless the request itself carried them.
LEAK_MARKERS = ("Traceback", "sqlalchemy", "psycopg", "File \"/", "/tmp/", "site-packages")


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    database_url = servers.postgres.create_database("gpuest_fuzz")
    with service_stack(tmp_path_factory.mktemp("fuzz"), database_url, servers.redis.url, workers=1) as running:
        yield running


@pytest.fixture(scope="module")
def api_key(stack: ServiceStack) -> str:
    return stack.create_api_key("fuzzer")


@dataclass(frozen=True)
class RealIds:
    job_id: str
    dataset_id: str
    artifacts: frozenset[str]


@pytest.fixture(scope="module")
def real_ids(stack: ServiceStack, api_key: str) -> RealIds:
    """A dataset and a finished job with an artifact, for the fuzzer to aim at; then the worker stops, so the
    fuzzer's own jobs stay queued (a generated spec may ask for hours of work)."""
    panel = "y,x,g\n" + "".join(f"{(i * 7) % 11 + 0.5 * (i % 3)},{i % 5},{i % 6}\n" for i in range(60))
    with stack.client(api_key) as client:
        dataset = client.post("/v1/datasets", files={"file": ("panel.csv", panel.encode(), "text/csv")})
        assert dataset.status_code == 201, dataset.text
        dataset_id = dataset.json()["id"]
        job_id = submit(client, "crve_bootstrap", {"dataset_id": dataset_id, "formula": "y ~ x", "cluster": "g",
                                                   "param": "x", "reps": 99, "seed": 1})
        state = wait_terminal(client, [job_id], 120)[job_id]
        assert state["status"] == "succeeded", state
        artifacts = client.get(f"/v1/jobs/{job_id}/artifacts").json()
    for worker in stack.workers:
        worker.stop(grace=5)
    names = frozenset(item["name"] for item in artifacts)
    assert names, artifacts
    return RealIds(job_id, dataset_id, names)


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: dict[tuple[str, int, str], str] = field(default_factory=dict)  # (operation, status, why) -> example
    no_cases: list[str] = field(default_factory=list)  # operation and mode that have no input to generate
    seconds: Counter[str] = field(default_factory=Counter)  # per operation: generation and requests


def header(response: Any, name: str) -> str:
    """A header of an httpx answer or of a schemathesis one (whose headers map names to lists of values)."""
    for key, value in response.headers.items():
        if key.lower() == name:
            return str(value[0] if isinstance(value, list) else value)
    return ""


def violations(response: Any, sent: str, private: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with an answer (``requests`` or ``httpx``): 5xx, a non-problem error, leaked internals."""
    status = int(response.status_code)
    found = []
    if status >= 500:
        found.append(f"server error {status}")
    if status >= 400:
        content_type = header(response, "content-type")
        if not content_type.startswith(PROBLEM_MEDIA_TYPE):
            found.append(f"{status} as {content_type or 'no content type'}, not problem+json")
        else:
            try:
                body = json.loads(response.content)
            except ValueError:
                body = None
            if not isinstance(body, dict) or body.get("status") != status or not isinstance(body.get("title"), str) \
                    or not isinstance(body.get("type"), str):
                found.append(f"{status} problem without type/title/matching status")
    text = response.content.decode("utf-8", errors="replace")
    found += [f"shows {marker!r}" for marker in (*LEAK_MARKERS, *private) if marker in text and marker not in sent]
    return found


@dataclass(frozen=True)
class Target:
    base_url: str
    session: requests.Session
    auth: dict[str, str]
    private: tuple[str, ...]  # texts of this deployment no answer may show (data dir, database port)
    artifacts: frozenset[str]  # the only names an artifact route may serve


def fuzz_operation(
    operation: schemathesis.APIOperation, mode: GenerationMode, target: Target, tally: Tally,
    examples: int = EXAMPLES_PER_OPERATION_AND_MODE, path_parameters: dict[str, str] | None = None,
) -> None:
    """Send ``examples`` generated requests for one operation in one mode (``path_parameters`` fixed when
    given), tallying answers and violations."""

    @seed(SEED)
    @settings(
        max_examples=examples, database=None, deadline=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False,
    )
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def exercise(case: schemathesis.Case) -> None:
        response = case.call(base_url=target.base_url, session=target.session, headers=target.auth, timeout=30)
        tally.requests[operation.label] += 1
        tally.statuses[response.status_code] += 1
        sent = repr((case.path_parameters, case.query, case.headers, case.body))
        found = violations(response, sent, target.private)
        name = (case.path_parameters or {}).get("name")
        if operation.path.endswith("/artifacts/{name}") and response.status_code == 200 \
                and name not in target.artifacts:
            found.append("served a file that is not one of the job's artifacts")
        for why in found:
            tally.failures.setdefault(
                (operation.label, response.status_code, why),
                case.as_curl_command(headers={"Authorization": "Bearer $KEY"}, base_url=target.base_url),
            )

    started = time.perf_counter()
    try:
        exercise()
    except Unsatisfiable:  # nothing to violate: an operation without parameters or body has no negative case
        tally.no_cases.append(f"{operation.label} ({mode.value})")
    tally.seconds[operation.label] += time.perf_counter() - started


def test_fuzzed_requests_get_no_5xx_and_only_problem_documents(
    stack: ServiceStack, servers: Servers, api_key: str, real_ids: RealIds
) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.base_url}/openapi.json")
    tally = Tally()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14, [operation.label for operation in operations]
    real = {"job_id": real_ids.job_id, "dataset_id": real_ids.dataset_id}

    with requests.Session() as session:
        target = Target(stack.base_url, session, {"Authorization": f"Bearer {api_key}"},
                        (str(stack.env["GPUEST_DATA_DIR"]), f":{servers.postgres.port}"), real_ids.artifacts)
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz_operation(operation, mode, target, tally)
        # Deleting the dataset comes last: until then every other operation can still find it.
        on_real_ids = sorted((op for op in operations if set(_path_names(op)) & set(real)),
                             key=lambda op: op.method.upper() == "DELETE")
        for operation in on_real_ids:
            fixed = {name: real[name] for name in _path_names(operation) if name in real}
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz_operation(operation, mode, target, tally, EXAMPLES_WITH_REAL_IDS, fixed)

    total = sum(tally.requests.values())
    figures.record(
        "fuzz",
        requests=total,
        seed=SEED,
        examples_per_operation_and_mode=EXAMPLES_PER_OPERATION_AND_MODE,
        examples_with_real_ids=EXAMPLES_WITH_REAL_IDS,
        operations_on_real_ids=len(on_real_ids),
        operations=len(operations),
        statuses={str(status): count for status, count in sorted(tally.statuses.items())},
        server_errors=sum(count for status, count in tally.statuses.items() if status >= 500),
        distinct_failures=len(tally.failures),
        requests_by_operation=dict(sorted(tally.requests.items())),
        seconds_by_operation={label: round(seconds, 1) for label, seconds in sorted(tally.seconds.items())},
        modes_without_cases=tally.no_cases,
    )
    assert total >= 2000, f"the fuzzer sent only {total} requests: {dict(tally.requests)}"
    shown = [f"{label} -> {status}: {why}\n    {curl}" for (label, status, why), curl in tally.failures.items()]
    assert not tally.failures, "\n".join(shown[:15])


def _path_names(operation: schemathesis.APIOperation) -> list[str]:
    return re.findall(r"{(\w+)}", operation.path)


def test_every_v1_operation_without_a_key_is_a_401_problem(stack: ServiceStack) -> None:
    job, dataset = uuid.uuid4(), uuid.uuid4()
    calls = [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{job}"), ("POST", f"/v1/jobs/{job}/cancel"),
             ("GET", f"/v1/jobs/{job}/result"), ("GET", f"/v1/jobs/{job}/artifacts"),
             ("GET", f"/v1/jobs/{job}/artifacts/x"), ("GET", "/v1/datasets"), ("POST", "/v1/datasets"),
             ("GET", f"/v1/datasets/{dataset}"), ("DELETE", f"/v1/datasets/{dataset}")]
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        for method, path in calls:
            response = client.request(method, path)
            assert response.status_code == 401, (method, path, response.status_code, response.text)
            assert not violations(response, ""), (method, path, violations(response, ""))


# -- the inputs issue 11 found 5xx causes with ------------------------------------------------------

MONTECARLO = '{"n_clusters": %s, "cluster_size": 10, "n_regressors": 2, "replications": 10, "seed": 1}'
KS_NAN_ALM = '{"kind": "ks_solve", "params": {"initial_alm": [NaN, 1.0, 0.0, 1.0]}}'
CUT_OFF_MULTIPART = (
    b'--cut\r\nContent-Disposition: form-data; name="file"; filename="data.csv"\r\n'
    b"Content-Type: text/csv\r\n\r\ny,x\r\n1,2\r\n3,4\r\n"  # no closing --cut--
)
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    expected: tuple[int, ...]  # the acceptable statuses
    content: bytes | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    files: dict[str, Any] | None = None


HOSTILE = [
    Hostile("NaN in a spec", "POST", "/v1/jobs", (400, 422),
            '{"kind": "crve_montecarlo", "params": %s}' % (MONTECARLO % "NaN"), JSON),
    Hostile("Infinity in a spec", "POST", "/v1/jobs", (400, 422),
            '{"kind": "crve_montecarlo", "params": %s}' % (MONTECARLO % "Infinity"), JSON),
    Hostile("-Infinity in a spec", "POST", "/v1/jobs", (400, 422),
            '{"kind": "crve_montecarlo", "params": %s}' % (MONTECARLO % "-Infinity"), JSON),
    Hostile("1e400 in a spec", "POST", "/v1/jobs", (400, 422),
            '{"kind": "crve_montecarlo", "params": %s}' % (MONTECARLO % "1e400"), JSON),
    Hostile("NaN in ks_solve.initial_alm", "POST", "/v1/jobs", (400, 422), KS_NAN_ALM, JSON),
    Hostile("NaN as the whole body", "POST", "/v1/jobs", (400, 422), "NaN", JSON),
    Hostile("NUL in a job id", "GET", "/v1/jobs/%00", (404, 422)),
    Hostile("NUL in a cancel id", "POST", "/v1/jobs/a%00b/cancel", (404, 422)),
    Hostile("NUL in an artifact name", "GET", f"/v1/jobs/{uuid.UUID(int=1)}/artifacts/%00", (404, 422)),
    Hostile("NUL in a kind filter", "GET", "/v1/jobs?kind=%00", (200, 422)),
    Hostile("NUL in a status filter", "GET", "/v1/jobs?status=%00", (422,)),
    Hostile("NUL in a dataset id", "GET", "/v1/datasets/%00", (404, 422)),
    Hostile("NUL in a dataset id to delete", "DELETE", "/v1/datasets/%00", (404, 422)),
    Hostile("NUL in a spec's dataset id", "POST", "/v1/jobs", (422,),
            '{"kind": "crve_bootstrap", "params": {"dataset_id": "\\u0000", "formula": "y ~ x", "cluster": "g", '
            '"param": "x"}}', JSON),
    Hostile("lone surrogate in a spec's dataset id", "POST", "/v1/jobs", (422,),
            '{"kind": "crve_bootstrap", "params": {"dataset_id": "\\ud800", "formula": "y ~ x", "cluster": "g", '
            '"param": "x"}}', JSON),
    Hostile("NUL in an upload's file name", "POST", "/v1/datasets", (201, 400, 415, 422),
            files={"file": ("a\x00b.csv", b"y,x\n1,2\n3,4\n", "text/csv")}),
    Hostile("an upload cut off before its closing boundary", "POST", "/v1/datasets", (400, 422),
            CUT_OFF_MULTIPART, {"Content-Type": "multipart/form-data; boundary=cut"}),
    Hostile("a method the path does not allow", "PUT", "/v1/jobs", (405,)),
]


@pytest.mark.parametrize("hostile", HOSTILE, ids=[hostile.name for hostile in HOSTILE])
def test_an_input_that_once_caused_a_5xx_gets_its_4xx_problem(
    hostile: Hostile, stack: ServiceStack, servers: Servers, api_key: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", **hostile.headers}
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        request = client.build_request(hostile.method, hostile.path, content=hostile.content, files=hostile.files,
                                       headers=headers)
        response = client.send(request)
    figures.record("hostile_inputs", requests=len(HOSTILE))
    sent = repr((hostile.path, hostile.content, hostile.headers))
    assert response.status_code in hostile.expected, (response.status_code, response.text[:500])
    assert not violations(response, sent, (str(stack.env["GPUEST_DATA_DIR"]), f":{servers.postgres.port}"))
    if response.status_code == 405:
        allowed = {method.strip() for method in response.headers.get("allow", "").split(",")}
        assert {"GET", "POST"} <= allowed, f"Allow: {response.headers.get('allow')}"


def test_a_control_character_in_a_header_is_a_400_problem(stack: ServiceStack) -> None:
    """Refused by the HTTP parser before the app sees it: the answer must still be a problem document."""
    response = _raw_send(stack, httpx.Request("GET", f"{stack.base_url}/healthz", headers={"X-Bad": "a\x01b"}))
    assert response.status_code == 400
    assert not violations(response, ""), violations(response, "")


def _raw_send(stack: ServiceStack, request: httpx.Request) -> httpx.Response:
    """Send ``request`` byte for byte over a socket (for header values a client library refuses to send)."""
    url = httpx.URL(stack.base_url)
    body = request.read()
    lines = [f"{request.method} {request.url.raw_path.decode()} HTTP/1.1", f"Host: {url.host}:{url.port}",
             "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in request.headers.items()
              if name.lower() not in ("host", "content-length", "connection")]
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, content = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in header_lines if ":" in line]
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=_unchunk(content, headers))


def _unchunk(content: bytes, headers: list[tuple[str, ...]]) -> bytes:
    if not any(name.lower() == "transfer-encoding" and "chunked" in value for name, value in headers):
        return content
    body, rest = b"", content
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    return body
