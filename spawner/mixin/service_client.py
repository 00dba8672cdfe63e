"""Reaching the wmla service: its address, the spawner's token for it, and one blocking request
run in a thread (the hub's event loop never waits on a socket)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import AdmissionError


class ServiceCalls(Protocol):
    """One request to the wmla service's API; raises ``WmlaError`` (the service's answer) or
    :class:`AdmissionError` (the service cannot be found or the spawner has no token)."""

    async def call(
        self, method: str, path: str, body: Any = None, what: str = "", retry: float = 5.0
    ) -> Any: ...


@dataclass(frozen=True)
class ServiceLocation:
    """Where the service is and who the spawner is to it, as configured: the traits
    ``service_url``, ``service_name``, ``service_token``, ``token_service``, and the hub's table
    of services (``user.settings["services"]``) that fills in what they leave out."""

    url: str
    name: str
    token: str
    token_service: str
    hub_services: Mapping[str, Any] = field(default_factory=dict)
    config_class: str = "WmlaLocalSpawner"  # for the messages: c.<class>.service_url

    def service_url(self) -> str:
        if self.url:
            return self.url
        service = self.hub_services.get(self.name)
        if service is not None and getattr(service, "url", None):
            return service.url.rstrip("/") + service.prefix.rstrip("/") + "/"
        raise AdmissionError(
            f"where is the wmla service? No hub service {self.name!r} with a url; set "
            f"c.{self.config_class}.service_url"
        )

    def service_token(self) -> str:
        token = self.token or os.environ.get("WMLA_SPAWNER_TOKEN", "")
        if not token:
            service = self.hub_services.get(self.token_service)
            token = getattr(service, "api_token", "") or ""
        if not token:
            raise AdmissionError(
                "the spawner has no token for the wmla service: add the hub service from "
                "spawner.hubconfig.spawner_service() or set "
                f"c.{self.config_class}.service_token"
            )
        return token


class ServiceClient:
    """:class:`ServiceCalls` over HTTP through ``extension.client``, one client per request."""

    def __init__(self, location: ServiceLocation) -> None:
        self.location = location

    async def call(
        self, method: str, path: str, body: Any = None, what: str = "", retry: float = 5.0
    ) -> Any:
        """``retry``: seconds the client keeps trying while the service restarts (502/503, no
        connection). Short by default: the hub's polls and the spawn page must not hang on
        it; the submission, sent with an Idempotency-Key, waits longer."""
        from extension.client import WmlaClient

        def call() -> Any:
            location = self.location
            client = WmlaClient(
                location.service_url(), location.service_token(), env={}, retry_seconds=retry
            )
            try:
                return client.request(method, path, body=body, what=what or "notebook")
            finally:
                client.session.close()

        return await asyncio.to_thread(call)
