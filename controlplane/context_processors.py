from controlplane.roles import MINIMUM_ROLE
from controlplane.selectors import memberships_of


def tenant_nav(request) -> dict:
    """The current tenant and the user's other tenants, for the switcher in the layout."""
    membership = getattr(request, "membership", None)
    if membership is None or not request.user.is_authenticated:
        return {}
    return {
        "membership": membership,
        "tenant": membership.tenant,
        "memberships": memberships_of(request.user),
        # What the current role may do, for templates: {% if can.publish_policy %}.
        "can": {action: membership.can(action) for action in MINIMUM_ROLE},
    }
