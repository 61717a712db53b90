"""What controlplane tells the apps above it, which it does not import (docs/architecture.md,
"What may import what")."""

from django.dispatch import Signal

# Sent by services.tenant_create inside its transaction, after the tenant's first audit event,
# with `tenant` and `actor`: an app may record in the new chain what already holds for it.
tenant_created = Signal()
