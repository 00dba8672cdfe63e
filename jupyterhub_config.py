"""The embedded default: JupyterHub on http://127.0.0.1:8000 with the wmla service.

`make run` starts it. One machine: a local spawner, each user's own password (set at the name's
first login; the admins' from $WMLA_ADMIN_PASSWORD or generated and shown once at the first
start; bcrypt hashes in var/hub-passwords.dbm*, see docs/auth.md), admin users from
$WMLA_ADMIN_USERS (comma-separated, default "admin"), and the wmla managed service at
/services/wmla/ with the machine's GPUs (or 1x4 virtual devices; $WMLA_DEVICE_LAYOUT, e.g.
4x8). Runtime state lives in var/ (hub database, cookie secret, proxy pid, service store, user
folders in var/storage); the hub runs with umask 0077 and the state files are made private (0600,
var/wmla 0700) at every start, see docs/service.md "State files".
"""

import json
import os
import shutil
import sys
from pathlib import Path

from extension.service.privacy import restrict_umask
from hub_config import (
    custom_scopes,
    private_hub_state,
    roles,
    server_token_scopes,
    services,
    stop_servers_before_services,
)
from hub_config.auth import configure_login
from hub_config.culler import culler_services, culler_settings
from hub_config.kubernetes import (
    KUBERNETES_BACKEND,
    backend_class,
    configure_kubernetes,
    user_storage,
)

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

# Every hub user has a terminal here: what the hub, the proxy and the wmla service create
# (database, cookie secret, pid files, the service's store) must not be readable by them.
restrict_umask()
ROOT = Path(__file__).resolve().parent
VAR = Path(os.environ.get("WMLA_VAR", ROOT / "var")).resolve()
# var/ 0711 (var/storage holds the users' folders), its state files 0600, var/wmla 0700
private_hub_state(VAR)
K8S_VAR = Path(os.environ.get("WMLA_K8S_VAR", ROOT / "var" / "k8s")).resolve()
# on Kubernetes the users' folders are the storage claim's (on `make k8s-up`'s cluster a host
# folder), where the pods see them too
ON_KUBERNETES = backend_class(os.environ.get("WMLA_BACKEND", "")) == KUBERNETES_BACKEND
STORAGE = Path(
    os.environ.get("WMLA_STORAGE_ROOT")
    or (user_storage(K8S_VAR) if ON_KUBERNETES else VAR / "storage")
).resolve()
ADMINS = [u.strip() for u in os.environ.get("WMLA_ADMIN_USERS", "admin").split(",") if u.strip()]

c.JupyterHub.ip = os.environ.get("WMLA_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("WMLA_HUB_PORT", "8000"))
c.JupyterHub.hub_port = int(os.environ.get("WMLA_HUB_API_PORT", "8081"))
c.JupyterHub.db_url = f"sqlite:///{VAR / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(VAR / "jupyterhub_cookie_secret")

proxy = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = [
    str(proxy) if proxy.exists() else shutil.which("configurable-http-proxy") or str(proxy)
]
PROXY_API_PORT = os.environ.get("WMLA_PROXY_API_PORT", "8001")
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.ConfigurableHTTPProxy.pid_file = str(VAR / "jupyterhub-proxy.pid")

# -- who may log in: each user name's own password, set at its first login; the admins' set at
# the first start from $WMLA_ADMIN_PASSWORD, or generated and shown that once; hashes only, in
# var/hub-passwords.dbm* (0600). $WMLA_AUTHENTICATOR=pam (or ldapauthenticator, github, ...)
# hands logins to another authenticator instead (hub_config/auth.py, docs/auth.md)
configure_login(c, VAR, ADMINS)
# API tokens expire (wmla logon's, the token page's): JupyterHub gives a token asked for
# without expires_in this many seconds and refuses a longer one; a token that never expires
# outlives the person's access (docs/auth.md "Tokens"). The site's settings file may change it
# (0: no limit).
c.JupyterHub.token_expires_in_max_seconds = 30 * 24 * 3600

# -- notebook servers: local processes admitted by the user's plan (spawner/, docs/spawner.md);
# each user's home is their storage folder (as root: owned by their own system account)
c.JupyterHub.spawner_class = "wmla-local"
singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
if singleuser.exists():  # the project's environment, wherever the hub was started from
    c.Spawner.cmd = [str(singleuser)]
c.WmlaLocalSpawner.storage_root = str(STORAGE)
# Anyone may sign up under any name not yet taken, so a hub user must never be able to
# claim an account the machine already has (a hub user "nobody" or named like an admin's
# account): as root, notebooks and jobs run as "wmla-<name>" accounts that wmla creates. With an
# authenticator whose users are the machine's own accounts (PAM, LDAP), "{username}" is right.
ACCOUNT_TEMPLATE = os.environ.get("WMLA_ACCOUNT_TEMPLATE", "wmla-{username}")
c.WmlaLocalSpawner.system_user_template = ACCOUNT_TEMPLATE
c.WmlaLocalSpawner.start_timeout = 600  # a notebook may wait for room in its plan
# a server's ceiling, held by its cgroup (KubeSpawner's names; the request, what its plan is
# charged, stays the limit range's default or the profile's cpu_guarantee / mem_guarantee)
c.WmlaLocalSpawner.cpu_limit = float(os.environ.get("WMLA_NOTEBOOK_CPU_LIMIT", "2"))
c.WmlaLocalSpawner.mem_limit = os.environ.get("WMLA_NOTEBOOK_MEM_LIMIT", "4G")
# the spawn page: a notebook size, and the plans this user may use (plan_choice, on by default);
# KubeSpawner's profile_list shape, so the same list serves c.KubeSpawner.profile_list
c.WmlaLocalSpawner.profile_list = [
    {"display_name": "CPU only", "slug": "cpu", "default": True,
     "description": "for notebooks; training jobs get their GPUs from their plan"},
    {"display_name": "1 GPU", "slug": "gpu", "kubespawner_override": {"gpus": 1},
     "description": "stopped after 15 idle minutes, so the GPU goes back to the pool"},
]  # fmt: skip
c.WmlaKubeSpawner.profile_list = c.WmlaLocalSpawner.profile_list  # the same list on Kubernetes
c.Spawner.http_timeout = 60
c.Spawner.server_token_scopes = server_token_scopes()
# what the client in a notebook needs besides $JUPYTERHUB_API_TOKEN (see docs/service.md)
c.Spawner.environment = {
    "WMLA_STORAGE_ROOT": str(STORAGE),
    "WMLA_API_URL": f"http://{c.JupyterHub.ip}:{c.JupyterHub.port}/services/wmla/api/v1",
}
if hasattr(os, "geteuid") and os.geteuid() == 0:
    c.Spawner.args = ["--allow-root"]

# -- the wmla service ------------------------------------------------------------------------
service_config = {
    "state_dir": str(VAR / "wmla"),
    "storage_root": str(STORAGE),
    # the same accounts for jobs as for notebooks (see system_user_template above)
    "backend_options": {"account_template": ACCOUNT_TEMPLATE},
}
if os.environ.get("WMLA_DEVICE_LAYOUT"):
    service_config["device_layout"] = os.environ["WMLA_DEVICE_LAYOUT"]
# each user's folder its own filesystem, its size held by the kernel (docs/security.md
# "Storage quotas"); as root, 10 GiB unless $WMLA_STORAGE_QUOTA says otherwise ("" turns it off)
STORAGE_QUOTA = os.environ.get("WMLA_STORAGE_QUOTA", "10Gi" if os.geteuid() == 0 else "")
if STORAGE_QUOTA:  # "50Gi", or JSON: {"storage": "50Gi", "soft_storage": "40Gi", "grace": "7d"}
    quota = json.loads(STORAGE_QUOTA) if STORAGE_QUOTA.lstrip().startswith("{") else STORAGE_QUOTA
    service_config["default_storage_quota"] = quota
    # each notebook server's /tmp inside its user's image too (extension/storage/images.py)
    c.WmlaLocalSpawner.private_tmp_template = str(
        VAR / "wmla" / "storage" / "mnt" / "{username}" / "tmp"
    )
service_env: dict[str, str] = {}
if os.environ.get("WMLA_BACKEND"):
    # "kubernetes": the local cluster of `make k8s-up` (hub_config/kubernetes.py)
    service_config["backend_class"] = backend_class(os.environ["WMLA_BACKEND"])
    if service_config["backend_class"] == KUBERNETES_BACKEND:
        kube = configure_kubernetes(c, K8S_VAR, STORAGE)
        service_env = kube["environment"]
        service_config["backend_options"] = kube["backend_options"]
# the device node of GPU i, which a job's or notebook's cgroup may open when it holds GPU i
# (docs/security.md "Grants held by the kernel"); default /dev/nvidia{index}
GPU_DEVICE_TEMPLATE = os.environ.get("WMLA_GPU_DEVICE_TEMPLATE", "/dev/nvidia{index}")
if "kubernetes" not in service_config.get("backend_class", ""):  # the local backend's option
    service_config["backend_options"]["gpu_device_template"] = GPU_DEVICE_TEMPLATE
c.WmlaLocalSpawner.gpu_device_template = GPU_DEVICE_TEMPLATE
c.JupyterHub.services = services(
    port=int(os.environ.get("WMLA_SERVICE_PORT", "10101")),
    config={"WmlaService": service_config},
    environment=service_env,
    cwd=ROOT,
)
c.JupyterHub.custom_scopes = custom_scopes()
c.JupyterHub.load_roles = roles(admin_users=ADMINS)
# hub pages: a "Plans" link to the wmla admin page for plan admins (hub_config/templates)
# (before the authenticator's own templates, which configure_login put there)
ours = str(ROOT / "hub_config" / "templates")
c.JupyterHub.template_paths = [ours, *c.JupyterHub.get("template_paths", [])]
# the spawner's token: it submits notebook jobs for users (custom:wmla:admin)
from spawner.hubconfig import spawner_service  # noqa: E402

spawner_entry, spawner_role = spawner_service()
c.JupyterHub.services.append(spawner_entry)
c.JupyterHub.load_roles.append(spawner_role)

# -- idle notebooks give their resources back (docs/spawner.md "Idle notebooks"): servers idle
# for $WMLA_CULL_TIMEOUT s (default 3600) are stopped, those holding GPUs after
# $WMLA_CULL_GPU_TIMEOUT s (default 900; the spawner keeps their users in the hub group the GPU
# culler is scoped to); "0" turns one off. Stopping a server releases its notebook job.
culler_entries, culler_roles = culler_services(**culler_settings())
c.JupyterHub.services.extend(culler_entries)
c.JupyterHub.load_roles.extend(culler_roles)

# -- shutdown: JupyterHub stops the managed services before the users' servers, so a server
# stopped at shutdown could not release its notebook job; stop the servers first, while the
# wmla service still runs (with c.JupyterHub.cleanup_servers = False they are left running)
stop_servers_before_services()

# -- restarts: a managed service that exits is restarted 2 s later (JupyterHub polls every 30 s),
# and until it answers the proxy's error for /services/wmla/api/ is JSON, not the HTML page
from hub_config.restarts import fast_service_restart, json_proxy_errors  # noqa: E402

fast_service_restart()
json_proxy_errors()

# -- the site's own settings, last (they win): $WMLA_SETTINGS, else
# /etc/jupyterhub-wmla/config.py, else var/local_config.py; a traitlets config file like this
# one (c = get_config(); c.JupyterHub.port = ...). Refused when others than root or the hub's
# user could change it (hub_config/settings.py; README "Settings")
from hub_config.settings import SettingsError, settings_file  # noqa: E402

try:
    SETTINGS = settings_file(VAR)
except SettingsError as err:
    raise SystemExit(f"jupyterhub_config.py: {err}") from None
if SETTINGS is not None:
    load_subconfig(str(SETTINGS))  # noqa: F821 - provided by the traitlets loader
    print(f"jupyterhub_config.py: settings loaded from {SETTINGS}", file=sys.stderr)
