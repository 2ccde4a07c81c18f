"""Every route the routers declare is served with its methods, and a method no route at the path declares is
a 405 whose Allow header lists exactly the methods declared there. The declared side is read from the routers
in ``api.app.ROUTERS`` (and the app's own OpenAPI routes), not from the table the 405 handler uses."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
from api_helpers import assert_problem
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute

import api.app
import api.routes

PROBED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def declared_routes(app: FastAPI) -> list[BaseRoute]:
    """The routers' routes, plus the routes FastAPI adds to the app itself (/openapi.json, /redoc)."""
    own = [route for route in app.router.routes if getattr(route, "methods", None) and hasattr(route, "path")]
    return [*own, *(route for router in api.app.ROUTERS for route in router.routes)]


def concrete_path(template: str) -> str:
    """The template with every path parameter filled with a value no stored object has."""
    return re.sub(r"\{[^}]+\}", "no-such-id", template)


def declared_methods_at(app: FastAPI, path: str) -> set[str]:
    return {
        method
        for route in declared_routes(app)
        if route.path_regex.match(path)  # type: ignore[attr-defined]
        for method in route.methods  # type: ignore[attr-defined]
    }


def test_every_router_module_is_served() -> None:
    for module_info in pkgutil.iter_modules(api.routes.__path__):
        module = importlib.import_module(f"api.routes.{module_info.name}")
        if hasattr(module, "router"):
            served = module.router in api.app.ROUTERS
            assert served, f"api/routes/{module_info.name}.py's router is not in api.app.ROUTERS"


def test_every_declared_method_reaches_its_route(client: TestClient, alice: dict[str, str]) -> None:
    """A declared method is routed: the answer is neither a 405 nor the router's 404 for an unknown path (a
    404 about the missing object, a 401, 403 or 422 about the request all mean the route was reached)."""
    routes = declared_routes(client.app)  # type: ignore[arg-type]
    assert len(routes) >= 40
    for route in routes:
        path = concrete_path(route.path)  # type: ignore[attr-defined]
        for method in sorted(route.methods - {"HEAD"}):  # type: ignore[attr-defined]
            response = client.request(method, path, headers=alice)
            assert response.status_code != 405, f"{method} {path}: {response.status_code} {response.text[:200]}"
            problem = response.headers.get("content-type", "").startswith("application/problem+json")
            unmatched = response.status_code == 404 and problem and response.json().get("detail") == "Not Found"
            assert not unmatched, f"{method} {path} is not routed"


def test_a_wrong_method_is_a_405_listing_the_declared_methods(client: TestClient, alice: dict[str, str]) -> None:
    app: FastAPI = client.app  # type: ignore[assignment]
    paths = {concrete_path(route.path) for route in declared_routes(app)}  # type: ignore[attr-defined]
    probed = 0
    for path in sorted(paths):
        declared = declared_methods_at(app, path)
        for method in sorted(set(PROBED_METHODS) - declared):
            response = client.request(method, path, headers=alice)
            assert_problem(response, 405)
            listed = {name.strip() for name in response.headers["allow"].split(",") if name.strip()}
            assert listed == declared, f"{method} {path}: Allow {response.headers['allow']!r}, declared {declared}"
            probed += 1
    assert probed > len(paths)


@pytest.mark.parametrize(("method", "allowed"), [("POST", "GET"), ("DELETE", "GET"), ("PUT", "GET")])
def test_the_webhook_secret_answers_get_only(client: TestClient, alice: dict[str, str], method, allowed) -> None:
    assert client.get("/v1/webhooks/secret", headers=alice).status_code == 200
    response = client.request(method, "/v1/webhooks/secret", headers=alice)
    assert_problem(response, 405)
    assert response.headers["allow"] == allowed
