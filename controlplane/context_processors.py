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
    }
