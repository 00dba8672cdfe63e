"""The few seconds while the hub restarts the wmla service: short, and answered in JSON.

JupyterHub restarts a managed service that exited when its process poll notices, every 30 s
(``Spawner.poll_interval`` of the service's spawner, which no config reaches). Meanwhile the
proxy answers every request with the hub's HTML error page, which the API's clients cannot read.
Both are changed here, from the hub's config file, by two small patches that leave everything
else of JupyterHub alone (and that say so in the hub's log when a JupyterHub release moved
what they patch):

- the service's spawner polls its process every ``poll_seconds`` (2);
- the hub's proxy error page answers JSON ``{"error", "status", "retry_after"}`` for requests
  under ``/services/<name>/api/``; pages and other paths keep the hub's HTML page.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger("JupyterHub")
RETRY_AFTER = 2


def fast_service_restart(poll_seconds: int = 2) -> bool:
    """Managed services are restarted ``poll_seconds`` after they exit, not 30 s."""
    try:
        from jupyterhub.services import service
        from traitlets import Integer

        base = service._ServiceSpawner
    except (ImportError, AttributeError) as err:
        log.warning("wmla: cannot shorten the service restart (%s); it takes up to 30 s", err)
        return False
    if getattr(base, "_wmla_fast", False):
        return True

    class FastPolledServiceSpawner(base):  # type: ignore[misc, valid-type]
        _wmla_fast = True
        poll_interval = Integer(poll_seconds)

    service._ServiceSpawner = FastPolledServiceSpawner
    return True


def json_proxy_errors(service_name: str = "wmla") -> bool:
    """The proxy's error answers for the service's API are JSON, not the hub's HTML page."""
    try:
        from jupyterhub.handlers import pages
        from jupyterhub.utils import url_path_join

        handler = pages.ProxyErrorHandler
        original = handler.get
    except (ImportError, AttributeError) as err:
        log.warning("wmla: the proxy's error pages stay HTML for the API (%s)", err)
        return False
    if getattr(original, "_wmla_json", False):
        return True

    async def get(self: Any, status_code_s: str) -> Any:
        api = url_path_join(self.base_url, f"services/{service_name}/api/")
        if not urlparse(self.get_argument("url", "")).path.startswith(api):
            return await original(self, status_code_s)
        code = int(status_code_s)
        self.set_status(code)
        # the proxy passes on the status, the Content-Type and the body (not Retry-After)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Retry-After", str(RETRY_AFTER))
        message = (
            f"the {service_name} service is not answering (HTTP {code} from the hub's proxy): "
            f"it is probably restarting; try again in a few seconds. If this lasts, the hub's "
            f"log says why it does not start"
        )
        # "source": a proxy's answer may come after the request reached the service (a lost
        # connection), unlike the service's own 503 (nothing stored): clients tell them apart
        body = {"error": message, "status": code, "retry_after": RETRY_AFTER, "source": "proxy"}
        self.finish(json.dumps(body))

    get._wmla_json = True  # type: ignore[attr-defined]
    handler.get = get
    return True
