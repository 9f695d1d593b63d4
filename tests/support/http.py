"""A plain HTTP GET for tests that poll an agent's ops endpoint from outside the process."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(address: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of GET http://<address><path>; an HTTP error is an answer too, and a
    connection that fails (nothing listening yet, reset) is (0, the error)."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)
