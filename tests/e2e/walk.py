"""The steps of a brand-new user's first visit, in a real browser, shared by the e2e tests.

Each step drives Debian's headless Chromium (Playwright) against a running hub and checks what
the user sees: the spawn page and JupyterLab with the getting-started notebook
(``log_in_and_spawn``), the notebook run to a FINISHED 2-worker job whose live chart draws every
series with no two y-axes on one side (``train_and_check_chart``), and a JupyterLab terminal
that runs ``wmla exec-get`` as the account the server runs as (``terminal_runs_wmla``). The
tests differ only in how the hub runs (as root with one account per user, or as an
unprivileged account that runs every server), so the account is a parameter.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


@dataclass
class Visit:
    """Who visits which hub: the browser's page and what the checks compare against."""

    page: Any  # playwright.sync_api.Page
    url: str  # the hub's public URL
    password: str  # the user's password (its first login sets it)
    user: str  # the hub user, new to the hub
    folder: Path  # <storage_root>/<user>
    account: str  # the system account the user's server runs as
    artifacts: Path  # screenshots go here

    @property
    def uid(self) -> int:
        """The account's uid (as root, the first spawn creates the account)."""
        return pwd.getpwnam(self.account).pw_uid

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.artifacts / f"{name}.png"), full_page=True)


@contextmanager
def browser_page() -> Iterator[Any]:
    """A page of a fresh headless Chromium, closed (with the browser) on the way out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def log_in_and_spawn(visit: Visit) -> None:
    """Log in with the user's password, start the default profile from the spawn page, and
    find JupyterLab with the getting-started notebook the first spawn put in the folder."""
    page, user = visit.page, visit.user
    page.goto(f"{visit.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", visit.password)
    page.click("input[type=submit], button[type=submit]")
    # the spawn page: a notebook size and the plans this user may use
    page.wait_for_selector("input[name=profile][value=cpu]:checked", timeout=60_000)
    plans = page.eval_on_selector_all("input[name=plan]", "els => els.map(e => e.value)")
    assert "/sample-project/notebooks" in plans and "/sample-project/training" in plans, plans
    assert page.is_checked("input[name=plan][value='/sample-project/notebooks']")
    visit.shot("0-spawn-page")
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=150_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    page.locator(".jp-DirListing-item", has_text="getting-started.ipynb").wait_for(timeout=60_000)
    visit.shot("1-jupyterlab")
    assert (visit.folder / "getting-started.ipynb").is_file()
    assert (visit.folder / "models" / "pytorch_mnist" / "main.py").is_file()
    assert os.stat(visit.folder).st_uid == visit.uid  # the folder is the server's account's
    assert os.stat(visit.folder / "getting-started.ipynb").st_uid == visit.uid


CHART_STATE = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => ({
    traces: (gd.data || []).map(t => ({
        name: t.name, points: (t.y || []).length, y: Array.from(t.y || []), yaxis: t.yaxis,
    })),
    drawn: [...gd.querySelectorAll('.scatterlayer .trace')].map(t => {
        const line = t.querySelector('path.js-line');
        return line ? (line.getAttribute('d') || '').length : 0;
    }),
    yaxes: Object.keys(gd._fullLayout || {}).filter(k => /^yaxis\\d*$/.test(k)).map(k => ({
        name: k, side: gd._fullLayout[k].side,
        overlaying: gd._fullLayout[k].overlaying || null,
        domain: gd._fullLayout[k].domain,
        range: gd._fullLayout[k].range,
    })),
}))"""


# The page's main thread stalls for a while each time a script of over 1 MB (plotly's widget
# module, 5 MB, which anywidget imports from a blob) is handed to the browser: what a browser
# on a busy machine or a slow laptop does with such a module.
SLOW_BIG_MODULES = """(() => {
    const create = URL.createObjectURL.bind(URL);
    URL.createObjectURL = (obj) => {
        if (obj instanceof Blob && obj.size > 1e6 && /javascript/.test(obj.type)) {
            const until = performance.now() + %d;
            while (performance.now() < until) {}
        }
        return create(obj);
    };
})()"""


def train_and_check_chart(visit: Visit, module_stall: float = 0.0) -> dict:
    """Run All on the getting-started notebook; after FINISHED, the job monitor's chart has a
    drawn line for every named trace and no two y-axes on one side. Returns the chart's state
    (traces, drawn path lengths, y-axes). ``module_stall``: seconds the page stalls while each
    big script module loads (``SLOW_BIG_MODULES``)."""
    page = visit.page
    if module_stall:
        page.add_init_script(SLOW_BIG_MODULES % round(1000 * module_stall))
    console: list[str] = []  # what the page logged, in the failure's message and the artifacts
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"[:500]))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"[:500]))
    page.goto(f"{visit.url}/user/{visit.user}/lab/tree/getting-started.ipynb")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    select = page.get_by_role("button", name="Select", exact=True)
    try:  # JupyterLab may ask which kernel to start for a notebook it has not run yet
        select.click(timeout=10_000)
    except Exception:
        pass
    # the kernel is up: its status (a hidden label of the toolbar's indicator) says Idle
    page.get_by_text("Kernel status: Idle").first.wait_for(state="attached", timeout=90_000)
    page.click("text=Run >> nth=0")  # the menu bar's Run menu
    page.click("text=Run All Cells")
    deadline = time.monotonic() + 300
    text = ""
    while time.monotonic() < deadline:
        text = "\n".join(page.locator(".jp-OutputArea").all_inner_texts())
        if "FINISHED" in text or "FAILED" in text:
            break
        time.sleep(2)
    visit.shot("2-trained")
    assert "FINISHED" in text, text[-3000:]
    time.sleep(3)  # the monitor's last refresh of the chart
    charts = page.evaluate(CHART_STATE)
    training = [c for c in charts if any("loss" in (t["name"] or "") for t in c["traces"])]
    visit.shot("3-chart")
    (visit.artifacts / "console.txt").write_text("\n".join(console))
    assert training, (charts, console[-40:])
    chart = training[0]
    names = [t["name"] for t in chart["traces"] if t["name"]]
    assert {"loss", "accuracy"} <= set(names) or len(names) >= 2, chart
    for trace, drawn in zip(chart["traces"], chart["drawn"]):
        assert trace["points"] >= 2 and drawn > 0, chart  # every named series has a line
    sides: dict = {}
    for axis in chart["yaxes"]:
        key = (axis["side"], tuple(axis["domain"]))
        assert key not in sides, chart  # two y-axes on one side of one panel
        sides[key] = axis["name"]
    check_accuracy_axis(chart)
    return chart


def check_accuracy_axis(chart: dict) -> None:
    """The accuracy axis (right) fits the accuracy values as drawn, whether a fraction or a
    percentage; the loss axis is the left one."""
    axes = {a["name"]: a for a in chart["yaxes"]}
    accuracy = [v for t in chart["traces"] if "acc" in (t["name"] or "") for v in t["y"]]
    assert accuracy and "yaxis2" in axes, chart
    right, left = axes["yaxis2"], axes["yaxis"]
    assert (right["side"], left["side"]) == ("right", "left"), chart
    lo, hi = min(accuracy), max(accuracy)
    scale = 1.0 if hi <= 1 else 100.0
    bottom, top = right["range"]
    assert bottom <= lo and hi <= top, chart  # every point on the chart
    slack = (hi - lo) / 2 + 0.05 * scale  # fitted: not the whole 0..1 (or 0..100) scale
    assert bottom >= lo - slack and top <= hi + slack, chart


def terminal_runs_wmla(visit: Visit) -> str:
    """File > New > Terminal; the shell is the server's account and ``wmla exec-get`` lists
    the training job without a logon. Returns what the terminal printed."""
    page = visit.page
    page.goto(f"{visit.url}/user/{visit.user}/lab")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="File").first.click()  # File > New > Terminal
    page.locator(".lm-Menu-itemLabel", has_text="New").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text="Terminal").first.click()
    terminal = page.locator(".jp-Terminal").first
    terminal.wait_for(timeout=60_000)
    terminal.click()
    # what the terminal draws is a canvas: the shell also keeps what it printed in a file
    page.keyboard.type("(id -un; wmla exec-get) 2>&1 | tee seen-in-terminal.txt\n", delay=20)
    seen = visit.folder / "seen-in-terminal.txt"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "pytorch_mnist-main" not in _read(seen):
        time.sleep(1)
    visit.shot("4-terminal")
    text = _read(seen)
    assert visit.account in text.split(), text  # the shell runs as the server's account
    assert "pytorch_mnist-main" in text and "FINISHED" in text, text  # the training job
    assert seen.stat().st_uid == visit.uid
    return text


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
