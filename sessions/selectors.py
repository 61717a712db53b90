"""Reads of sessions, always through the tenant: the API, the dashboard and the WebSocket
consumers find a session only with these, so a cross-tenant read cannot be written."""

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from controlplane import rows
from controlplane.models import Tenant
from policies_app.models import DecisionRecord
from sessions.models import ACTIVE_STATES, CommandRun, Session, hash_token

SESSION_RELATED = ("tenant", "policy_version__policy")


def session_list(tenant: Tenant) -> QuerySet[Session]:
    return Session.objects.filter(tenant=tenant).select_related(*SESSION_RELATED)


def session_get(tenant: Tenant, session_id) -> Session:
    return get_object_or_404(session_list(tenant), pk=session_id)


def session_search(tenant: Tenant, *, conversation_id: str = "", state: str = "") -> QuerySet[Session]:
    sessions = session_list(tenant)
    if conversation_id:
        sessions = sessions.filter(conversation_id=conversation_id)
    if state == "active":
        sessions = sessions.filter(state__in=ACTIVE_STATES)
    elif state:
        sessions = sessions.filter(state=state)
    return sessions


def session_by_token(token: str) -> Session | None:
    """The token's session, with what session_list joins (on every request of an agent: one
    statement, compiled once, controlplane/rows.py; its hash is unique)."""
    return rows.get(Session, {"token_hash": hash_token(token)}, related=SESSION_RELATED)


def session_decisions(session: Session) -> QuerySet[DecisionRecord]:
    """Every decision taken in the session, refusals included, oldest first."""
    return (DecisionRecord.objects.filter(tenant=session.tenant, session_id=session.pk)
            .select_related("policy_version__policy").order_by("created_at"))


def command_list(session: Session) -> QuerySet[CommandRun]:
    return session.commands.select_related("decision__policy_version__policy")


def command_get(session: Session, command_id) -> CommandRun:
    return get_object_or_404(command_list(session), pk=command_id)
