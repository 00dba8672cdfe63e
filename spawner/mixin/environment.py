"""The kernel's environment: what the wmla client and the magics in a notebook read to find the
service, the user's plan and folder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelEnvironment:
    """The values behind the ``WMLA_*`` variables; the token is JUPYTERHUB_API_TOKEN
    (server_token_scopes), not here."""

    service_url: str
    service_name: str
    user: str
    leaf: str
    folder: str
    storage_root: str
    job_id: str
    ipython_dir: str | None = None

    def variables(self) -> dict[str, str]:
        env = {
            "WMLA_URL": self.service_url,
            "WMLA_SERVICE_NAME": self.service_name,
            "WMLA_USER": self.user,
            "WMLA_PLAN": self.leaf.rsplit("/", 1)[0] if self.leaf else "",
            "WMLA_LEAF": self.leaf,
            "WMLA_USER_DIR": self.folder,
            "WMLA_STORAGE_ROOT": self.storage_root,
            "WMLA_NOTEBOOK_JOB": self.job_id,
        }
        if self.ipython_dir:
            env["IPYTHONDIR"] = self.ipython_dir
        return env
