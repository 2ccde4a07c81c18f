"""The callback_url of a submission (its webhook), shared by ``POST /v1/jobs`` and ``POST
/v1/job-groups``: the check at submission and the delivery row registered with the job or group. The scheme is
described in store/webhooks.py."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.job_checks import invalid
from api.problems import field_error
from core.settings import Settings
from store import webhooks as webhook_store
from store.models import WebhookDelivery


def check_callback_url(url: str | None, settings: Settings) -> None:
    """422 naming ``callback_url`` when this server would not call it: its form (``callback_url_problem``),
    then the addresses its host resolves to (``target_problem``)."""
    if url is None:
        return
    problem = webhook_store.callback_url_problem(url, settings) or webhook_store.target_problem(url, settings)
    if problem is not None:
        raise invalid([field_error("callback_url", problem, type_="callback_url")])


def register_callback(session: Session, subject_type: webhook_store.SubjectType, subject_id: str, owner: str,
                      url: str | None) -> WebhookDelivery | None:
    return None if url is None else webhook_store.register(session, subject_type, subject_id, owner, url)
