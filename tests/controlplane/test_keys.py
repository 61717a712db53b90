"""Data keys wrapped by the master key (controlplane/keys.py), and their rotation."""

import os

import pytest
from django.core.management import CommandError, call_command

from controlplane import keys
from controlplane.models import DataKey


def test_a_data_key_is_stored_only_wrapped_and_opens_only_as_itself(acme, globex):
    key = keys.current_key(acme)
    row = DataKey.objects.get(tenant=acme)
    assert key.key not in bytes(row.wrapped) and len(key.key) == 32
    assert keys.current_key(acme).key == key.key  # made once
    DataKey.objects.create(tenant=globex, version=1, wrapped=row.wrapped, master_id=row.master_id)
    with pytest.raises(keys.KeyUnavailable, match="altered or moved"):  # acme's key copied to globex
        keys.key_version(globex.pk, 1)


def test_rotation_rewraps_every_key_and_a_missing_old_key_changes_nothing(acme, globex, settings):
    old = {tenant.pk: keys.current_key(tenant).key for tenant in (acme, globex)}
    derived = keys.master_key()
    settings.AIRLOCK_MASTER_KEY = os.urandom(32)
    with pytest.raises(CommandError, match="nothing was changed"):  # the old master key is not listed
        call_command("rotate_keys")
    assert set(DataKey.objects.values_list("master_id", flat=True)) == {keys.master_id(derived)}
    settings.AIRLOCK_MASTER_KEYS_PREVIOUS = [derived]
    call_command("rotate_keys", "--new-data-keys")
    settings.AIRLOCK_MASTER_KEYS_PREVIOUS = []  # the old master key can go now
    assert set(DataKey.objects.values_list("master_id", flat=True)) == {keys.master_id(settings.AIRLOCK_MASTER_KEY)}
    for tenant in (acme, globex):
        assert keys.key_version(tenant.pk, 1).key == old[tenant.pk]  # what it sealed still opens
        assert keys.current_key(tenant).version == 2 and keys.current_key(tenant).key != old[tenant.pk]
