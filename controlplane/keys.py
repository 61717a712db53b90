"""Each tenant's data keys, stored only wrapped by the deployment's master key (docs/architecture.md,
"Persistence").

The master key comes from AIRLOCK_MASTER_KEY or AIRLOCK_MASTER_KEY_FILE, never from the database;
unset, it is derived from SECRET_KEY (the embedded default). A data key is 32 random bytes,
wrapped with AES-256-GCM under the master key with the tenant, the key's version and the master
key's id as associated data: a wrapped key copied to another tenant or version does not open.
Keys listed in AIRLOCK_MASTER_KEYS_PREVIOUS still unwrap, so `manage.py rotate_keys` can re-wrap
every data key under the current master key. Nothing here ever logs or returns a key's bytes
except to its caller.

Each use of a data key derives a key of its own by HKDF (`subkey`): one per stored blob, one for
signing manifests."""

import hashlib
import hmac
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.models import DataKey, Tenant


class KeyUnavailable(Exception):
    """A data key cannot be opened: its master key is not configured, or the wrapped key was altered."""


def master_key() -> bytes:
    if settings.AIRLOCK_MASTER_KEY:
        return settings.AIRLOCK_MASTER_KEY
    return hmac.new(settings.SECRET_KEY.encode(), b"airlock master key v1", hashlib.sha256).digest()


def master_id(key: bytes) -> str:
    """A public name of a master key: which one wrapped a data key."""
    return hashlib.sha256(b"airlock master key id\0" + key).hexdigest()[:16]


def _known_masters() -> dict[str, bytes]:
    keys = [master_key(), *settings.AIRLOCK_MASTER_KEYS_PREVIOUS]
    return {master_id(key): key for key in keys}


def _aad(tenant_id: int, version: int, master: str) -> bytes:
    return f"airlock data key\0{tenant_id}\0{version}\0{master}".encode()


def _wrap(tenant_id: int, version: int, key: bytes) -> tuple[bytes, str]:
    master = master_key()
    mid = master_id(master)
    nonce = os.urandom(12)
    return nonce + AESGCM(master).encrypt(nonce, key, _aad(tenant_id, version, mid)), mid


def _unwrap(row: DataKey) -> bytes:
    master = _known_masters().get(row.master_id)
    if master is None:
        raise KeyUnavailable(f"data key v{row.version} of tenant {row.tenant_id} was wrapped by master key "
                             f"{row.master_id}, not AIRLOCK_MASTER_KEY nor in in AIRLOCK_MASTER_KEYS_PREVIOUS")
    wrapped = bytes(row.wrapped)
    try:
        return AESGCM(master).decrypt(wrapped[:12], wrapped[12:], _aad(row.tenant_id, row.version, row.master_id))
    except InvalidTag:
        raise KeyUnavailable(f"data key v{row.version} of tenant {row.tenant_id} does not open: it was altered or "
                             "moved") from None


@dataclass(frozen=True)
class TenantKey:
    tenant_id: int
    version: int
    key: bytes

    def __repr__(self) -> str:  # never the bytes
        return f"TenantKey(tenant={self.tenant_id}, version={self.version})"


def current_key(tenant: Tenant) -> TenantKey:
    """The tenant's newest data key, made (version 1) the first time one is needed."""
    row = DataKey.objects.filter(tenant=tenant).order_by("-version").first()
    if row is None:
        try:
            with transaction.atomic():
                row = _new_row(tenant.pk, 1)
        except IntegrityError:  # another process made it first
            row = DataKey.objects.filter(tenant=tenant).order_by("-version").first()
    return TenantKey(tenant.pk, row.version, _unwrap(row))


def key_version(tenant_id: int, version: int) -> TenantKey:
    row = DataKey.objects.filter(tenant_id=tenant_id, version=version).first()
    if row is None:
        raise KeyUnavailable(f"tenant {tenant_id} has no data key v{version}")
    return TenantKey(tenant_id, version, _unwrap(row))


def _new_row(tenant_id: int, version: int) -> DataKey:
    wrapped, mid = _wrap(tenant_id, version, os.urandom(32))
    return DataKey.objects.create(tenant_id=tenant_id, version=version, wrapped=wrapped, master_id=mid)


def subkey(key: TenantKey, purpose: str, salt: bytes = b"") -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt or None,
                info=f"airlock {purpose}\0{key.tenant_id}\0{key.version}".encode()).derive(key.key)


@dataclass
class Rotation:
    rewrapped: int = 0
    already_current: int = 0
    new_versions: int = 0


def rotate(*, new_data_keys: bool) -> Rotation:
    """Re-wrap every data key under the current master key (in one transaction: a key that does
    not open leaves everything as it was); with `new_data_keys`, also give each tenant a new
    data key version, which new snapshots and artifacts use (older ones keep theirs)."""
    report = Rotation()
    current = master_id(master_key())
    with transaction.atomic():
        for row in DataKey.objects.select_for_update().order_by("tenant_id", "version"):
            if row.master_id == current:
                report.already_current += 1
                continue
            key = _unwrap(row)
            row.wrapped, row.master_id = _wrap(row.tenant_id, row.version, key)
            row.save(update_fields=["wrapped", "master_id"])
            report.rewrapped += 1
        if new_data_keys:
            newest: dict[int, int] = {}
            for tenant_id, version in DataKey.objects.values_list("tenant_id", "version"):
                newest[tenant_id] = max(version, newest.get(tenant_id, 0))
            for tenant_id in Tenant.objects.values_list("pk", flat=True):
                _new_row(tenant_id, newest.get(tenant_id, 0) + 1)
                report.new_versions += 1
    return report
