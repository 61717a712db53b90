"""What a stored tree holds and where it came from, and its signature.

A manifest is a JSON object: its kind and id, the tenant, conversation and session that made it,
the commands that ran in that session, the policy version (name, number, SHA-256), the driver and
root filesystem digest, when it was made and until when it is kept, its parent (a snapshot resumed
from), every file's path, size, mode and SHA-256 and every directory's path and mode, what was
left out and why, and the sealed blob's SHA-256, size and data key version. It is signed with an
HMAC-SHA256 under a key derived from the tenant's data key: whoever can write the database or the
storage, but does not hold the master key, can neither forge nor move one."""

import hashlib
import hmac
import json

from controlplane.keys import TenantKey, subkey

VERSION = 1
MAX_COMMANDS = 1000  # the newest ones, with the count of all


def canonical(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_digest(entries: list[dict]) -> str:
    """The content's address: the same files, modes and directories give the same digest."""
    listing = [[e["path"], e["type"], e["mode"], e.get("size", 0), e.get("sha256", "")] for e in entries]
    return hashlib.sha256(json.dumps(sorted(listing), separators=(",", ":")).encode()).hexdigest()


def sign(key: TenantKey, manifest: dict) -> str:
    return hmac.new(subkey(key, "manifest"), canonical(manifest), hashlib.sha256).hexdigest()


def signature_holds(key: TenantKey, manifest: dict, signature: str) -> bool:
    return hmac.compare_digest(sign(key, manifest), signature or "")


def entries_match(manifest: dict, entries: list[dict]) -> str | None:
    """None when the tar's listing is exactly the manifest's, in order; else the first difference."""
    expected = manifest.get("files", [])
    if len(expected) != len(entries):
        return f"the stored tar holds {len(entries)} entries, the manifest lists {len(expected)}"
    for want, got in zip(expected, entries, strict=True):
        if want != got:
            if want.get("path") != got.get("path"):
                return f"the stored tar holds {got.get('path')!r} where the manifest lists {want.get('path')!r}"
            if want.get("sha256") != got.get("sha256"):
                return f"{got['path']}: its SHA-256 is not the manifest's"
            return f"{got['path']}: its size, mode or type is not the manifest's"
    return None
