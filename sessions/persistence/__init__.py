"""Controlled persistence (docs/architecture.md, "Persistence"): artifacts a session packs by name,
and snapshots of a persistent session's workspace, sealed per tenant, signed, stored through
Django's storage API, and checked in full before a byte is restored.

- `tarstream.py`: the tar a sandbox writes of its workspace, read as it streams;
- `pack.py`: the programs that pack and unpack a workspace inside its sandbox;
- `sealed.py`: the blob's encryption (AES-256-GCM in 1 MiB segments);
- `manifest.py`: what a blob holds and where it came from, and its signature;
- `services.py`: taking, verifying, restoring, deleting and pruning them."""
