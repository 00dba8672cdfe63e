"""The admin page's fair-share view through a real JupyterHub, proxy and service, in Chromium.

A hub of its own with ``c.WmlaService.fair_share_half_life = "10m"`` (the other admin tests run
without history). Under /fs (two children of share 1) a 2-GPU gang runs in /fs/a beside a 1-GPU
job in /fs/b; ``admin/shares?plan=/fs`` lists both with the API's factors (a below b below 1)
and draws, with plotly from the installed package, each one's factor and decayed usage over the
samples. Screenshots go to ``test-artifacts/admin-shares/``. Without Chromium the browser test
skips with the reason; the handler test runs anyway.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.admin import test_admin_page as page_helpers
from tests.service.hub import PROXY, REPO, Client, Hub
from tests.service.shares_hub import shares_hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)
ARTIFACTS = REPO / "test-artifacts" / "admin-shares"
browser = page_helpers.browser  # the module's Chromium (skips without /usr/bin/chromium)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):

    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with shares_hub(tmp_path_factory.mktemp("admin-shares-hub"), ("padmin",), "sleep") as hub:
        hub.clients = {n: Client(hub, hub.user_token(n)) for n in ("padmin", "user1")}
        yield hub


@pytest.fixture(scope="module")
def ran(hub: Hub) -> dict:
    """/fs/a's 2-GPU gang and /fs/b's 1-GPU job, side by side, finished; then /shares."""
    padmin = hub.clients["padmin"]
    for path in ("/fs", "/fs/a", "/fs/b"):
        assert padmin.post("/plans", json={"path": path}).status_code == 201
    jobs = []
    for plan, workers in (("/fs/a", 2), ("/fs/b", 1)):
        body = {**page_helpers.sleeper_job(plan, 5), "workers": workers}
        r = padmin.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        jobs.append(r.json()["id"])
    for job in jobs:
        assert padmin.wait_state(job, {"FINISHED", "FAILED"})["state"] == "FINISHED"
    return {r["plan"]: r for r in padmin.get("/shares", params={"plan": "/fs"}).json()["plans"]}


def test_the_page_is_for_plan_admins_and_lists_the_apis_rows(hub: Hub, ran: dict) -> None:
    s = page_helpers.login(hub, "user1")
    r = s.get(f"{hub.url}/services/wmla/admin/shares", timeout=30)
    assert r.status_code == 403 and "only plan admins may use this page" in r.text
    s = page_helpers.login(hub, "padmin")
    r = s.get(f"{hub.url}/services/wmla/admin/shares?plan=/fs", timeout=30)
    assert r.status_code == 200
    api = hub.clients["padmin"].get("/shares", params={"plan": "/fs"}).json()["plans"]
    for row in api:
        if row["parent"] != "/fs":
            continue
        shown = re.search(rf'data-path="{row["plan"]}" data-factor="([^"]+)"', r.text)
        assert shown, row  # the API's own figure (decayed a moment later: the same ratio)
        assert float(shown.group(1)) == pytest.approx(row["fair_share_factor"], rel=1e-6)
    assert 'data-path="/fs/a/padmin"' not in r.text  # only the children of the plan shown
    assert "usage decays by half every 10m" in r.text
    r = s.get(f"{hub.url}/services/wmla/admin/shares?plan=/nope", timeout=30)
    assert r.status_code == 404 and "there is no plan" in r.text


@pytest.mark.skipif(not page_helpers.CHROMIUM.exists(), reason="no /usr/bin/chromium")
def test_the_factor_and_usage_charts_in_the_browser(browser, hub: Hub, ran: dict) -> None:
    context, page = page_helpers.browser_login(browser, hub, "padmin")
    try:
        page.goto(f"{hub.url}/services/wmla/admin")
        with page.expect_navigation():
            page.click("#nav-shares")
        page.select_option("#shares-plan", "/fs")
        with page.expect_navigation():
            page.click("form.inline button[type=submit]")
        page.wait_for_selector('#share-charts[data-ready="1"]')
        factors = {}
        for path in ("/fs/a", "/fs/b"):
            row = page.locator(f'tr.share[data-path="{path}"]')
            factors[path] = float(row.locator(".factor").inner_text())
            assert factors[path] == pytest.approx(ran[path]["fair_share_factor"], abs=1e-3)
            assert float(row.locator(".raw-usage").inner_text()) > 0
        assert factors["/fs/a"] < factors["/fs/b"] < 1.0
        for chart in ("#chart-factor", "#chart-share-usage"):
            assert page.locator(f"{chart} .main-svg").count() > 0
            # one line per child, each with a point per sample (and now)
            assert page.locator(f"{chart} .scatterlayer .trace").count() == 2
            legend = page.locator(f"{chart} .legendtext").all_text_contents()
            assert sorted(legend) == ["/fs/a", "/fs/b"]
        assert "samples, one every 1.67 s" in page.locator("#shares-status").inner_text()
        page.screenshot(path=str(ARTIFACTS / "01-fair-share-fs.png"), full_page=True)
        assert page.problems == []
    finally:
        context.close()
