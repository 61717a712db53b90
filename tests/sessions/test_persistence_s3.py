"""Snapshots and artifacts in object storage, by configuration alone (sessions/persistence/, README
"Persistence"): django-storages' S3 backend against moto's S3 server on loopback, on real
sandboxes. What is stored holds no plaintext, comes back whole, is refused once altered, is
pruned and swept, and downloads."""

import io
import tarfile
import uuid
from datetime import timedelta

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from controlplane.models import ApiKeyScope
from sessions.models import Snapshot
from sessions.persistence import services as persistence
from tests.sessions.conftest import Agent, publish
from tests.sessions.test_persistence import MARKER, PERSISTENT, _denied, _resume, _script, _snapshot_of, _tree

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("storages.backends.s3")



@pytest.fixture
def keeper(acme, make_key, api, runner):
    publish(acme, PERSISTENT)
    return Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)


@pytest.fixture
def s3(settings, monkeypatch):
    """moto's S3 on 127.0.0.1, and Airlock's persistence storage pointed at it as a deployment
    would point it (AIRLOCK_STORAGE_BACKEND and AIRLOCK_STORAGE_OPTIONS become this STORAGES
    entry). The credentials are given, so boto3 looks nowhere else for them."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        bucket = f"airlock-{uuid.uuid4().hex[:12]}"  # moto keeps its buckets per process: one of its own
        options = {"bucket_name": bucket, "endpoint_url": f"http://127.0.0.1:{port}", "access_key": "airlock-test",
                   "secret_key": "airlock-test-secret", "region_name": "us-east-1", "file_overwrite": False}
        client = boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id=options["access_key"],
                              aws_secret_access_key=options["secret_key"], region_name=options["region_name"])
        client.create_bucket(Bucket=bucket)
        settings.STORAGES = {**settings.STORAGES,
                             "persistence": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options}}
        assert type(storages["persistence"]).__name__ == "S3Storage"
        yield Bucket(client, bucket)
    finally:
        server.stop()


class Bucket:
    def __init__(self, client, name: str):
        self.client, self.name = client, name

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body)

    def keys(self) -> list[str]:
        return [item["Key"] for item in self.client.list_objects_v2(Bucket=self.name).get("Contents", [])]


def test_a_snapshot_goes_to_object_storage_sealed_and_comes_back_whole(keeper, s3):
    _, snapshot = _snapshot_of(keeper)
    stored = s3.get(snapshot.blob_name)
    assert len(stored) == snapshot.stored_bytes
    assert MARKER not in stored and b"VALUE = 42" not in stored

    second = _resume(keeper, "latest")
    assert second.status_code == 201, second.content
    tree = _tree(keeper, second.json())
    assert tree["run.sh"][1] == 0o750 and tree["empty/inner"][1] == 0o700 and tree["locked"][1] == 0
    assert keeper.get(second.json(), "src/pkg/mod.py").content.startswith(b"VALUE = 42\n")
    assert persistence.verify(snapshot)["valid"] is True


def test_an_object_altered_in_the_bucket_is_refused(keeper, s3):
    _, snapshot = _snapshot_of(keeper)
    stored = bytearray(s3.get(snapshot.blob_name))
    stored[len(stored) // 2] ^= 0x01
    s3.put(snapshot.blob_name, bytes(stored))
    decision = _denied(_resume(keeper, "latest"), "provenance_invalid", "persistence.blob")
    assert "does not authenticate" in decision["message"]
    assert persistence.verify(snapshot)["valid"] is False


def test_retention_deletes_the_object_and_a_sweep_removes_one_without_a_row(keeper, s3):
    _, snapshot = _snapshot_of(keeper)
    orphan = f"{snapshot.blob_name.rsplit('/', 1)[0]}/left-by-a-crash.alk"
    s3.put(orphan, b"sealed bytes")
    assert sorted(s3.keys()) == sorted([snapshot.blob_name, orphan])
    Snapshot.objects.filter(pk=snapshot.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    pruned = persistence.prune(now=timezone.now() + timedelta(hours=2))  # the orphan is then over an hour old
    assert (pruned.snapshots, pruned.blobs) == (1, 1)
    assert s3.keys() == []


def test_an_artifact_downloads_from_object_storage(keeper, s3):
    session = keeper.open()
    _script(keeper, session, "make.py", b"open('out.txt', 'w').write('built')\n")
    response = keeper.as_session(session).post(f"/api/v1/sessions/{session['id']}/artifacts",
                                               {"name": "out", "paths": ["out.txt"]}, content_type="application/json")
    assert response.status_code == 201, response.content
    download = keeper.client.get(f"/api/v1/artifacts/{response.json()['id']}/download")
    assert download.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(b"".join(download))) as archive:
        assert archive.extractfile("out.txt").read() == b"built"
