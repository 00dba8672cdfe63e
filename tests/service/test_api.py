"""The wmla REST API through a real JupyterHub, real configurable-http-proxy and the real service.

The hub runs from the repository's jupyterhub_config.py (ports and runtime folder moved to a temp
dir) and the service runs jobs through the real LocalBackend: tiny Python scripts in the user's
folder. Tokens come from the hub API for an admin, a plan admin (custom:wmla:admin), and two
users. The last test restarts the hub and with it the service: nothing is lost.
"""

from __future__ import annotations

import json
import os

import pytest

from .hub import PROXY, Client, Hub
from .openapi_schema import schema_checker

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)

SCRIPT = """
import json, os, sys, time
job_dir = os.environ["WMLA_JOB_DIR"]
rank = int(os.environ.get("RANK", "0"))
print(f"hi from rank {rank} of {os.environ.get('WORLD_SIZE')}", flush=True)
if rank == 0:
    with open(os.path.join(job_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 1, "loss": 0.5}) + "\\n")
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("hub")
    traits = {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2}
    # workers run as the service's own account: whether a system account named like a test
    # user exists on this machine is not what these tests are about
    traits["backend_options"] = {"run_as_user": False}
    hub = Hub(tmp, traits)
    try:
        hub.start()
        hub.clients = {
            name: Client(hub, hub.user_token(name))
            for name in ("admin", "padmin", "user1", "user2")
        }
        for user in ("user1", "user2", "padmin"):
            folder = hub.storage / user / "models" / "hi"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "main.py").write_text(SCRIPT)
        yield hub
    finally:
        hub.stop()


@pytest.fixture(scope="module")
def project1(hub: Hub) -> None:
    """The seed's /project1 with dev-team (4, gpu 4) and qa-team (2, gpu 2, members: user2)."""
    admin = hub.clients["admin"]
    for body in (
        {"path": "/project1"},
        {"path": "/project1/dev-team", "share": 4, "limit": {"gpu": 4}},
        {"path": "/project1/qa-team", "share": 2, "limit": {"gpu": 2}},
    ):
        r = admin.post("/plans", json=body)
        assert r.status_code == 201, r.text
    r = admin.patch("/plans/project1/qa-team", json={"members": {"users": ["user2"]}})
    assert r.status_code == 200 and r.json()["members"]["users"] == ["user2"]


def job_body(plan: str, workers=1, seconds: float = 0, **extra) -> dict:
    return {
        "plan": plan,
        "workers": workers,
        "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/hi", "model_main": "main.py", "args": [str(seconds)]},
        **extra,
    }


def error_of(r) -> str:
    assert r.headers["Content-Type"].startswith("application/json"), r.text
    body = r.json()
    assert body["status"] == r.status_code and body["error"], body
    return body["error"]


def test_openapi_document_parses_and_resolves(hub: Hub) -> None:
    r = Client(hub, None).get("/openapi.json")  # documentation needs no token
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    assert {"/plans", "/plans/{path}", "/jobs", "/jobs/{job_id}", "/instance"} <= set(doc["paths"])
    assert {"/jobs/{job_id}/logs", "/jobs/{job_id}/metrics"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs <= set(schemas), refs - set(schemas)


def test_unauthenticated_and_unknown_endpoints_are_json_errors(hub: Hub) -> None:
    r = Client(hub, None).get("/plans")
    assert r.status_code == 403 and "token" in error_of(r)
    r = Client(hub, "not-a-token").get("/jobs")
    assert r.status_code == 403
    r = hub.clients["user1"].get("/nope")
    assert r.status_code == 404 and "openapi.json" in error_of(r)


def test_whoami_and_default_plans(hub: Hub) -> None:
    me = hub.clients["user1"].get("/").json()
    assert me["name"] == "user1" and me["plan_admin"] is False
    assert me["storage"].endswith("/storage/user1")
    assert hub.clients["admin"].get("/").json()["plan_admin"] is True  # hub admin
    assert hub.clients["padmin"].get("/").json()["plan_admin"] is True  # custom:wmla:admin
    tree = hub.clients["user1"].get("/plans").json()
    paths = {p["path"] for p in tree["plans"]}
    assert {
        "/sample-project",
        "/sample-project/training",
        "/sample-project/inference",
        "/sample-project/notebooks",
    } <= paths
    sample = next(c for c in tree["root"]["children"] if c["path"] == "/sample-project")
    assert {c["name"] for c in sample["children"]} >= {"training", "inference", "notebooks"}
    assert {"deserved", "allocated", "demand"} <= set(sample)


def test_instance_reports_capacity_quota_and_limit_range(hub: Hub) -> None:
    inst = hub.clients["user1"].get("/instance").json()
    assert inst["capacity"]["gpu"] == 4 and len(inst["nodes"]) == 1
    assert inst["capacity"]["cpu"] == 2 * 1000 * (os.cpu_count() or 1)  # oversubscription 2
    assert inst["limit_range"]["default_request"]["gpu"] == 1
    assert inst["backend"] == "extension.backends.local.LocalBackend"


def test_plan_crud_is_for_plan_admins_only(hub: Hub) -> None:
    admin, padmin, user1 = hub.clients["admin"], hub.clients["padmin"], hub.clients["user1"]
    r = user1.post("/plans", json={"path": "/mine"})
    assert r.status_code == 403 and "custom:wmla:admin" in error_of(r)
    for body in (
        {"path": "/crud"},
        {"path": "/crud/a", "share": 4, "limit": {"gpu": 4}},
        {"path": "/crud/b", "share": 2, "limit": {"gpu": 2}},
    ):
        r = admin.post("/plans", json=body)
        assert r.status_code == 201, r.text
    assert admin.get("/plans/crud/a").json()["limit"] == {"gpu": 4}
    r = user1.patch("/plans/crud/a", json={"share": 1})
    assert r.status_code == 403
    r = padmin.patch("/plans/crud/b", json={"share": 3})
    assert r.status_code == 200 and r.json()["share"] == 3
    r = user1.delete("/plans/crud/b")
    assert r.status_code == 403
    for path in ("/plans/crud/b", "/plans/crud/a", "/plans/crud"):
        r = padmin.delete(path)
        assert r.status_code == 204, r.text
    assert user1.get("/plans/crud").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("post", "/plans", {"path": "/project1/dev-team/x", "limit": {"gpu": 8}}, 400, "above"),
        ("post", "/plans", {"path": "/project1", "share": 1}, 409, "already exists"),
        ("post", "/plans", {"path": "/p", "share": -1}, 400, "share must be a number above 0"),
        ("post", "/plans", {"path": "/p", "share": "lots"}, 400, "share must be a number"),
        ("post", "/plans", {"path": "/p/../etc"}, 400, "not allowed"),
        ("post", "/plans", {"path": "/nope/child"}, 400, "parent plan /nope does not exist"),
        ("post", "/plans", {"path": "/p", "colour": "red"}, 400, "unknown field 'colour'"),
        ("post", "/plans", {"path": "/p", "limit": {"gpu": -2}}, 400, "negative"),
        ("post", "/plans", {"path": "/p", "limit": {"disk": 1}}, 400, "unknown resource"),
        ("post", "/plans", "[1, 2", 400, "not valid JSON"),
        ("patch", "/plans/project1", {"limit": {"gpu": 1}}, 400, "above the limit"),
        ("patch", "/plans/nope", {"share": 2}, 404, "no plan"),
        ("delete", "/plans/project1", None, 400, "has child plans"),
        ("delete", "/plans/nope", None, 404, "no plan"),
    ],
    ids=[
        "child-limit-above-parent",
        "exists",
        "negative-share",
        "string-share",
        "path-like-name",
        "missing-parent",
        "unknown-field",
        "negative-limit",
        "unknown-resource",
        "malformed-json",
        "parent-limit-below-child",
        "patch-unknown",
        "delete-with-children",
        "delete-unknown",
    ],
)
def test_plan_validation_errors_change_nothing(
    hub, project1, method, path, body, status, words
) -> None:
    admin = hub.clients["admin"]
    before = admin.get("/plans").json()["plans"]
    kwargs = {"data": body} if isinstance(body, str) else {"json": body}
    r = admin(method.upper(), path, **({} if body is None else kwargs))
    assert r.status_code == status, r.text
    assert words in error_of(r)
    after = admin.get("/plans").json()["plans"]
    assert [(p["path"], p["share"], p["limit"]) for p in after] == [
        (p["path"], p["share"], p["limit"]) for p in before
    ]


def test_membership_refusal_names_the_plans_you_may_use(hub: Hub, project1) -> None:
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", json=job_body("/project1/qa-team"))
    assert r.status_code == 403
    message = error_of(r)
    assert "/project1/qa-team" in message and "/sample-project/training" in message
    assert "/project1/dev-team" in message.split("may use:")[1]
    assert "/project1/qa-team" not in message.split("may use:")[1]


def test_s2_limit_rejects_at_submit_and_dev_team_finishes(hub: Hub, project1) -> None:
    """S2: qa-team (GPU limit 2) refuses 4 workers x 1 GPU; dev-team runs the same to FINISHED."""
    user2 = hub.clients["user2"]
    r = user2.post("/jobs", json=job_body("/project1/qa-team", workers=4))
    assert r.status_code == 422
    message = error_of(r)
    assert "plan /project1/qa-team has a gpu limit of 2" in message
    assert "asks for 4 gpu" in message
    assert all(j["plan"] != "/project1/qa-team" for j in user2.get("/jobs").json()["jobs"])
    r = user2.post("/jobs", json=job_body("/project1/dev-team", workers=4))
    assert r.status_code == 201, r.text
    job = user2.wait_state(r.json()["id"], {"FINISHED", "FAILED"})
    assert job["state"] == "FINISHED", json.dumps(job)
    assert job["leaf"] == "/project1/dev-team/user2"


def test_s3_user_leaf_logs_metrics_and_history(hub: Hub, project1) -> None:
    """S3: user1's job on /project1/dev-team is charged to /project1/dev-team/user1."""
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", json=job_body("/project1/dev-team", workers=2, name="s3"))
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["leaf"] == "/project1/dev-team/user1"
    assert created["workdir"] == str(hub.storage / "user1" / "jobs" / created["id"])
    job = user1.wait_state(created["id"], {"FINISHED", "FAILED"})
    assert job["state"] == "FINISHED", json.dumps(job)
    leaf = user1.get("/plans/project1/dev-team/user1").json()
    assert leaf["user_leaf"] is True and leaf["share"] == 1
    logs = user1.get(f"/jobs/{job['id']}/logs").json()["logs"]
    assert "hi from rank 0 of 2" in logs and "hi from rank 1 of 2" in logs
    one = user1.get(f"/jobs/{job['id']}/logs", params={"worker": 1}).json()["logs"]
    assert "rank 1" in one and "rank 0" not in one
    metrics = user1.get(f"/jobs/{job['id']}/metrics").json()
    assert metrics["metrics"] == [{"step": 1, "loss": 0.5}] and metrics["next"] == 1
    history = user1.get(f"/jobs/{job['id']}/history").json()["transitions"]
    events = [(t["event"], t["workers"]) for t in history]
    assert events[0] == ("submitted", 0) and ("started", 2) in events
    assert events[-1] == ("finished", 0)
    assert all(t["leaf"] == "/project1/dev-team/user1" for t in history)


def test_users_see_only_their_own_jobs(hub: Hub) -> None:
    user1, user2, admin = hub.clients["user1"], hub.clients["user2"], hub.clients["admin"]
    r = user1.post("/jobs", json=job_body("/sample-project/training", seconds=300))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    r = user2.post("/jobs", json=job_body("/sample-project/training"))
    assert r.status_code == 201, r.text
    user1.wait_state(job_id, {"RUNNING"})
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/logs", f"/jobs/{job_id}/metrics"):
        r = user2.get(path)
        assert r.status_code == 404 and "no job" in error_of(r)
    r = user2.delete(f"/jobs/{job_id}")
    assert r.status_code == 404
    assert job_id not in {j["id"] for j in user2.get("/jobs").json()["jobs"]}
    assert user2.get("/jobs", params={"user": "user1"}).status_code == 403
    assert {j["user"] for j in user2.get("/jobs").json()["jobs"]} <= {"user2"}
    everyone = {j["user"] for j in admin.get("/jobs").json()["jobs"]}
    assert {"user1", "user2"} <= everyone
    assert user1.wait_state(job_id, {"RUNNING"})["state"] == "RUNNING"  # untouched by user2
    r = user1.delete(f"/jobs/{job_id}")
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    job = user1.wait_state(job_id, {"CANCELLED"})
    assert job["reason"] == "cancelled by user1" and job["placement"] == []
    r = user1.delete(f"/jobs/{job_id}")
    assert r.status_code == 409 and "already CANCELLED" in error_of(r)


def _pages(client: Client, limit: int, after: str | None = None, **params) -> list[list[str]]:
    pages = []
    while True:
        r = client.get("/jobs", params={"limit": limit, "after": after, **params})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["jobs"]) <= limit
        pages.append([j["id"] for j in body["jobs"]])
        if body["next"] is None:
            return pages
        after = body["next"]


def test_listings_come_a_page_at_a_time_and_pages_neither_skip_nor_repeat(hub: Hub) -> None:
    user1, user2, admin = hub.clients["user1"], hub.clients["user2"], hub.clients["admin"]
    for client in (user1, user2, user1, user1, user2, user1):
        r = client.post("/jobs", json=job_body("/sample-project/training", name="paged"))
        assert r.status_code == 201, r.text
    whole = [j["id"] for j in user1.get("/jobs", params={"limit": 500}).json()["jobs"]]
    assert len(whole) >= 4 and user1.get("/jobs").json()["next"] is None  # under the default
    pages = _pages(user1, 3)
    assert [i for page in pages for i in page] == whole and all(pages)
    # a job submitted while a client pages through comes after the cursor: listed once
    first = user1.get("/jobs", params={"limit": 2}).json()
    r = user1.post("/jobs", json=job_body("/sample-project/training", name="paged"))
    rest = _pages(user1, 2, after=first["next"])
    listed = [j["id"] for j in first["jobs"]] + [i for page in rest for i in page]
    assert listed == [*whole, r.json()["id"]]
    # a cursor made on everyone's listing moves where user1's own starts, nothing more
    everyone = admin.get("/jobs", params={"limit": 1}).json()
    mine = user1.get("/jobs", params={"after": everyone["next"], "limit": 500}).json()["jobs"]
    assert {j["user"] for j in mine} == {"user1"}
    paged = user1.get("/jobs", params={"state": "PENDING,RUNNING,FINISHED", "limit": 1})
    assert paged.status_code == 200 and len(paged.json()["jobs"]) <= 1
    for params, words in [
        ({"limit": 0}, "limit must be a whole number from 1 to 500"),
        ({"limit": 501}, "limit must be a whole number from 1 to 500"),
        ({"limit": "all"}, "limit must be a whole number"),
        ({"after": "job-1"}, "is not a cursor this API gave"),
    ]:
        r = user1.get("/jobs", params=params)
        assert r.status_code == 400 and words in error_of(r), r.text
    for job in [*user1.get("/jobs").json()["jobs"], *user2.get("/jobs").json()["jobs"]]:
        if job["name"] == "paged":  # ended before the next test compares listings
            hub.clients[job["user"]].wait_state(job["id"], {"FINISHED"})


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"plan": "/no/such-plan"}, 404, "there is no plan"),
        ({"plan": "/sample-project/../project1"}, 404, "there is no plan"),
        ({"plan": None}, 400, "plan is required"),
        ({"workers": -1}, 400, "at least 1"),
        ({"workers": 0}, 400, "at least 1"),
        ({"workers": 10**12}, 400, "at most 256 workers"),
        ({"workers": 100000}, 400, "at most 256 workers"),
        ({"workers": "4:2"}, 400, "below min"),
        ({"workers": True}, 400, "whole number"),
        ({"resources": {"gpu": 0.5}}, 400, "whole devices"),
        ({"resources": {"memory": "1Ei"}}, 422, "the instance has"),
        ({"resources": {"cpu": "-1"}}, 400, "not a quantity"),
        ({"resources": {"cpu": "1m"}}, 400, "below the instance's minimum"),
        ({"priority": 10**9}, 400, "priority"),
        ({"colour": "red"}, 400, "unknown field 'colour'"),
        ({"env": {"RANK": "3"}}, 400, "set by the service"),
        ({"command": {"model_dir": "../user2", "model_main": "main.py"}}, 400, "outside your"),
        ({"command": {"model_dir": "/etc", "model_main": "passwd"}}, 400, "outside your"),
        (
            {
                "command": {
                    "model_dir": "models/hi",
                    "model_main": "../../../user2/models/hi/main.py",
                }
            },
            400,
            "outside your folder",
        ),
        ({"command": {"model_dir": "models/hi", "model_main": "nope.py"}}, 400, "not a file"),
        (
            {"command": {"model_dir": "models/hi", "model_main": "main.py", "args": [1]}},
            400,
            "args",
        ),
        ({"command": "python -c 'import os'"}, 400, "command is required"),
        ({"kind": "daemon"}, 400, "kind must be"),
        ({"kind": "notebook", "command": None, "preemptible": True}, 400, "not preemptible"),
        ({"kind": "notebook", "command": None, "workers": 2}, 400, "one worker"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, dict) else None,
)
def test_bad_submissions_get_4xx_and_change_nothing(hub, change, status, words) -> None:
    user1 = hub.clients["user1"]
    before = user1.get("/jobs").json()["jobs"]
    body = {**job_body("/sample-project/training"), **change}
    r = user1.post("/jobs", json=body)
    assert r.status_code == status, r.text
    assert words in error_of(r)
    assert user1.get("/jobs").json()["jobs"] == before


def test_symlink_out_of_the_folder_is_refused(hub: Hub) -> None:
    link = hub.storage / "user1" / "escape"
    if not link.exists():
        link.symlink_to(hub.storage / "user2" / "models")
    r = hub.clients["user1"].post(
        "/jobs",
        json={**job_body("/sample-project/training"), "command": {
            "model_dir": "escape/hi", "model_main": "main.py"}},
    )  # fmt: skip
    assert r.status_code == 400 and "outside your folder" in error_of(r)


def test_malformed_json_and_wrong_body_types(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", data="{not json")
    assert r.status_code == 400 and "not valid JSON" in error_of(r)
    r = user1.post("/jobs", data=json.dumps([1, 2]))
    assert r.status_code == 400 and "JSON object" in error_of(r)
    r = user1.get("/jobs", params={"state": "DONE"})
    assert r.status_code == 400 and "not one of" in error_of(r)
    r = user1.get("/jobs/x/logs", params={"tail": "-3"})
    assert r.status_code in (400, 404)


def test_browser_page_goes_through_hub_oauth(hub: Hub) -> None:
    import requests

    r = requests.get(f"{hub.url}/services/wmla/", allow_redirects=False, timeout=30)
    assert r.status_code == 302
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]
    assert "client_id=service-wmla" in r.headers["Location"]


def test_plan_admin_submits_a_notebook_for_a_user(hub: Hub) -> None:
    """The spawner's path: a one-worker, non-preemptible notebook job charged to the user."""
    padmin, user1, user2 = hub.clients["padmin"], hub.clients["user1"], hub.clients["user2"]
    body = {
        "plan": "/sample-project/notebooks",
        "kind": "notebook",
        "user": "user1",
        "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
    }
    r = user2.post("/jobs", json=body)
    assert r.status_code == 403 and "only plan admins" in error_of(r)
    r = padmin.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["user"], job["leaf"], job["preemptible"]) == (
        "user1",
        "/sample-project/notebooks/user1",
        False,
    )
    assert user1.wait_state(job["id"], {"RUNNING"})["command"] == []
    r = user1.delete(f"/jobs/{job['id']}")  # stopping the server releases it at once
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"


@pytest.mark.parametrize(("user", "plan_admin"), [("user1", False), ("padmin", True)])
def test_browser_login_reaches_the_service_through_oauth(hub: Hub, user, plan_admin) -> None:
    import requests

    password = hub.password_of(user)
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=30)
    r = session.post(
        f"{hub.url}/hub/login?next=/services/wmla/",
        data={"username": user, "password": password, "_xsrf": session.cookies["_xsrf"]},
        timeout=30,
    )
    assert r.status_code == 200 and r.url.endswith("/services/wmla/"), (r.url, r.text[:300])
    assert f'<span class="who">{user}</span>' in r.text and 'id="jobs"' in r.text
    assert ('id="nav-admin"' in r.text) is plan_admin  # a page, with the admin's link for admins
    me = session.get(f"{hub.api}/", timeout=30).json()  # the OAuth cookie works for the API
    assert me["name"] == user and me["plan_admin"] is plan_admin
    # a cookie-authenticated change needs the _xsrf value: no cross-site submissions
    body = job_body("/sample-project/training", seconds=0)
    r = session.post(f"{hub.api}/jobs", json=body, timeout=30)
    assert r.status_code == 403 and "X-XSRFToken" in error_of(r)
    xsrf = session.cookies.get("_xsrf", path="/services/wmla/")
    r = session.post(f"{hub.api}/jobs", json=body, headers={"X-XSRFToken": xsrf}, timeout=30)
    assert r.status_code == 201, r.text


def test_openapi_schemas_describe_what_the_api_takes_and_gives(hub: Hub) -> None:
    import jsonschema

    doc = hub.clients["user1"].get("/openapi.json").json()
    check = schema_checker(doc)

    user1 = hub.clients["user1"]
    body = job_body("/sample-project/training", workers="1:2", name="doc")
    check(body, "JobInput")
    r = user1.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    check(r.json(), "Job")
    check(user1.wait_state(r.json()["id"], {"FINISHED", "FAILED"}), "Job")
    check(user1.get("/plans/sample-project").json(), "Plan")
    check(hub.clients["admin"].get("/plans").json()["root"], "Plan")
    check(error_of_json(user1.post("/jobs", json={})), "Error")
    with pytest.raises(jsonschema.ValidationError):
        check({**body, "colour": "red"}, "JobInput")


def error_of_json(r) -> dict:
    assert r.status_code >= 400
    return r.json()


def test_a_notebook_servers_token_reaches_the_service(hub: Hub) -> None:
    """The embedded config's server_token_scopes: a kernel's token may call the API."""
    import psutil
    import requests

    token = hub.clients["user2"].headers
    r = requests.post(f"{hub.url}/hub/api/users/user2/server", headers=token, timeout=90)
    assert r.status_code in (201, 202), r.text
    try:
        hub._collect()
        (server,) = [
            p
            for p in psutil.Process(hub.proc.pid).children(recursive=True)
            if "jupyterhub-singleuser" in " ".join(p.cmdline())
        ]
        env = server.environ()
        assert env["WMLA_API_URL"] == hub.api
        kernel = {"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"}
        me = requests.get(hub.api + "/", headers=kernel, timeout=30)
        assert me.status_code == 200 and me.json()["name"] == "user2"
        assert me.json()["storage"] == env["HOME"]  # the server runs in the user's folder
    finally:
        requests.delete(f"{hub.url}/hub/api/users/user2/server", headers=token, timeout=60)


def test_restart_of_the_service_loses_nothing(hub: Hub) -> None:
    admin, user1 = hub.clients["admin"], hub.clients["user1"]
    r = user1.post("/jobs", json=job_body("/sample-project/training", seconds=300))
    assert r.status_code == 201
    running = r.json()["id"]
    user1.wait_state(running, {"RUNNING"})
    plans_before = [
        (p["path"], p["share"], p["limit"], p["members"])
        for p in admin.get("/plans").json()["plans"]
    ]
    jobs_before = {j["id"]: j["state"] for j in admin.get("/jobs").json()["jobs"]}
    history_before = user1.get(f"/jobs/{running}/history").json()["transitions"]
    old_pid = hub.service_pid()
    hub.restart()
    assert hub.service_pid() != old_pid
    plans_after = [
        (p["path"], p["share"], p["limit"], p["members"])
        for p in admin.get("/plans").json()["plans"]
    ]
    assert plans_after == plans_before
    jobs_after = {j["id"]: j["state"] for j in admin.get("/jobs").json()["jobs"]}
    assert jobs_after == jobs_before  # the running job was re-adopted, not lost
    assert user1.get(f"/jobs/{running}/history").json()["transitions"][: len(history_before)] == (
        history_before
    )
    r = user1.delete(f"/jobs/{running}")  # the re-adopted workers can still be stopped
    assert r.status_code == 200
    assert user1.wait_state(running, {"CANCELLED"})["state"] == "CANCELLED"
