"""The service's tornado application: its routes (the API, metering, the admin pages, HubOAuth's
callback), its request log, and binding its port."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler
from tornado import web
from tornado.httpserver import HTTPServer

from extension.metering.handlers import metering_routes
from extension.service.admin import admin_routes
from extension.service.admin.handlers import HomePage
from extension.storage.web import storage_routes
from extension.webapi import APIError, APIHandler

from .handlers import routes
from .request_rate import RequestRate
from .shares import share_routes


class NotFoundHandler(APIHandler):
    def prepare(self) -> None:
        raise APIError(404, f"no such endpoint {self.request.path}; see api/v1/openapi.json")


def web_application(service: Any, prefix: str) -> web.Application:
    """The routes under ``prefix`` (ending in /) with the service's scheduler and meter."""
    log = service.log

    def log_request(handler: web.RequestHandler) -> None:
        status = handler.get_status()
        level = logging.INFO if status < 400 else logging.WARNING
        if handler.request.path.endswith("/health") or status == 429:
            level = logging.DEBUG  # a rate's refusals: counted once a minute (request_rate.py)
        log.log(
            level,
            "%i %s %s %.1fms",
            status,
            handler.request.method,
            handler.request.uri,
            1000 * handler.request.request_time(),
        )

    return web.Application(
        [
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
            (prefix + "?", HomePage),  # the user's jobs and storage (admin/handlers.py)
            *routes(prefix),
            *share_routes(prefix),  # fair share: GET shares, shares/history, POST shares/reset
            *metering_routes(prefix),
            *admin_routes(prefix),  # the plan admin page (extension/service/admin)
            *storage_routes(prefix),  # GET storage: the users' storage quotas
        ],
        default_handler_class=NotFoundHandler,
        cookie_secret=secrets.token_bytes(32),
        wmla_scheduler=service.scheduler,
        wmla_service=service,
        wmla_meter=service.meter,
        wmla_request_rate=RequestRate(parent=service).buckets(),  # each user's requests, bounded
        wmla_prefix=prefix,
        log_function=log_request,
    )


async def listen(http: HTTPServer, port: int, ip: str, wait: float = 10.0) -> None:
    """Bind, waiting a little while the port is still taken (the service before this one
    is closing it); then exit naming the port instead of crashing in a loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            http.listen(port, ip)
            return
        except OSError as err:
            if err.errno != errno.EADDRINUSE or loop.time() >= deadline:
                raise SystemExit(
                    f"wmla: cannot listen on {ip}:{port}: {err.strerror}; another process "
                    f"has the port: stop it, or set the service's url/port"
                ) from None
        await asyncio.sleep(0.25)


async def serve(service: Any, ip: str, port: int, prefix: str) -> HTTPServer:
    """The service's HTTP server, listening (and said in the log): at ``ip``/``port`` or where
    the hub says the service is ($JUPYTERHUB_SERVICE_URL)."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    app = web_application(service, prefix)
    service_url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    ip = ip or service_url.hostname or "127.0.0.1"
    port = port or service_url.port or 10101
    # read bodies up to 16 MiB so that one over the API's 1 MiB gets a JSON 413 naming the
    # limit (tornado would drop the connection, and the proxy answer 503 HTML)
    http = HTTPServer(app, xheaders=True, max_body_size=16 * 1024 * 1024)
    await listen(http, port, ip)
    service.log.info("wmla service at http://%s:%i%s", ip, port, prefix)
    return http
