"""Headers that tell a browser what a page may do: a Content-Security-Policy on every response,
and Strict-Transport-Security on every response served over HTTPS (SecurityMiddleware sends it
for the dashboard; the API's handler, controlplane/api/handler.py, sends it itself).

The dashboard's pages load scripts, styles, fonts and images only from this origin (static/,
vendored, docs/architecture.md "Browser"), talk only to it (fetch and the live WebSockets: CSP's
'self' covers ws: and wss: of the same host), and run no inline script or style; no other site
may frame them. API answers are data: they may load nothing.

One exception, kept narrow: the terminal (xterm.js) writes its colours and cell sizes into
`<style>` elements it creates, and takes no nonce (upstream: xtermjs/xterm.js#4445). Every page's
policy therefore admits styles carrying this response's nonce (`request.csp_nonce`, in the page's
`<meta name="csp-nonce">`), which only a script of this origin can read and stamp: markup injected
into a page still cannot style it. xterm.js also writes a truecolour cell's colour as the cell's
`style` attribute: a page that shows a terminal (its response's `terminal_styles` set) admits style
attributes too (`style-src-attr 'unsafe-inline'`; never scripts, never `<style>` elements).
CodeMirror takes the nonce itself (`EditorView.cspNonce`)."""

import secrets

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.utils.decorators import sync_and_async_middleware

DASHBOARD = ("default-src 'self'; script-src 'self'; style-src 'self' 'nonce-{nonce}'; img-src 'self' data:; "
             "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
             "frame-ancestors 'none'")
API = "default-src 'none'; frame-ancestors 'none'"
API_PREFIX = "/api/v1/"  # the agent API (its own handler in production: controlplane/api/handler.py)


TERMINAL_STYLES = "; style-src-attr 'unsafe-inline'"
# What every API answer carries, and every answer the server writes before Django sees the request.
API_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
               "Content-Security-Policy": API}


def policy_for(request, response) -> str:
    if request.path.startswith(API_PREFIX):
        return API
    policy = DASHBOARD.format(nonce=request.csp_nonce)
    return policy + TERMINAL_STYLES if getattr(response, "terminal_styles", False) else policy


def _with_nonce(request):
    request.csp_nonce = secrets.token_urlsafe(16)
    return request


def raw_headers(scope) -> list[tuple[bytes, bytes]]:
    """API_HEADERS (and HSTS when the request came over HTTPS) as ASGI headers, for answers
    written before Django's handler runs: a body too large, a tenant's requests too fast."""
    headers = [(name.lower().encode(), value.encode()) for name, value in API_HEADERS.items()]
    if hsts := transport_security(scope_is_secure(scope)):
        headers.append((b"strict-transport-security", hsts.encode()))
    return headers


def scope_is_secure(scope) -> bool:
    """HTTPS as Django's `request.is_secure()` reads it: the scheme, or the header
    SECURE_PROXY_SSL_HEADER names, set by the TLS proxy in front."""
    if scope.get("scheme") in ("https", "wss"):
        return True
    if not settings.SECURE_PROXY_SSL_HEADER:
        return False
    header, value = settings.SECURE_PROXY_SSL_HEADER
    wanted = header.removeprefix("HTTP_").lower().replace("_", "-").encode()
    return any(name == wanted and sent.decode("latin-1").split(",")[0].strip() == value
               for name, sent in scope.get("headers", ()))


def transport_security(secure: bool) -> str | None:
    """The Strict-Transport-Security value for a response over HTTPS (`secure`), or None (plain
    HTTP, or turned off)."""
    if not secure or not settings.SECURE_HSTS_SECONDS:
        return None
    return f"max-age={settings.SECURE_HSTS_SECONDS}"


@sync_and_async_middleware
def content_security_policy(get_response):
    """Async when the chain is (no hop to a thread for one header)."""
    if iscoroutinefunction(get_response):
        async def middleware(request):
            response = await get_response(_with_nonce(request))
            response.headers.setdefault("Content-Security-Policy", policy_for(request, response))
            return response
    else:
        def middleware(request):
            response = get_response(_with_nonce(request))
            response.headers.setdefault("Content-Security-Policy", policy_for(request, response))
            return response
    return middleware
