"""The policy page's Run eval: the suite on a thread of the server's process (its embedded runner
runs the sandboxes), one at a time per version and driver; the scorecard appears when it ends."""

import logging
import threading

from django.db import close_old_connections

from sessions.evals.suite import run_suite

log = logging.getLogger("airlock.evals")
_running: set[tuple[int, str]] = set()
_lock = threading.Lock()


def start(*, tenant, version, driver: str) -> bool:
    """Start the suite for `version` on `driver`; False when one already runs for them."""
    key = (version.pk, driver)
    with _lock:
        if key in _running:
            return False
        _running.add(key)

    def work() -> None:
        try:
            run_suite(tenant=tenant, version=version, driver=driver)
        except Exception:
            log.exception("the containment eval of %s on %s could not run", version, driver)
        finally:
            with _lock:
                _running.discard(key)
            close_old_connections()

    threading.Thread(target=work, name=f"containment-eval-{version.pk}-{driver}", daemon=True).start()
    return True

