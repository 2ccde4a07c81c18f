"""A fuzz pass (Hypothesis) over the ``fields`` of ``GET /v1/job-groups/{id}/results``: any text, Unicode
digits and control characters included, is a 200 or a 422 problem naming ``fields``, never a 500; and every
leaf of a result, named by its dotted path, comes back as that leaf (in the parser's lookup for generated
results, and through the route for a stored one)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from api.problems import ProblemError
from api.result_fields import FIELD_PATH, MAX_FIELD_SEGMENTS, lookup, parse_fields
from tests.reliability.embedded_api import EmbeddedApi, embedded_api, finish_with_result

pytestmark = pytest.mark.reliability

SEED = 20261207
BASE = {
    "kind": "crve_montecarlo",
    "params": {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 20},
}
STORED_RESULT: dict[str, Any] = {
    "rejection_rate": {"0.01": 0.02, "0.05": 0.07, "0.10": 0.12},
    "conf_int": [0.1, 0.2],
    "timings": {"total": 0.5, "stages": [{"name": "draw", "seconds": 0.25}]},
    "coefficients": {"C(region)[T.b]": 1.5, "x1:x2": -0.25, "x 1": 3.0},
    "converged": True,
    "label": "crv1",
}

# Keys: names that start with a letter (so no key is the prefix of a dotted numeric key) and "0.05"-style
# levels, the dotted keys results hold.
NAME_KEYS = st.from_regex(r"[A-Za-z][A-Za-z0-9_:()\[\] -]{0,11}", fullmatch=True).map(str.strip).filter(bool)
LEVEL_KEYS = st.from_regex(r"0\.[0-9]{2}", fullmatch=True)
LEAVES = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | st.text(max_size=8)
RESULTS = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(NAME_KEYS | LEVEL_KEYS, children, max_size=4),
    max_leaves=20,
)


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from leaves(item, (*path, str(index)))
    elif path:
        yield path, value


@seed(SEED)
@settings(max_examples=400, deadline=None)
@given(result=st.dictionaries(NAME_KEYS | LEVEL_KEYS, RESULTS, min_size=1, max_size=5))
def test_every_leaf_of_a_result_round_trips_through_its_path(result: dict[str, Any]) -> None:
    for path, value in leaves(result):
        text = ".".join(path)
        if len(text.split(".")) > MAX_FIELD_SEGMENTS:
            continue
        assert parse_fields(text) == [text]
        found, item = lookup(result, text.split("."))
        assert found and json.dumps(item) == json.dumps(value), (text, item, value)


@seed(SEED)
@settings(max_examples=600, deadline=None)
@given(text=st.text(max_size=60) | st.text(st.characters(codec="ascii"), max_size=60))
def test_any_text_parses_or_is_refused_naming_fields(text: str) -> None:
    try:
        paths = parse_fields(text)
    except ProblemError as problem:
        assert problem.status == 422
        assert [error["field"] for error in problem.errors or []] == ["fields"]
        return
    for path in paths:
        assert FIELD_PATH.fullmatch(path) and path.isascii()
        lookup(STORED_RESULT, path.split("."))  # never raises


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, migrated_sqlite: Callable[[Path], None]) -> Iterator[EmbeddedApi]:
    with embedded_api(tmp_path_factory.mktemp("fields"), migrated_sqlite) as running:
        yield running


@pytest.fixture(scope="module")
def group_id(api: EmbeddedApi) -> str:
    response = api.client.post(
        "/v1/job-groups", json={"base": BASE, "grid": {"params.seed": [1, 2]}}, headers=api.headers
    )
    assert response.status_code == 202, response.text
    group = response.json()
    jobs = api.client.get("/v1/jobs", params={"group_id": group["id"]}, headers=api.headers).json()["items"]
    finish_with_result(jobs[0]["id"], STORED_RESULT)
    return group["id"]


ASCII_PATHS = st.lists(
    st.sampled_from(["conf_int", "0", "1", "²", "١", "rejection_rate", "0.05", "timings", "stages", "name", "", " "])
    | st.text(max_size=4),
    min_size=1,
    max_size=5,
).map(".".join)
FIELDS_TEXT = st.lists(ASCII_PATHS, min_size=1, max_size=4).map(",".join) | st.text(max_size=40)


@seed(SEED)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=FIELDS_TEXT)
def test_the_results_route_answers_200_or_a_422_naming_fields(api: EmbeddedApi, group_id: str, fields: str) -> None:
    response = api.client.get(f"/v1/job-groups/{group_id}/results", params={"fields": fields}, headers=api.headers)
    assert response.status_code in (200, 422), (fields, response.status_code, response.text)
    if response.status_code == 422:
        problem = response.json()
        assert response.headers["content-type"].startswith("application/problem+json")
        assert {error["field"] for error in problem["errors"]} == {"fields"}, problem


def test_each_leaf_of_a_stored_result_comes_back_through_the_route(api: EmbeddedApi, group_id: str) -> None:
    paths = [".".join(path) for path, _ in leaves(STORED_RESULT)]
    response = api.client.get(
        f"/v1/job-groups/{group_id}/results",
        params={"fields": ",".join(paths), "format": "parquet"},
        headers=api.headers,
    )
    assert response.status_code == 200, response.text
    first = pd.read_parquet(io.BytesIO(response.content)).iloc[0]
    assert {path: first[path] for path in paths} == {".".join(path): value for path, value in leaves(STORED_RESULT)}
