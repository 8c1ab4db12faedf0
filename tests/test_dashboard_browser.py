"""The dashboard in a real browser: Playwright drives Debian's chromium against a real local
cluster (a master and three data nodes as subprocesses). It checks the page's numbers
against the REST API, kills a data node and watches the page show it dead and the
under-replicated count rise, then fall back to 0 once the master re-replicated every blob,
and saves screenshots (to a temporary folder; `SQUALL_SCREENSHOTS=docs/img` refreshes the
ones docs/operations.md shows).

Set-up: the `playwright` package (dev extra) and a chromium binary. Where chromium is
missing the set-up installs Debian's (`apt-get install chromium`, as root); where that
cannot be done the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.client import Client
from squall.client.cli.dev import DevCluster
from tests.helpers import ADMIN, ADMIN_TOKEN, cluster_fixture, wait_for

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TASKS = 60
SPOOF_WORKER = "evil\u202egnp.exe\x1b[2J"
SPOOF_ERROR = "ValueError: \u202etxt.exe\x07 bad\nTraceback (most recent call last):\n  boom"


def chromium() -> str:
    """Path of a chromium binary, installing Debian's package if needed; else skip."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    if os.environ.get("SQUALL_NO_APT") or shutil.which("apt-get") is None or os.geteuid():
        pytest.skip("no chromium binary, and apt-get cannot install it here (not root, no "
                    "apt-get, or SQUALL_NO_APT set): apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300,
                       check=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env,
                       capture_output=True, timeout=600, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"could not install chromium with apt-get: {e}")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("apt-get install chromium left no chromium binary on PATH")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the playwright package is not installed")
    path = chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


# one copy at a time per node: re-replication takes a few seconds, long enough to see.
# A node is dead after 10 missed beats (5 s), not 3: on a busy machine a live node's beat
# can be late by more than a second, and a live node taken for dead (or suspect) changes
# the counts the page is checked on. Every wait on the page has a generous deadline.
cluster = cluster_fixture("dash", heartbeat_interval_s=0.5,
                          extra_env={"SQUALL_MAX_COPIES_PER_NODE": "1",
                                     "SQUALL_DEAD_AFTER_BEATS": "10"})
WAIT = 60.0  # seconds, for anything the page shows after a refresh


def card(page: Any, key: str) -> str:
    return str(page.locator(f'#health .card[data-k="{key}"] .v').inner_text())


def until_page(page: Any, expr: str, timeout: float, what: str) -> None:
    """Wait until `expr` is true in the page. Polled from here (page.evaluate goes through
    the DevTools protocol): Playwright's wait_for_function polls with eval inside the page,
    which the dashboard's Content-Security-Policy forbids, as it should."""
    wait_for(lambda: bool(page.evaluate(expr)), timeout, interval=0.05, what=what)


def num(text: str) -> int:
    return int(text.replace(",", ""))


def test_dashboard_against_a_real_cluster(browser: Any, cluster: DevCluster,
                                          tmp_path: Path) -> None:
    url = cluster.master_url
    img = ROOT / os.environ["SQUALL_SCREENSHOTS"] if os.environ.get("SQUALL_SCREENSHOTS") \
        else tmp_path
    with Client(url) as c:
        c.put_many("shots#resize", [os.urandom(2000) for _ in range(TASKS)])
        c.put_many("shots#thumbs", [b"x"] * 7)
        c.set_policy("shots#thumbs", max_attempts=1)
        [t] = c.lease("shots#thumbs", lease_secs=300)
        t.release(error="PIL.UnidentifiedImageError: cannot identify image file")
        c.lease("shots#resize", 3, lease_secs=600)
    # what a stranger controls: a worker name and an error with a right-to-left override
    # and control characters; the page must show them escaped, as the CLI does
    with Client(url, worker=SPOOF_WORKER) as c:
        c.put_many("shots#spoof", [b"s"] * 2)
        c.set_policy("shots#spoof", max_attempts=1)
        [t] = c.lease("shots#spoof", lease_secs=300)
        t.release(error=SPOOF_ERROR)
        c.lease("shots#spoof", lease_secs=600)

    def resize_row() -> dict[str, Any]:
        rows = httpx.get(url + "/v1/overview?limit=100", headers=ADMIN).json()["queues"]
        return next((r for r in rows if r["queue"] == "shots#resize"), {})

    # the listed rows are recomputed at most every second (master/telemetry.py): the page,
    # refreshing every 300 s here, must not load the rows of before the lease
    wait_for(lambda: resize_row().get("leased") == 3, WAIT, what="the listed rows caught up")
    page = browser.new_page(viewport={"width": 1400, "height": 1300})
    page.set_default_timeout(WAIT * 1000)  # Playwright's own waits (30 s by default)
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.type))
    resp = page.goto(url + "/?refresh=300")
    # the page's security headers (its files send them too: tests/test_observability.py)
    assert resp is not None
    h = resp.headers
    assert "script-src 'self'" in h["content-security-policy"]
    assert h["x-frame-options"] == "DENY" and h["x-content-type-options"] == "nosniff"
    # the page holds no data: without a credential its polls are refused, and it says so
    page.wait_for_selector("#errbanner:not([hidden])")
    assert page.locator("#queues tbody tr").count() == 0
    # the operator pastes the admin credential (kept in the tab's sessionStorage)
    page.fill("#token", ADMIN_TOKEN)
    page.dispatch_event("#token", "change")
    page.wait_for_selector('#queues tbody tr a[href="#/queue/shots/resize"]')
    assert page.evaluate("sessionStorage.getItem('squall.token')") == ADMIN_TOKEN
    # the page's numbers are the API's
    api = httpx.get(url + "/v1/cluster/stats", headers=ADMIN).json()
    wait_for(lambda: num(card(page, "available")) == api["available"], WAIT,
             what="available as in the API")
    assert num(card(page, "leased")) == api["leased"] == 3 + 1  # resize's and spoof's
    # a beat late by more than 0.75 s shows a live node as suspect until the next one
    wait_for(lambda: num(card(page, "nodes alive")) == 3, WAIT, what="3 nodes alive")
    assert page.locator("#nodes tbody tr").count() == 3
    row = page.locator("#queues tbody tr", has_text="shots#resize")
    cells = row.locator("td").all_inner_texts()
    assert num(cells[1]) == TASKS and num(cells[3]) == 3
    dead = page.locator("#dead tbody tr", has_text="shots#thumbs.dead")
    assert "UnidentifiedImageError" in dead.inner_text()
    assert "dlq" in (page.locator("#queues tbody tr", has_text="shots#thumbs.dead")
                     .get_attribute("class") or "")
    assert page.locator("#walbanner").is_hidden()
    # a right-to-left override or a control character from a stranger is shown escaped,
    # never raw: in the workers view, the dead-letter reasons and the queue rows
    page.wait_for_selector("#workers tbody tr[data-worker]")
    workers = page.locator("#workers tbody").inner_text()
    assert "evil\\u202egnp.exe\\x1b[2J" in workers, workers
    dead_spoof = page.locator("#dead tbody tr", has_text="shots#spoof.dead").inner_text()
    assert "ValueError: \\u202etxt.exe\\x07 bad" in dead_spoof, dead_spoof
    shown = page.evaluate("document.body.innerText")
    assert not any(ch in shown for ch in "\u202e\x1b\x07"), "raw control characters shown"
    img.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(img / "dashboard.png"), full_page=True)

    # a data node dies: the page shows it dead and blobs under-replicated, then repaired
    info = httpx.get(url + "/v1/cluster", headers=ADMIN).json()
    victim = max(info["nodes"], key=lambda n: n["blob_count"])
    idx = next(i for i in cluster.node_procs if cluster.node_url(i) == victim["address"])
    cluster.kill_node(idx)
    seen_under = 0

    def dead_and_under() -> bool:
        nonlocal seen_under
        seen_under = max(seen_under, num(card(page, "under-replicated blobs")))
        return num(card(page, "dead")) == 1 and seen_under > 0

    wait_for(dead_and_under, WAIT, interval=0.1, what="the page showing a dead node and "
             "under-replicated blobs")
    state = page.locator("#nodes tbody tr", has_text=victim["node_id"]).locator(
        ".state-dead")
    assert state.count() == 1
    page.screenshot(path=str(img / "dashboard-node-dead.png"), full_page=True)
    wait_for(lambda: num(card(page, "under-replicated blobs")) == 0, 120, interval=0.2,
             what="under-replicated back to 0 on the page")
    assert httpx.get(url + "/v1/cluster", headers=ADMIN).json()["under_replicated"] == 0
    assert num(card(page, "lost blobs")) == 0

    # a queue's page: leased sample, policy, dead letters with their reason. The button is
    # held across two refreshes (300 ms apart): the row under it must stay, or the release
    # lands on a new row and the click is lost (as it was, now and then, in a plain click)
    link = page.locator('#queues tbody tr a[href="#/queue/shots/thumbs"]')
    box = link.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    for _ in range(2):  # the input under test: a press held across two refreshes' answers
        with page.expect_response(lambda r: "/v1/overview?" in r.url):
            pass
    page.mouse.up()
    until_page(page, "location.hash === '#/queue/shots/thumbs'", WAIT, "the queue's page")
    try:
        page.wait_for_selector("#queue:not([hidden]) #qdlq tbody tr.dlq")
    except Exception as e:  # say what the page showed instead
        shown = page.evaluate("[location.hash, document.querySelector('#errbanner').textContent,"
                              " document.querySelector('#qtitle').textContent,"
                              " document.querySelector('#qdlq').textContent]")
        raise AssertionError(f"the queue page shows no dead letters: {shown}") from e
    assert "UnidentifiedImageError" in page.locator("#qdlq").inner_text()
    # the effective policy, readably (not raw JSON)
    policy = page.locator("#qpolicy").inner_text()
    assert "max attempts\t1" in policy and "shots#thumbs.dead" not in policy, policy
    assert "thumbs.dead (default)" in policy and "{" not in policy, policy
    page.screenshot(path=str(img / "dashboard-queue.png"), full_page=True)

    # the task drawer: a dead letter's state, attempts and error; retried from the page
    # after a confirmation, the result shown in the page (no alert)
    def accept_all(d: Any) -> None:
        d.accept()

    page.on("dialog", accept_all)
    dead_pid = page.locator("#qdlq tbody a.pid").first.get_attribute("data-pid")
    page.locator("#qdlq tbody a.pid").first.click()
    page.wait_for_selector("#drawer:not([hidden]) #dfacts tbody tr")
    facts = page.locator("#dfacts").inner_text()
    assert "a dead letter of shots#thumbs" in facts and "attempts\t1" in facts, facts
    assert "UnidentifiedImageError" in page.locator("#derror").inner_text()
    # its payload's first bytes, read by the master from a replica (admins only)
    try:
        wait_for(lambda: page.locator("#dpreview").inner_text() == "x", WAIT,
                 what="the payload preview")
    except TimeoutError as e:
        raise AssertionError(page.locator("#dpreview").inner_text()) from e
    page.screenshot(path=str(img / "dashboard-task.png"), full_page=True)
    page.click("#dretry")
    page.wait_for_selector("#result:not([hidden])")
    wait_for(lambda: "is available in shots#thumbs" in page.locator("#result").inner_text(),
             WAIT, what="the retry's result in the page")
    assert page.locator("#result").get_attribute("data-ok") == "1"
    back = httpx.get(f"{url}/v1/groups/shots/queues/thumbs/tasks/{dead_pid}", headers=ADMIN)
    assert back.status_code == 200 and back.json()["attempts"] == 0
    # the retry moved the dead letter away: the drawer says so
    wait_for(lambda: "gone (" in page.locator("#dfacts").inner_text(), WAIT,
             what="the retried dead letter shown gone from its queue")
    page.click("#dclose")
    assert page.locator("#drawer").is_hidden()
    page.remove_listener("dialog", accept_all)
    # the spoofing worker's task, in the drawer: its name escaped
    page.goto(url + "/?refresh=300#/queue/shots/spoof")
    until_page(page, "document.querySelector('#qtitle').textContent === 'shots#spoof'"
               " && document.querySelector('#qleased tbody a.pid') !== null", WAIT,
               "the spoof queue's page")
    link = page.locator("#qleased tbody a.pid").first
    which = (link.get_attribute("data-queue"), link.get_attribute("data-pid"))
    # while the task's read is on its way, the drawer shows none of the last task's facts
    # (its "gone" once stood under this task's title until the answer came)
    held: list[Any] = []
    task_url = f"**/v1/groups/shots/queues/spoof/tasks/{which[1]}"
    page.route(task_url, lambda route: held.append(route))
    link.click()
    wait_for(lambda: page.evaluate("true") and bool(held), WAIT, what="the task's read held")
    assert page.locator("#drawer").is_visible()
    assert which[1] in page.locator("#dtitle").inner_text()
    assert page.locator("#dfacts tbody tr").count() == 0, page.locator("#dfacts").inner_text()
    for route in held:
        route.continue_()
    page.unroute(task_url)
    page.wait_for_selector("#drawer:not([hidden]) #dfacts tbody tr")
    facts = page.locator("#dfacts").inner_text()
    assert "evil\\u202egnp.exe\\x1b[2J" in facts, (which, facts, httpx.get(
        f"{url}/v1/groups/shots/queues/spoof/tasks/{which[1]}", headers=ADMIN).text)
    assert page.locator("#dretry").is_disabled() and page.locator("#dcancel").is_disabled()
    page.click("#dclose")
    page.goto(url + "/?refresh=300#/queue/shots/resize")
    until_page(page, "document.querySelector('#qtitle').textContent === 'shots#resize'"
               " && document.querySelectorAll('#qleased tbody tr td').length >= 5", WAIT,
               "the resize queue's leased sample")
    assert page.locator("#qleased tbody tr").count() == 3

    # an action: asked first (declined: nothing happens), then confirmed
    def leased() -> int:
        r = httpx.get(url + "/v1/groups/shots/queues/resize", headers=ADMIN)
        return int(r.json()["leased"])

    questions: list[str] = []

    def answer(accept: bool) -> Any:
        def on_dialog(d: Any) -> None:
            questions.append(d.message)
            if accept or d.type == "alert":
                d.accept()
            else:
                d.dismiss()
        return on_dialog

    decline = answer(False)
    page.on("dialog", decline)
    page.click('button[data-act="reset"]')
    wait_for(lambda: len(questions) == 1, WAIT, what="the confirmation")
    assert "make every leased task of shots#resize available" in questions[0]
    assert leased() == 3
    page.remove_listener("dialog", decline)
    page.on("dialog", answer(True))
    page.click('button[data-act="reset"]')
    wait_for(lambda: leased() == 0, WAIT, what="leases reset from the page")
    wait_for(lambda: "made 3 leased task(s) available" in page.locator("#result").inner_text(),
             WAIT, what="the action's result in the page")
    assert "alert" not in dialogs, dialogs  # results show in the page, never in a dialog
    # the Content-Security-Policy broke nothing on the page
    assert not [m for m in console if "Content Security Policy" in m], console
    page.close()
