"""Tenant roles and what each may do. Roles are ordered: each one can do what those below it do."""

from django.db import models


class Role(models.IntegerChoices):
    VIEWER = 10, "viewer"
    OPERATOR = 20, "operator"
    SECURITY_ADMIN = 30, "security_admin"
    TENANT_ADMIN = 40, "tenant_admin"

    @classmethod
    def from_name(cls, name: str) -> "Role":
        for role in cls:
            if role.label == name:
                return role
        raise ValueError(f"unknown role {name!r}; roles are {', '.join(r.label for r in cls)}")


# The permission matrix, in one place. Views, API and consumers ask `can(membership, action)`.
MINIMUM_ROLE = {
    "read": Role.VIEWER,
    "kill_session": Role.OPERATOR,
    "download_artifact": Role.OPERATOR,  # snapshots and artifacts hold workspace files
    "delete_artifact": Role.SECURITY_ADMIN,
    "edit_policy": Role.SECURITY_ADMIN,
    "publish_policy": Role.SECURITY_ADMIN,
    "manage_members": Role.TENANT_ADMIN,
    "manage_api_keys": Role.TENANT_ADMIN,
}


def can(role: int, action: str) -> bool:
    return role >= MINIMUM_ROLE[action]
