"""The egress proxy of a session and what it needs (docs/architecture.md, "Egress")."""
