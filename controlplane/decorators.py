from functools import wraps

from django.contrib.auth.decorators import login_required

from controlplane.errors import forbidden
from controlplane.selectors import membership_for


def tenant_view(action: str = "read"):
    """Resolve `tenant_slug` to the user's membership (404 for outsiders), check the role
    matrix for `action` (403), and hand the view `request.membership` and `request.tenant`."""

    def decorator(view):
        @login_required
        @wraps(view)
        def wrapper(request, tenant_slug: str, *args, **kwargs):
            membership = membership_for(request.user, tenant_slug)
            if not membership.can(action):
                # Answered here, not raised: Django logs a raised PermissionDenied with its whole
                # traceback, and a role's refusal is an expected answer, not an error.
                return forbidden(request, f"your role {membership.role_name} cannot {action.replace('_', ' ')}")
            request.membership = membership
            request.tenant = membership.tenant
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
