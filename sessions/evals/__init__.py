"""Containment evals (docs/architecture.md, "Containment evals"): hostile probes run through the
real broker and runner, in real sandboxes, under a policy derived from a tenant's published
version, each recorded pass or fail with its evidence (`probes.py`, `suite.py`)."""
