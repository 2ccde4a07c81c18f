"""Webhooks (issue 16): a job or group submitted with a callback_url is POSTed a signed body once it finishes.

A real HTTP receiver on 127.0.0.1 (http.server in a thread) takes the deliveries; the worker's delivery pass
(worker.webhooks.deliver_once) runs in this process, as the worker's thread runs it, after the store calls
the worker makes finish the job. Signatures are checked with an HMAC computed here from the raw bytes the
receiver got. Targets: https anywhere, http only to loopback unless the operator allows more (422 naming
callback_url)."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from api_helpers import assert_problem, montecarlo_spec
from conftest import clear_cached_settings
from test_api_jobs import run_through_store

from core.settings import get_settings
from store import jobs as job_store
from store.db import session_scope
from store.models import WebhookDelivery
from tests.webhook_receiver import Receiver
from worker.webhooks import deliver_once


@pytest.fixture
def receiver_factory() -> Iterator[Any]:
    made: list[Receiver] = []

    def make(*replies: Any, default: Any = 200) -> Receiver:
        made.append(Receiver(list(replies), default=default))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


LOOPBACK_NETWORKS = '["127.0.0.0/8", "::1/128"]'


@pytest.fixture(autouse=True)
def loopback_receivers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receivers listen on 127.0.0.1: the operator allows loopback (the default refuses it)."""
    monkeypatch.setenv("GPUEST_WEBHOOK_ALLOWED_NETWORKS", LOOPBACK_NETWORKS)
    clear_cached_settings()


def configure(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"GPUEST_{name.upper()}", value)
    clear_cached_settings()


def expected_signature(secret: str, headers: dict[str, str], body: bytes) -> str:
    """The scheme as the README states it, computed independently of store.webhooks."""
    message = headers["x-gpuest-timestamp"].encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def secret_of(client, headers: dict[str, str]) -> str:
    response = client.get("/v1/webhooks/secret", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["secret"]


def submit_with_callback(client, headers, url: str) -> dict:
    response = client.post("/v1/jobs", json={**montecarlo_spec(), "callback_url": url}, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def job(client, headers, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=headers).json()


def webhook_events(client, headers, job_id: str) -> list[dict]:
    items = client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()["items"]
    return [item for item in items if item["type"] == "webhook"]


# -- delivery -----------------------------------------------------------------------------------------------

@pytest.mark.both_backends
def test_a_finished_job_is_announced_once_with_a_body_signed_by_the_owners_secret(
    client, alice, receiver_factory
) -> None:
    receiver = receiver_factory(204)
    created = submit_with_callback(client, alice, receiver.url)
    assert created["callback"]["status"] == "waiting" and created["callback"]["url"] == receiver.url
    assert deliver_once()["delivered"] == 0 and receiver.requests == []  # not finished: nothing sent

    run_through_store(created["id"], result={"rejection_rate": 0.05})
    assert deliver_once()["delivered"] == 1
    assert deliver_once() == {"activated": 0, "delivered": 0, "retrying": 0, "failed": 0}  # exactly once

    [(path, headers, raw)] = receiver.requests
    assert path == "/hooks/gpuest?token=abc"
    assert headers["content-type"] == "application/json"
    assert headers["x-gpuest-signature"] == expected_signature(secret_of(client, alice), headers, raw)
    assert abs(int(headers["x-gpuest-timestamp"]) - time.time()) < 60
    body = json.loads(raw)
    assert body["event"] == "job.finished" and headers["x-gpuest-event"] == "job.finished"
    assert body["id"] == created["id"] and body["kind"] == "crve_montecarlo" and body["status"] == "succeeded"
    assert body["result_url"] == f"/v1/jobs/{created['id']}/result" and body["url"] == f"/v1/jobs/{created['id']}"
    shown = job(client, alice, created["id"])
    assert datetime.fromisoformat(body["finished_at"]) == datetime.fromisoformat(shown["finished_at"])
    assert str(body["delivery_id"]) == headers["x-gpuest-delivery"]

    callback = shown["callback"]
    assert callback["status"] == "delivered" and callback["attempts"] == 1 and callback["delivered_at"]
    assert [(a["attempt"], a["status_code"], a["error"]) for a in callback["attempt_log"]] == [(1, 204, None)]
    messages = [event["message"] for event in webhook_events(client, alice, created["id"])]
    port = receiver.server.server_address[1]
    assert messages[-1] == f"callback delivered to 127.0.0.1:{port} (HTTP 204, attempt 1)"
    assert not any("token=abc" in message for message in messages)  # the query may be a receiver's secret


@pytest.mark.both_backends
def test_a_failing_receiver_is_retried_with_exponential_backoff_until_it_answers(
    client, alice, receiver_factory, monkeypatch
) -> None:
    configure(monkeypatch, webhook_backoff_seconds="0.3", webhook_max_attempts="5")
    receiver = receiver_factory(500, 503, 200)
    created = submit_with_callback(client, alice, receiver.url)
    run_through_store(created["id"], result={"x": 1})

    assert deliver_once()["retrying"] == 1
    assert deliver_once()["retrying"] == 0 and len(receiver.requests) == 1  # backing off: not due yet
    time.sleep(0.35)
    assert deliver_once()["retrying"] == 1  # second failure: the wait doubles
    time.sleep(0.35)
    assert deliver_once()["delivered"] == 0 and len(receiver.requests) == 2  # 0.6 s not over yet
    time.sleep(0.3)
    assert deliver_once()["delivered"] == 1

    callback = job(client, alice, created["id"])["callback"]
    log = callback["attempt_log"]
    assert callback["status"] == "delivered" and callback["attempts"] == 3
    assert [(a["status_code"], a["error"]) for a in log] == [(500, "HTTP 500"), (503, "HTTP 503"), (200, None)]
    waits = [(datetime.fromisoformat(a["next_attempt_at"]) - datetime.fromisoformat(a["at"])).total_seconds()
             for a in log[:2]]
    assert waits == pytest.approx([0.3, 0.6], abs=1e-3)
    assert log[2]["next_attempt_at"] is None

    # every attempt sends the same body, each signed anew with its own timestamp
    secret = secret_of(client, alice)
    assert len({raw for _, _, raw in receiver.requests}) == 1
    assert all(headers["x-gpuest-signature"] == expected_signature(secret, headers, raw)
               for _, headers, raw in receiver.requests)
    events = webhook_events(client, alice, created["id"])
    levels = [(event["level"], event["message"].split(": ")[0]) for event in events]
    port = receiver.server.server_address[1]
    assert levels[-3:] == [("warning", f"callback attempt 1 to 127.0.0.1:{port} failed"),
                           ("warning", f"callback attempt 2 to 127.0.0.1:{port} failed"),
                           ("info", f"callback delivered to 127.0.0.1:{port} (HTTP 200, attempt 3)")]


@pytest.mark.both_backends
def test_a_delivery_is_given_up_after_the_attempts_allowed(client, alice, receiver_factory, monkeypatch) -> None:
    configure(monkeypatch, webhook_backoff_seconds="0.05", webhook_max_attempts="2")
    receiver = receiver_factory(500, 500, 500)
    created = submit_with_callback(client, alice, receiver.url)
    run_through_store(created["id"], result={"x": 1})
    deliver_once()
    time.sleep(0.1)
    assert deliver_once()["failed"] == 1
    time.sleep(0.2)
    deliver_once()
    assert len(receiver.requests) == 2
    callback = job(client, alice, created["id"])["callback"]
    assert callback["status"] == "failed" and callback["attempts"] == 2 and callback["next_attempt_at"] is None
    last = webhook_events(client, alice, created["id"])[-1]
    assert last["level"] == "error" and "given up after attempt 2: HTTP 500" in last["message"]


def test_redirects_are_not_followed_and_timeouts_and_refusals_say_no_more_than_that(
    client, alice, receiver_factory, monkeypatch
) -> None:
    configure(monkeypatch, webhook_timeout_seconds="0.3", webhook_max_attempts="1")
    redirecting = receiver_factory(("redirect", 302))
    slow = receiver_factory(("sleep", 1.5))
    closed = receiver_factory()
    closed_url = closed.url
    closed.close()  # nothing listens there any more: the connection is refused
    jobs = [submit_with_callback(client, alice, url) for url in (redirecting.url, slow.url, closed_url)]
    for created in jobs:
        run_through_store(created["id"], result={"x": 1})
    assert deliver_once()["failed"] == 3
    assert [path for path, _, _ in redirecting.requests] == ["/hooks/gpuest?token=abc"]  # /elsewhere never asked
    errors = [job(client, alice, created["id"])["callback"]["attempt_log"][0] for created in jobs]
    assert [(entry["status_code"], entry["error"]) for entry in errors] == [
        (302, "redirect not followed (HTTP 302)"), (None, "no HTTP response"), (None, "no HTTP response")]
    assert errors[1]["seconds"] < 1.0


@pytest.mark.both_backends
def test_a_group_is_announced_once_every_member_has_finished(client, alice, receiver_factory) -> None:
    receiver = receiver_factory(200)
    base = montecarlo_spec()
    response = client.post("/v1/job-groups", headers=alice, json={
        "base": base, "grid": {"params.seed": [1, 2]}, "callback_url": receiver.url})
    assert response.status_code == 202, response.text
    group = response.json()
    assert group["callback"]["status"] == "waiting"
    members = client.get("/v1/jobs", params={"group_id": group["id"]}, headers=alice).json()["items"]
    assert all(member["callback"] is None for member in members)  # the group is announced, not each member
    run_through_store(members[0]["id"], result={"x": 1})
    deliver_once()
    assert receiver.requests == []
    with session_scope() as session:
        job_store.request_cancel(session, members[1]["id"], "alice")  # cancelled before it started
    deliver_once()
    [(_, headers, raw)] = receiver.requests
    assert headers["x-gpuest-signature"] == expected_signature(secret_of(client, alice), headers, raw)
    body = json.loads(raw)
    assert body["event"] == "group.finished" and body["id"] == group["id"] and body["status"] == "cancelled"
    assert body["counts"]["succeeded"] == 1 and body["counts"]["cancelled"] == 1
    assert body["result_url"] == f"/v1/job-groups/{group['id']}/results"
    assert client.get(f"/v1/job-groups/{group['id']}", headers=alice).json()["callback"]["status"] == "delivered"


def test_absolute_links_under_the_public_url(client, alice, receiver_factory, monkeypatch) -> None:
    configure(monkeypatch, public_url="https://gpuest.example.org/")
    receiver = receiver_factory(200)
    created = submit_with_callback(client, alice, receiver.url)
    run_through_store(created["id"], result={"x": 1})
    deliver_once()
    body = json.loads(receiver.requests[0][2])
    assert body["result_url"] == f"https://gpuest.example.org/v1/jobs/{created['id']}/result"


# -- targets, secrets, idempotency --------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "says"), [
    ("http://example.com/hook", "plain http is accepted only for loopback"),
    ("http://10.0.0.8/hook", "plain http is accepted only for loopback"),
    ("ftp://example.com/hook", "absolute https://"),
    ("example.com/hook", "absolute https://"),
    ("https://user:pw@example.com/hook", "credentials"),
    ("https://example.com:99999/hook", "not a valid URL"),
    ("https://example.com/hook#x", "fragment"),
    ("https://exa mple.com/hook", "spaces or control characters"),
    ("https://example.com/\u0000", "spaces or control characters"),
])
def test_a_target_this_server_would_not_call_is_refused_at_submission(client, alice, url, says) -> None:
    problem = assert_problem(client.post("/v1/jobs", json={**montecarlo_spec(), "callback_url": url}, headers=alice),
                             422)
    assert [error["field"] for error in problem["errors"]] == ["callback_url"]
    assert says in problem["errors"][0]["message"]
    group = client.post("/v1/job-groups", headers=alice,
                        json={"base": montecarlo_spec(), "grid": {"params.seed": [1]}, "callback_url": url})
    assert [error["field"] for error in assert_problem(group, 422)["errors"]] == ["callback_url"]
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0


@pytest.mark.parametrize("url", ["https://example.com/hook", "http://127.0.0.1:9/x", "http://[::1]:9/x",
                                 "http://localhost/x"])
def test_https_and_loopback_targets_are_accepted(client, alice, url) -> None:
    assert submit_with_callback(client, alice, url)["callback"]["url"] == url


def test_the_operator_may_allow_plain_http_to_named_hosts_or_anywhere(client, alice, monkeypatch) -> None:
    configure(monkeypatch, webhook_http_hosts='["receiver.internal"]')
    assert submit_with_callback(client, alice, "http://receiver.internal:8080/hook")["callback"]
    assert_problem(client.post("/v1/jobs", json={**montecarlo_spec(), "callback_url": "http://other.internal/"},
                               headers=alice), 422)
    configure(monkeypatch, webhook_allow_http="true")
    assert submit_with_callback(client, alice, "http://other.internal/")["callback"]


def test_a_target_the_settings_no_longer_allow_fails_without_being_called(
    client, alice, receiver_factory, monkeypatch
) -> None:
    configure(monkeypatch, webhook_allow_http="true")
    created = submit_with_callback(client, alice, "http://example.com/hook")
    run_through_store(created["id"], result={"x": 1})
    configure(monkeypatch, webhook_allow_http="false")
    assert deliver_once()["failed"] == 1
    entry = job(client, alice, created["id"])["callback"]["attempt_log"][0]
    assert entry["error"] == "target not allowed by this server's webhook settings"


def test_each_owner_has_a_stable_secret_of_their_own_from_a_0600_server_secret(client, alice, bob, api_env) -> None:
    first, again, other = secret_of(client, alice), secret_of(client, alice), secret_of(client, bob)
    assert first == again and first != other and first.startswith("whsec_") and len(first) == 6 + 64
    path = Path(api_env["GPUEST_DATA_DIR"]) / "webhook_secret"
    assert path.stat().st_mode & 0o777 == 0o600
    server = path.read_text().strip().encode()
    assert first == "whsec_" + hmac.new(server, b"gpuest-webhook-v1:alice", hashlib.sha256).hexdigest()


def test_a_configured_server_secret_is_used_instead_of_the_file(client, alice, monkeypatch) -> None:
    configure(monkeypatch, webhook_secret="s" * 32)
    expected = "whsec_" + hmac.new(b"s" * 32, b"gpuest-webhook-v1:alice", hashlib.sha256).hexdigest()
    assert secret_of(client, alice) == expected
    assert get_settings().webhook_secret is not None


@pytest.mark.both_backends
def test_an_idempotent_replay_must_name_the_same_callback(client, alice) -> None:
    spec = {**montecarlo_spec(), "callback_url": "https://example.com/a"}
    first = client.post("/v1/jobs", json=spec, headers={**alice, "Idempotency-Key": "k1"})
    replay = client.post("/v1/jobs", json=spec, headers={**alice, "Idempotency-Key": "k1"})
    assert first.status_code == replay.status_code == 202 and first.json()["id"] == replay.json()["id"]
    other = client.post("/v1/jobs", json={**spec, "callback_url": "https://example.com/b"},
                        headers={**alice, "Idempotency-Key": "k1"})
    assert_problem(other, 422)


@pytest.mark.both_backends
def test_a_deleted_job_takes_its_delivery_with_it(client, alice, receiver_factory) -> None:
    receiver = receiver_factory(200)
    created = submit_with_callback(client, alice, receiver.url)
    run_through_store(created["id"], result={"x": 1})
    assert client.delete(f"/v1/jobs/{created['id']}", headers=alice).status_code == 204
    with session_scope() as session:
        assert session.query(WebhookDelivery).count() == 0
    deliver_once()
    assert receiver.requests == []


@pytest.mark.both_backends
def test_every_waiting_group_gets_its_turn_however_many_wait(client, alice) -> None:
    from store.webhooks import activate_finished

    groups = []
    for seed in (1, 2):
        response = client.post("/v1/job-groups", headers=alice, json={
            "base": montecarlo_spec(), "grid": {"params.seed": [seed]}, "callback_url": "https://example.com/h"})
        groups.append(response.json())
    second = client.get("/v1/jobs", params={"group_id": groups[1]["id"]}, headers=alice).json()["items"][0]
    run_through_store(second["id"], result={"x": 1})  # only the second group has finished
    with session_scope() as session:  # one group per pass: the first (still running) is checked first
        assert activate_finished(session, get_settings(), limit=1) == []
    with session_scope() as session:  # then the other one, not the first again
        assert len(activate_finished(session, get_settings(), limit=1)) == 1
    assert client.get(f"/v1/job-groups/{groups[1]['id']}", headers=alice).json()["callback"]["status"] == "pending"
    assert client.get(f"/v1/job-groups/{groups[0]['id']}", headers=alice).json()["callback"]["status"] == "waiting"


# -- one owner cannot stall the others ----------------------------------------------------------------------

def test_a_trickling_receiver_is_cut_off_at_the_attempts_deadline(client, alice, receiver_factory,
                                                                    monkeypatch) -> None:
    # every byte comes well within the deadline: a per-read timeout alone never fires
    configure(monkeypatch, webhook_timeout_seconds="0.5", webhook_max_attempts="1")
    tarpit = receiver_factory(("trickle", 0.05))
    created = submit_with_callback(client, alice, tarpit.url)
    run_through_store(created["id"], result={"x": 1})
    started = time.monotonic()
    assert deliver_once()["failed"] == 1
    assert time.monotonic() - started < 0.5 + 1.0
    [entry] = job(client, alice, created["id"])["callback"]["attempt_log"]
    assert entry["error"] == "no HTTP response" and 0.45 <= entry["seconds"] <= 0.8


def test_one_owners_slow_receivers_do_not_hold_another_owners_delivery(client, alice, bob, receiver_factory,
                                                                        monkeypatch) -> None:
    configure(monkeypatch, webhook_timeout_seconds="1.0", webhook_max_attempts="1", webhook_interval_seconds="0.05")
    tarpit = receiver_factory(default=("trickle", 0.05))
    fast = receiver_factory(204)
    slow_jobs = [submit_with_callback(client, alice, tarpit.url) for _ in range(4)]
    for created in slow_jobs:
        run_through_store(created["id"], result={"x": 1})
    other = submit_with_callback(client, bob, fast.url)
    run_through_store(other["id"], result={"x": 1})
    started = time.monotonic()
    counts = deliver_once()
    assert counts["delivered"] == 1 and counts["failed"] == 4
    # alice's four attempts take two rounds of her two slots; bob's runs beside the first round
    assert 2.0 <= time.monotonic() - started < 2.0 + 1.5
    delivered_at = datetime.fromisoformat(job(client, bob, other["id"])["callback"]["delivered_at"])
    first_round = [datetime.fromisoformat(job(client, alice, created["id"])["callback"]["attempt_log"][0]["at"])
                   for created in slow_jobs]
    assert delivered_at < min(first_round)  # before any of alice's attempts had ended


@pytest.mark.both_backends
def test_claims_take_one_row_at_a_time_and_skip_owners_at_their_limit(client, alice, bob) -> None:
    from datetime import timedelta

    from store.webhooks import claim_due

    for owner in (alice, alice, alice, bob):
        created = submit_with_callback(client, owner, "https://example.com/hook")
        run_through_store(created["id"], result={"x": 1})
    with session_scope() as session:
        from store.webhooks import activate_finished

        assert len(activate_finished(session, get_settings())) == 4
    with session_scope() as session:
        claimed = claim_due(session, lease=timedelta(seconds=60), limit=4, owners_busy={"alice": 1}, owner_limit=2)
    assert [delivery.owner for delivery in claimed] == ["alice", "bob"]
    with session_scope() as session:  # the claimed rows are leased; the two others are still due
        rest = claim_due(session, lease=timedelta(seconds=60), limit=4)
    assert [delivery.owner for delivery in rest] == ["alice", "alice"]
    assert {delivery.id for delivery in rest}.isdisjoint(delivery.id for delivery in claimed)
    with session_scope() as session:
        assert claim_due(session, lease=timedelta(seconds=60), limit=4) == []


# -- targets: resolved, vetted, pinned ----------------------------------------------------------------------

@pytest.mark.parametrize(("address", "allowed"), [
    ("93.184.215.14", True),
    ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("0.0.0.0", False), ("::", False),
    ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False), ("100.64.0.1", False),
    ("169.254.169.254", False), ("169.254.1.1", False), ("fe80::1", False), ("fe80::1%eth0", False),
    ("fd12:3456::1", False), ("fd00:ec2::254", False), ("168.63.129.16", False), ("100.100.100.200", False),
    ("224.0.0.251", False), ("239.1.2.3", False), ("ff02::1", False), ("240.0.0.1", False),
    ("255.255.255.255", False), ("192.0.2.1", False), ("2001:db8::1", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("::ffff:93.184.215.14", True),
    ("2002:a00:1::1", False), ("2002:5db8:d70e::1", True),  # 6to4 of 10.0.0.1 and of a public address
    ("64:ff9b::a9fe:a9fe", False), ("64:ff9b::5db8:d70e", True),  # NAT64 of the metadata and a public address
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo
])
def test_only_public_addresses_are_called_by_default(address, allowed) -> None:
    from store.webhook_targets import is_allowed_address

    assert is_allowed_address(address, []) is allowed


def test_allowed_networks_open_private_addresses_but_a_metadata_address_only_by_itself() -> None:
    from ipaddress import ip_network

    from store.webhook_targets import is_allowed_address

    networks = [ip_network("10.0.0.0/8"), ip_network("127.0.0.0/8"), ip_network("169.254.0.0/16"),
                ip_network("fd00::/8")]
    assert is_allowed_address("10.9.8.7", networks) and is_allowed_address("::ffff:127.0.0.1", networks)
    assert is_allowed_address("169.254.1.1", networks) and is_allowed_address("fd12::1", networks)
    assert not is_allowed_address("169.254.169.254", networks) and not is_allowed_address("fd00:ec2::254", networks)
    assert not is_allowed_address("192.168.0.1", networks)
    assert is_allowed_address("169.254.169.254", [ip_network("169.254.169.254/32")])


@pytest.mark.parametrize("url", [
    "https://169.254.169.254/latest/meta-data/", "https://metadata.google.internal/computeMetadata/v1/",
    "https://10.1.2.3/hook", "https://[fe80::1]/hook", "https://[::ffff:10.0.0.1]/hook", "https://[fd00:ec2::254]/",
    "https://[2002:a00:1::1]/hook", "https://[64:ff9b::a9fe:a9fe]/", "https://0.0.0.0/hook", "https://224.0.0.1/",
    "http://127.0.0.1:5432/", "http://[::1]:6379/", "http://localhost:8080/",  # loopback: refused by default
    "https://intranet.example/hook", "https://v6private.example/hook",  # names resolving to private addresses
    "https://mixed.example/hook",  # one public and one private address: either could be dialled
    "https://nowhere.example/hook",  # does not resolve: the same answer, so names of a private zone stay unknown
    "https://2130706433/hook",  # 127.0.0.1 written as one number
])
def test_targets_resolving_to_addresses_this_server_does_not_call_are_refused_at_submission(
    client, alice, url, monkeypatch
) -> None:
    from store.webhook_targets import REFUSED_TARGET

    configure(monkeypatch, webhook_allowed_networks="[]")
    for path, body in (("/v1/jobs", {**montecarlo_spec(), "callback_url": url}),
                       ("/v1/job-groups", {"base": montecarlo_spec(), "grid": {"params.seed": [1]},
                                           "callback_url": url})):
        problem = assert_problem(client.post(path, json=body, headers=alice), 422)
        assert [(error["field"], error["message"]) for error in problem["errors"]] == [("callback_url",
                                                                                          REFUSED_TARGET)]
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0


def test_the_operator_may_allow_networks(client, alice, monkeypatch) -> None:
    configure(monkeypatch, webhook_allowed_networks='["10.0.0.0/8"]')
    assert submit_with_callback(client, alice, "https://intranet.example/hook")["callback"]
    assert submit_with_callback(client, alice, "https://10.1.2.3/hook")["callback"]
    assert_problem(client.post("/v1/jobs", json={**montecarlo_spec(), "callback_url": "https://192.168.1.1/"},
                               headers=alice), 422)


def test_a_name_that_resolves_elsewhere_at_delivery_is_checked_again_and_not_called(
    client, alice, receiver_factory, fake_dns, monkeypatch
) -> None:
    receiver = receiver_factory(200)
    port = receiver.server.server_address[1]
    configure(monkeypatch, webhook_allowed_networks="[]", webhook_http_hosts='["rebind.example"]')
    fake_dns.table["rebind.example"] = ["93.184.215.30"]  # public when the job is submitted
    created = submit_with_callback(client, alice, f"http://rebind.example:{port}/hook")
    run_through_store(created["id"], result={"x": 1})
    fake_dns.table["rebind.example"] = ["127.0.0.1"]  # then the name points at the server itself
    assert deliver_once()["failed"] == 1
    assert receiver.requests == []
    callback = job(client, alice, created["id"])["callback"]
    assert callback["status"] == "failed"  # final: a refused target is not retried
    assert callback["attempt_log"][0]["error"] == "target not allowed by this server's webhook settings"


def test_the_connection_goes_to_the_address_checked_and_keeps_the_name_in_the_host_header(
    client, alice, receiver_factory, fake_dns, monkeypatch
) -> None:
    receiver = receiver_factory(204)
    port = receiver.server.server_address[1]
    configure(monkeypatch, webhook_http_hosts='["pinned.example"]')
    fake_dns.table["pinned.example"] = ["127.0.0.1"]
    created = submit_with_callback(client, alice, f"http://pinned.example:{port}/hook?x=1")
    run_through_store(created["id"], result={"x": 1})
    before = fake_dns.lookups["pinned.example"]
    assert deliver_once()["delivered"] == 1  # the name resolves nowhere but in the table: no second lookup
    assert fake_dns.lookups["pinned.example"] == before + 1
    [(path, headers, _)] = receiver.requests
    assert path == "/hook?x=1" and headers["host"] == f"pinned.example:{port}"


def test_every_failure_without_an_http_status_reads_the_same(client, alice, receiver_factory, monkeypatch) -> None:
    """Closed port, a service that is not HTTP, a silent listener and a tarpit: one phrase, so the log is no
    port scanner."""
    import socket

    from tests.webhook_receiver import BannerServer

    configure(monkeypatch, webhook_timeout_seconds="0.3", webhook_max_attempts="1")
    closed = receiver_factory()
    closed_url = closed.url
    closed.close()
    banner = BannerServer()
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    tarpit = receiver_factory(("trickle", 0.02))
    try:
        urls = [closed_url, banner.url, f"http://127.0.0.1:{silent.getsockname()[1]}/hook", tarpit.url]
        jobs = [submit_with_callback(client, alice, url) for url in urls]
        for created in jobs:
            run_through_store(created["id"], result={"x": 1})
        assert deliver_once()["failed"] == 4
    finally:
        banner.close()
        silent.close()
    entries = [job(client, alice, created["id"])["callback"]["attempt_log"][0] for created in jobs]
    assert [(entry["status_code"], entry["error"]) for entry in entries] == [(None, "no HTTP response")] * 4


def self_signed_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(certificate)],
                   check=True, capture_output=True)
    return certificate, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_an_https_target_is_verified_by_its_name_over_the_pinned_address(
    client, alice, fake_dns, monkeypatch, tmp_path
) -> None:
    from worker import webhook_transport

    certificate, key = self_signed_certificate(tmp_path, "tls.example")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(certificate, key)
    names_sent: list[str | None] = []
    server_context.sni_callback = lambda _socket, name, _context: names_sent.append(name)
    monkeypatch.setattr(webhook_transport, "ssl_context", lambda: ssl.create_default_context(cafile=str(certificate)))
    configure(monkeypatch, webhook_max_attempts="1")
    fake_dns.table["tls.example"] = ["127.0.0.1"]
    fake_dns.table["other-name.example"] = ["127.0.0.1"]  # the same server, a name its certificate does not hold
    receiver = Receiver([204], tls=server_context)
    try:
        port = receiver.server.server_address[1]
        jobs = [submit_with_callback(client, alice, f"https://{name}:{port}/hook")
                for name in ("tls.example", "other-name.example")]
        for created in jobs:
            run_through_store(created["id"], result={"x": 1})
        counts = deliver_once()
    finally:
        receiver.close()
    assert (counts["delivered"], counts["failed"]) == (1, 1)
    assert sorted(filter(None, names_sent)) == ["other-name.example", "tls.example"]  # SNI: the URL's name
    [(_, headers, _)] = receiver.requests
    assert headers["host"] == f"tls.example:{port}"
    logs = [job(client, alice, created["id"])["callback"]["attempt_log"][0] for created in jobs]
    assert [(entry["status_code"], entry["error"]) for entry in logs] == [(204, None), (None, "no HTTP response")]
