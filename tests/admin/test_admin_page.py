"""The plan admin page through a real JupyterHub, real proxy and the real wmla service.

One hub for the module (``tests/service/hub.py``). Handler tests drive the hub's real login and
OAuth with ``requests``; browser tests drive Debian's headless Chromium with Playwright (skipped,
with the reason, where /usr/bin/chromium is missing) and save a screenshot of every page they
visit under ``test-artifacts/admin/`` (printed at the end of the module).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import requests

from tests.service.hub import PROXY, REPO, Client, Hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
ARTIFACTS = REPO / "test-artifacts" / "admin"
needs_browser = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no /usr/bin/chromium (apt-get install chromium; CI installs it): browser tests skip",
)

SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    tmp = tmp_path_factory.mktemp("admin-hub")
    hub = Hub(tmp, {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 2})
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        hub.start()
        hub.clients = {n: Client(hub, hub.user_token(n)) for n in ("padmin", "user1")}
        folder = hub.storage / "padmin" / "models" / "sleep"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SLEEPER)
        yield hub
    finally:
        hub.stop()
        shots = sorted(p.name for p in ARTIFACTS.glob("*.png"))
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():  # shown even when output is captured
                reporter.write_line(f"\nadmin page screenshots ({len(shots)}) in {ARTIFACTS}")


def password(hub: Hub, user: str) -> str:
    return hub.password_of(user)


def login(hub: Hub, user: str) -> requests.Session:
    """A browser-like session: the hub's login form, then the service's OAuth dance."""
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    r = s.post(  # next: no server is spawned on login (the default goes to /hub/spawn)
        f"{hub.url}/hub/login?next=%2Fhub%2Fhome",
        data={"username": user, "password": password(hub, user), "_xsrf": xsrf},
        timeout=30,
    )
    assert r.status_code == 200, r.text[:500]
    r = s.get(f"{hub.url}/services/wmla/admin", timeout=30)
    s.admin_status = r.status_code
    s.page = r.text
    return s


def xsrf_of(page: str) -> str:
    match = re.search(r'name="_xsrf" value="([^"]+)"', page)
    assert match, page[:500]
    return match.group(1)


def api_error(client: Client, method: str, path: str, body: dict) -> str:
    r = client(method, path, json=body)
    assert 400 <= r.status_code < 500, r.text
    return r.json()["error"]


def sleeper_job(plan: str, seconds: float) -> dict:
    return {
        "plan": plan,
        "workers": 1,
        "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/sleep", "model_main": "main.py", "args": [str(seconds)]},
    }


def plan_paths(hub: Hub) -> set[str]:
    r = hub.clients["padmin"].get("/plans")
    assert r.status_code == 200, r.text
    return {p["path"] for p in r.json()["plans"]}


# -- handlers, without a browser ------------------------------------------------------------------
def test_anonymous_visitor_is_sent_to_the_hub_login(hub: Hub) -> None:
    r = requests.get(f"{hub.url}/services/wmla/admin", allow_redirects=False, timeout=30)
    assert r.status_code == 302
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]


def test_hub_admins_and_scope_holders_get_the_page(hub: Hub) -> None:
    for user in ("admin", "padmin"):  # hub admin; custom:wmla:admin through a role
        s = login(hub, user)
        assert s.admin_status == 200, (user, s.page[:300])
        assert f'<span class="who">{user}</span>' in s.page


def test_non_admin_gets_403_with_the_reason(hub: Hub) -> None:
    s = login(hub, "user1")
    assert s.admin_status == 403
    assert "only plan admins may use this page; user1 needs the custom:wmla:admin" in s.page
    for page in ("admin/instance", "admin/usage"):
        r = s.get(f"{hub.url}/services/wmla/{page}", timeout=30)
        assert r.status_code == 403, page
    token = {"Authorization": f"token {hub.user_token('user1')}"}
    r = requests.get(f"{hub.url}/services/wmla/admin", headers=token, timeout=30)
    assert r.status_code == 403


def test_forms_without_the_xsrf_value_write_nothing(hub: Hub) -> None:
    s = login(hub, "padmin")
    assert s.admin_status == 200
    form = {"action": "create", "parent": "/", "name": "noxsrf", "share": "1"}
    r = s.post(f"{hub.url}/services/wmla/admin/plans", data=form, timeout=30)
    assert r.status_code == 403
    r = s.post(
        f"{hub.url}/services/wmla/admin/plans",
        data={**form, "_xsrf": "forged"},
        timeout=30,
        allow_redirects=False,
    )
    assert r.status_code == 403
    assert "/noxsrf" not in plan_paths(hub)


def test_refused_forms_show_the_apis_message_and_write_nothing(hub: Hub) -> None:
    s = login(hub, "padmin")
    xsrf = xsrf_of(s.page)
    cases = [
        ({"name": "bad name", "share": "1"}, {"path": "/bad name", "share": 1}),
        ({"name": "ok", "share": "0"}, {"path": "/ok", "share": 0}),
        ({"name": "ok", "share": "1", "gpu": "1.5"}, {"path": "/ok", "limit": {"gpu": "1.5"}}),
        ({"name": "ok", "share": "1", "cpu": "lots"}, {"path": "/ok", "limit": {"cpu": "lots"}}),
    ]
    for fields, body in cases:
        data = {"_xsrf": xsrf, "action": "create", "parent": "/", **fields}
        r = s.post(f"{hub.url}/services/wmla/admin/plans", data=data, timeout=30)
        message = api_error(hub.clients["padmin"], "POST", "/plans", body)
        assert r.status_code == 400, (fields, r.text[:300])
        shown = re.search(r'id="error-create" role="alert">([^<]*)<', r.text)
        assert shown, r.text[:300]
        assert _unescape(shown.group(1)) == message, fields
        assert 'value="ok"' in r.text or 'value="bad name"' in r.text  # the form keeps its values
    assert not plan_paths(hub) & {"/ok", "/bad name"}


def test_creating_a_plan_that_exists_says_what_to_do_on_the_page(hub: Hub) -> None:
    """Issue 38, item 7: the form spoke the API's words ("PATCH it to change it")."""
    s = login(hub, "padmin")
    data = {"_xsrf": xsrf_of(s.page), "action": "create", "parent": "/", "name": "sample-project"}
    r = s.post(f"{hub.url}/services/wmla/admin/plans", data={**data, "share": "1"}, timeout=30)
    assert r.status_code == 409, r.text[:300]
    shown = re.search(r'id="error-create" role="alert">([^<]*)<', r.text)
    assert shown, r.text[:300]
    assert _unescape(shown.group(1)) == (
        "plan /sample-project already exists; change it with its edit link in the table above"
    )
    assert "PATCH" not in r.text


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_plotly_is_served_from_the_installed_package(hub: Hub) -> None:
    import plotly

    s = login(hub, "padmin")
    r = s.get(f"{hub.url}/services/wmla/admin/usage?plan=/", timeout=30)
    assert r.status_code == 200
    scripts = re.findall(r'<script src="([^"]+)"', r.text)
    assert scripts == ["/services/wmla/admin/static/plotly/plotly.min.js",
                       "/services/wmla/admin/static/charts.js",
                       "/services/wmla/admin/static/admin.js"]  # fmt: skip
    assert "cdn" not in r.text.lower() and "<script>" not in r.text  # no inline script
    js = s.get(f"{hub.url}{scripts[0]}", timeout=60)
    installed = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert js.status_code == 200 and js.content == installed.read_bytes()
    r = s.get(f"{hub.url}/services/wmla/admin/usage?plan=/nope", timeout=30)
    assert r.status_code == 404 and "there is no plan" in r.text


def test_deleting_a_plan_with_jobs_is_refused_with_the_list_unless_drained(hub: Hub) -> None:
    padmin = hub.clients["padmin"]
    assert padmin.post("/plans", json={"path": "/busy", "limit": {"gpu": 2}}).status_code == 201
    r = padmin.post("/jobs", json=sleeper_job("/busy", 120))
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    padmin.wait_state(job, {"RUNNING"})
    s = login(hub, "padmin")
    xsrf = xsrf_of(s.page)
    url = f"{hub.url}/services/wmla/admin/plans"
    r = s.post(url, data={"_xsrf": xsrf, "action": "delete", "path": "/busy"}, timeout=30)
    assert r.status_code == 409
    assert f"cannot delete /busy: 1 pending or running job(s) are charged to it ({job})" in r.text
    assert f'data-job="{job}"' in r.text and 'id="drain"' in r.text
    assert "/busy" in plan_paths(hub)
    r = s.post(url, data={"_xsrf": xsrf, "action": "drain", "path": "/busy"}, timeout=30)
    assert r.status_code == 200
    assert "draining /busy: 1 job(s) stopping" in r.text or "drained and deleted /busy" in r.text
    padmin.wait_state(job, {"CANCELLED"})
    deadline = time.monotonic() + 30
    while "/busy" in plan_paths(hub) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "/busy" not in plan_paths(hub)


def test_move_and_membership_forms_change_the_plans_as_the_api_sees_them(hub: Hub) -> None:
    padmin = hub.clients["padmin"]
    for body in ({"path": "/mv", "share": 3, "limit": {"gpu": 2}}, {"path": "/mv/team"}):
        assert padmin.post("/plans", json=body).status_code == 201
    s = login(hub, "padmin")
    url = f"{hub.url}/services/wmla/admin/plans"
    form = {"_xsrf": xsrf_of(s.page), "path": "/mv/team", "share": "2", "gpu": "1",
            "users": "user1, user2", "groups": "dev"}  # fmt: skip
    r = s.post(url, data={**form, "action": "update"}, timeout=30)
    assert r.status_code == 200 and "saved /mv/team" in r.text
    team = padmin.get("/plans/mv/team").json()
    assert team["members"] == {"users": ["user1", "user2"], "groups": ["dev"]}
    assert team["limit"] == {"gpu": 1} and team["share"] == 2
    move = {"_xsrf": form["_xsrf"], "action": "move", "path": "/mv", "parent": "/sample-project"}
    r = s.post(url, data={**move, "preview": "1"}, timeout=30)
    assert r.status_code == 200 and 'data-path="/sample-project/mv/team"' in r.text
    assert "/mv" in plan_paths(hub)  # a preview writes nothing
    r = s.post(url, data=move, timeout=30)
    assert r.status_code == 200 and "moved /mv to /sample-project/mv" in r.text
    moved = padmin.get("/plans/sample-project/mv/team").json()
    assert moved["members"]["users"] == ["user1", "user2"] and moved["limit"] == {"gpu": 1}
    assert not {"/mv", "/mv/team"} & plan_paths(hub)
    under_itself = {**move, "path": "/sample-project/mv", "parent": "/sample-project/mv/team"}
    r = s.post(url, data=under_itself, timeout=30)
    assert r.status_code == 400 and "under itself" in r.text


# -- the browser ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium; CI installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def browser_login(browser, hub: Hub, user: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    # script errors, failed script loads and Content-Security-Policy violations (a CDN or an
    # inline script) land here; a refused form's own 4xx answer (admin/plans) is expected
    page.problems = []
    page.on("pageerror", lambda err: page.problems.append(str(err)))

    def console(msg) -> None:
        where = (msg.location or {}).get("url", "")
        if msg.type == "error" and "/hub/" not in where and not where.endswith("/admin/plans"):
            page.problems.append(f"{msg.text} ({where})")

    page.on("console", console)
    page.goto(f"{hub.url}/hub/login?next=%2Fhub%2Fhome")  # no server spawned on login
    page.fill("#username_input", user)
    page.fill("#password_input", password(hub, user))
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/home"))
    return context, page


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def submit(page, form: str, button: str) -> None:
    with page.expect_navigation():
        page.click(f"{form} {button}")


def create(page, parent: str, name: str, share: str, gpu: str = "") -> None:
    f = "#form-create"
    page.select_option(f"{f} select[name=parent]", parent)
    page.fill(f"{f} input[name=name]", name)
    page.fill(f"{f} input[name=share]", share)
    page.fill(f"{f} input[name=gpu]", gpu)
    submit(page, f, "#create-button")
    assert page.locator("#done").inner_text().startswith("created "), page.content()[:800]


@needs_browser
def test_admin_builds_project1_and_edits_it_in_the_browser(browser, hub: Hub) -> None:
    context, page = browser_login(browser, hub, "padmin")
    try:
        link = page.locator("#wmla-admin-link")
        assert link.is_visible()  # the hub's nav bar links plan admins to the page
        shot(page, "01-hub-home-plan-admin")
        with page.expect_navigation():
            link.click()
        assert page.url.endswith("/services/wmla/admin")
        create(page, "/", "project1", "1", gpu="8")
        for name, share, gpu in (("dev", "4", "4"), ("qa", "2", "2"), ("support", "2", "2")):
            create(page, "/project1", name, share, gpu)
        # the bars: 4:2:2 is 50/25/25 of /project1, and drawn so
        segs = page.locator('.stack[data-parent="/project1"] .seg')
        assert segs.count() == 3
        pcts = [float(segs.nth(i).get_attribute("data-pct")) for i in range(3)]
        assert pcts == [50.0, 25.0, 25.0]
        widths = [segs.nth(i).bounding_box()["width"] for i in range(3)]
        assert widths[0] == pytest.approx(2 * widths[1], rel=0.05)
        assert widths[1] == pytest.approx(widths[2], rel=0.05)
        row = page.locator('tr.plan[data-path="/project1/dev"]')
        assert row.locator(".limit-gpu").inner_text() == "4"
        assert row.locator(".share").inner_text() == "4"
        # the churn figures beside each plan's (nothing preempted on this hub: zeros)
        assert page.locator("#plans thead th", has_text="churn").is_visible()
        assert row.locator(".churn-preemptions").inner_text().strip() == "0"
        assert (
            row.locator(".churn-lost").is_visible()
            and row.locator(".churn-lost").inner_text() == "0.0"
        )
        assert page.locator("#churn-total .churn-lost").inner_text() == "0.0"
        shot(page, "02-plans-project1-4-2-2")

        # edit a limit: dev to 3 GPUs
        with page.expect_navigation():
            row.locator("a.edit").click()
        page.fill("#form-update input[name=gpu]", "3")
        submit(page, "#form-update", "#save")
        assert page.locator("#done").inner_text() == "saved /project1/dev"
        assert page.locator('tr.plan[data-path="/project1/dev"] .limit-gpu').inner_text() == "3"
        shot(page, "03-plans-dev-limit-edited")

        # a bad value is refused with the API's message, next to the form, nothing saved
        page.fill("#form-update input[name=gpu]", "16")
        submit(page, "#form-update", "#save")
        expected = api_error(
            hub.clients["padmin"], "PATCH", "/plans/project1/dev", {"limit": {"gpu": 16}}
        )
        assert "gpu limit 16 gpu is above the limit 8 gpu of its parent /project1" in expected
        assert page.locator("#error-update").inner_text() == expected
        assert page.locator("#form-update input[name=gpu]").input_value() == "16"
        assert page.locator('tr.plan[data-path="/project1/dev"] .limit-gpu').inner_text() == "3"
        shot(page, "04-plans-bad-limit-refused")

        # preview: qa's share 2 -> 4 gives 4:4:2, nothing saved until Save
        page.goto(f"{hub.url}/services/wmla/admin?edit=/project1/qa")
        page.fill("#form-update input[name=share]", "4")
        submit(page, "#form-update", "button[name=preview]")
        qa = page.locator('#preview-table tr[data-path="/project1/qa"]')
        assert qa.get_attribute("data-pct-after") == "40.0"
        assert "changed" in qa.get_attribute("class")
        assert page.locator('tr.plan[data-path="/project1/qa"] .share').inner_text() == "2"
        shot(page, "05-plans-preview")

        # delete an empty plan
        create(page, "/project1", "scratch", "1")
        page.goto(f"{hub.url}/services/wmla/admin?edit=/project1/scratch")
        submit(page, "#form-delete", "#delete")
        assert page.locator("#done").inner_text() == "deleted /project1/scratch"
        assert page.locator('tr.plan[data-path="/project1/scratch"]').count() == 0
        assert {"/project1/dev", "/project1/qa", "/project1/support"} <= plan_paths(hub)
        assert "/project1/scratch" not in plan_paths(hub)

        # usage charts (plotly from the package) and the instance view, with a job running
        job = hub.clients["padmin"].post("/jobs", json=sleeper_job("/project1/dev", 60)).json()
        hub.clients["padmin"].wait_state(job["id"], {"RUNNING"})
        page.goto(f"{hub.url}/services/wmla/admin/usage?plan=/project1")
        page.wait_for_selector('#usage[data-ready="1"]')
        assert page.locator("#chart-gpu .main-svg").count() > 0
        assert page.locator("#chart-cpu .main-svg").count() > 0
        assert page.locator('#usage-children tr[data-path="/project1/dev"]').count() == 1
        shot(page, "06-usage-project1")
        page.goto(f"{hub.url}/services/wmla/admin/instance")
        node = page.locator("tr.node").first
        assert node.get_attribute("data-gpu-total") == "4"
        assert node.get_attribute("data-gpu-free") == "3"  # the job holds one device
        assert page.locator("#lr-default_request td").first.inner_text() == "1"
        shot(page, "07-instance")
        assert hub.clients["padmin"].delete(f"/jobs/{job['id']}").status_code == 200
        assert page.problems == []
    finally:
        context.close()


@needs_browser
def test_non_admin_sees_no_link_and_gets_403_in_the_browser(browser, hub: Hub) -> None:
    context, page = browser_login(browser, hub, "user1")
    try:
        assert page.locator("#wmla-admin-link").count() == 0
        shot(page, "08-hub-home-user")
        response = page.goto(f"{hub.url}/services/wmla/admin")
        assert response.status == 403
        assert "only plan admins may use this page" in page.locator("#error-message").inner_text()
        shot(page, "09-admin-403-user")
    finally:
        context.close()


def placed_in_line(client: Client, job_ids: list[str], timeout: float = 60) -> list[dict]:
    """The jobs' queue objects once the service's forward run placed and estimated them all
    (it runs off the loop, seconds after the cycle that left them pending)."""
    deadline = time.monotonic() + timeout
    queues: list[dict] = []
    while time.monotonic() < deadline:
        queues = [client.get(f"/jobs/{j}").json().get("queue") or {} for j in job_ids]
        if all(q.get("position") and q.get("estimate") for q in queues):
            return queues
        time.sleep(0.5)
    raise AssertionError(f"never placed in line: {queues}\n{client.hub.log()}")


@needs_browser
def test_the_plans_page_shows_each_plans_waiting_line(browser, hub: Hub) -> None:
    """A plan of one GPU held by a job with a 2-minute runtime limit, two more waiting: the
    page lists them under the plan in the service's order, the first starting when the
    holder's limit is up."""
    padmin = hub.clients["padmin"]
    r = padmin.post("/plans", json={"path": "/waitline", "limit": {"gpu": 1}})
    assert r.status_code == 201, r.text
    started: list[str] = []
    context = None
    try:
        holder = padmin.post("/jobs", json={**sleeper_job("/waitline", 120), "max_runtime": 120})
        assert holder.status_code == 201, holder.text
        started.append(holder.json()["id"])
        padmin.wait_state(started[0], {"RUNNING"})
        for _ in range(2):
            r = padmin.post("/jobs", json={**sleeper_job("/waitline", 1), "max_runtime": 600})
            assert r.status_code == 201, r.text
            started.append(r.json()["id"])
        waiting = started[1:]
        assert [q["position"]["plan"] for q in placed_in_line(padmin, waiting)] == [1, 2]

        context, page = browser_login(browser, hub, "padmin")
        page.goto(f"{hub.url}/services/wmla/admin")
        rows = page.locator('table.queue[data-plan="/waitline"] tr.queued-job')
        assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == waiting
        first, second = rows.nth(0), rows.nth(1)
        assert first.locator(".position").inner_text() == "1"
        assert second.locator(".position").inner_text() == "2"
        assert re.fullmatch(r"starts in about [12] minutes?", first.locator(".when").inner_text())
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", first.locator(".start").inner_text())
        assert "runtime limits" in first.locator(".estimate").get_attribute("title")
        assert second.locator(".when").inner_text().startswith("starts in about ")
        assert "/waitline at its gpu limit: 1 of 1 in use" in first.locator(".reason").inner_text()
        shot(page, "10-plans-waiting-line")
        assert page.problems == []
    finally:
        if context is not None:
            context.close()
        for job_id in started:
            padmin.delete(f"/jobs/{job_id}")
