"""Exit 0 when PostgreSQL and Redis answer at the given URLs, 1 (with the reason) otherwise."""

import socket
import sys
from urllib.parse import urlsplit


def reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError as exc:
        print(f"airlock: {parts.scheme} at {parts.hostname}:{parts.port or default_port} is not reachable: {exc}",
              file=sys.stderr)
        return False


if __name__ == "__main__":
    postgres_url, redis_url = sys.argv[1], sys.argv[2]
    sys.exit(0 if reachable(postgres_url, 5432) & reachable(redis_url, 6379) else 1)
