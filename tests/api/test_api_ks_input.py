"""ks_solve rules across fields answered at submission: a 422 problem naming the field, and nothing queued (a
multi-GPU panel too small for its GPUs, or a histogram spread over GPUs, reached the user as a failed job)."""

from __future__ import annotations

from api_helpers import assert_problem, broker_message_count
from fastapi.testclient import TestClient

from kernels.registry import get_kind

# (params over the kind's example, the field the problem names, what its message says)
REFUSED = [
    ({"n_agents": 3_000, "gpus": 4}, "params.gpus", "at least 1,000 agents per GPU"),
    ({"gpus": 2, "alm_simulation": "histogram"}, "params.alm_simulation", "gpus = 2"),
    ({"periods": 105, "burn_in": 100}, "params.burn_in", "at least 10 of the 105 periods"),
    ({"periods": 100}, "params.burn_in", "burn_in (100) must leave at least 10"),
    ({"alm_update": "newton"}, "params.coarse_agents", "takes its Jacobian from the coarse stage"),
    ({"coarse_agents": 4_000}, "params.coarse_agents", "fewer than n_agents"),
    ({"coarse_agents": 1_000, "alm_simulation": "histogram"}, "params.alm_simulation", "coarse_agents stages"),
    ({"den_haan_periods": 9}, "params.den_haan_periods", "at least 10"),
]


def _spec(**params: object) -> dict[str, object]:
    return {"kind": "ks_solve", "params": {**get_kind("ks_solve").example.params, **params}}


def test_rules_across_fields_are_422s_naming_the_field(client: TestClient, alice, api_env) -> None:
    for params, field, says in REFUSED:
        problem = assert_problem(client.post("/v1/jobs", json=_spec(**params), headers=alice), 422)
        assert [error["field"] for error in problem["errors"]] == [field], params
        assert says in problem["errors"][0]["message"], problem["errors"][0]["message"]
        assert field in problem["detail"]
    assert broker_message_count(api_env) == 0


def test_the_rules_boundaries_are_queued(client: TestClient, alice, api_env) -> None:
    accepted = [{"n_agents": 4_000, "gpus": 4}, {"periods": 110, "burn_in": 100},
                {"coarse_agents": 1_000, "alm_update": "newton"}]
    for params in accepted:
        response = client.post("/v1/jobs", json=_spec(**params), headers=alice)
        assert response.status_code == 202, response.text
    assert broker_message_count(api_env) == len(accepted)
