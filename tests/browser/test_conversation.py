"""A conversation's page in real Chromium: its snapshot's provenance, and Verify reporting it valid,
then invalid once the stored blob is tampered with."""

from pathlib import Path

import pytest

from tests.browser.test_first_run import log_in
from tests.browser.test_sessions import call, open_session

pytestmark = pytest.mark.browser


def test_verify_reports_a_snapshot_valid_then_invalid_after_tampering(page, demo_server):
    session = open_session(demo_server, conversation_id="conv-kept", persist=True)
    path = f"/api/v1/sessions/{session['id']}"
    assert call(demo_server, "PUT", f"{path}/files/notes/today.txt", raw=b"kept across sessions\n",
                token=session["token"])[0] == 204
    status, ended = call(demo_server, "DELETE", path, token=session["token"])
    assert status == 200 and ended["snapshot"], ended
    snapshot = ended["snapshot"]

    log_in(page, demo_server)
    page.goto(f"{demo_server.url}/t/demo/sessions/{session['id']}/")
    page.get_by_test_id("conversation-link").click()
    row = page.locator(f"tr[data-stored='{snapshot}']")
    provenance = row.get_by_test_id("provenance").inner_text()
    assert "policy default v" in provenance and "bubblewrap" in provenance and "root filesystem sha256:" in provenance
    row.get_by_test_id("verify").click()
    page.locator(".msg", has_text="is valid").wait_for()

    [blob] = Path(demo_server.env["AIRLOCK_DATA_DIR"]).glob(f"persistence/*/snapshots/{snapshot}.alk")
    data = bytearray(blob.read_bytes())
    data[-20] ^= 0x40
    blob.write_bytes(data)
    page.locator(f"tr[data-stored='{snapshot}']").get_by_test_id("verify").click()
    message = page.locator(".msg", has_text="is invalid")
    message.wait_for()
    assert "provenance_invalid" in message.inner_text() and "persistence.blob" in message.inner_text()
    status, refused = call(demo_server, "POST", "/api/v1/sessions", {"conversation_id": "conv-kept",
                                                                    "resume": snapshot})
    assert status == 403 and refused["decision"]["reason_code"] == "provenance_invalid"
