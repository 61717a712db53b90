"""A JSON client for tests that talk to a real server over loopback (server subprocesses)."""

import json
import urllib.error
import urllib.request


def call_api(base_url: str, method: str, path: str, *, bearer: str, body=None, raw: bytes | None = None,
             timeout: float = 60) -> tuple[int, object]:
    """(status, parsed JSON body or None). `raw` sends bytes as they are (a workspace file)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(base_url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {bearer}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            content = response.read()
            return response.status, json.loads(content) if content else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
