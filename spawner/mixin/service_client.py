"""Reaching the wmla service: its address, the spawner's token for it, and one blocking request
run in a thread (the hub's event loop never waits on a socket)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from .common import AdmissionError


class ServiceAccess:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads the traits ``service_url``,
    ``service_name``, ``service_token`` and ``token_service``, and the base spawner's ``user``
    (its ``settings["services"]``, the hub's service table)."""

    service_url: str
    service_name: str
    service_token: str
    token_service: str
    user: Any
    log: logging.Logger

    def _hub_service(self, name: str) -> Any:
        settings = getattr(self.user, "settings", None) or {}
        return (settings.get("services") or {}).get(name)

    def wmla_service_url(self) -> str:
        if self.service_url:
            return self.service_url
        service = self._hub_service(self.service_name)
        if service is not None and getattr(service, "url", None):
            return service.url.rstrip("/") + service.prefix.rstrip("/") + "/"
        raise AdmissionError(
            f"where is the wmla service? No hub service {self.service_name!r} with a url; set "
            f"c.{type(self).__name__}.service_url"
        )

    def wmla_token(self) -> str:
        token = self.service_token or os.environ.get("WMLA_SPAWNER_TOKEN", "")
        if not token:
            service = self._hub_service(self.token_service)
            token = getattr(service, "api_token", "") or ""
        if not token:
            raise AdmissionError(
                "the spawner has no token for the wmla service: add the hub service from "
                "spawner.hubconfig.spawner_service() or set "
                f"c.{type(self).__name__}.service_token"
            )
        return token

    async def _wmla_call(
        self, method: str, path: str, body: Any = None, what: str = "", retry: float = 5.0
    ) -> Any:
        """``retry``: seconds the client keeps trying while the service restarts (502/503, no
        connection). Short by default: the hub's polls and the spawn page must not hang on
        it; the submission, sent with an Idempotency-Key, waits longer."""
        from extension.client import WmlaClient

        def call() -> Any:
            client = WmlaClient(
                self.wmla_service_url(), self.wmla_token(), env={}, retry_seconds=retry
            )
            try:
                return client.request(method, path, body=body, what=what or "notebook")
            finally:
                client.session.close()

        return await asyncio.to_thread(call)
