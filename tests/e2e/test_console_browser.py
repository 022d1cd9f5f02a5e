"""The web console in a real browser (Debian's chromium, driven by Playwright) against a real
server and agent on each store: sign in, watch a job's log grow, stop it from its page, read
its loss chart, history and past versions, follow a retried job on to its next attempt and pick
the earlier one, meet another user's job as a 404, see a hostile log line as text, and sign
out. The tests save screenshots of the jobs page and a job page."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests.e2e.harness import Cluster

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SLOW_S = 60_000  # ms: a job clones, builds its environment and starts meanwhile

TICKER = """\
import signal, sys, time

def bye(*_):
    print("caught SIGTERM after the last tick", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, bye)
for tick in range(1000):
    print(f"tick {tick} at {time.time():.3f}", flush=True)
    time.sleep(0.3)
"""
LOSSES = """\
import json, os, pathlib

checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
history = []
for step in range(10, 90, 10):
    history.append({"step": step, "loss": round(2.0 / (1 + step / 20), 4)})
    if step % 20 == 0:
        history.append({"step": step, "eval_loss": round(2.4 / (1 + step / 25), 4)})
    if step % 40 == 0:  # the trainer keeps the whole history in each checkpoint
        partial = checkpoints / f".partial-{step}"
        partial.mkdir(parents=True)
        (partial / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "log_history": history}))
        (partial / "model.safetensors").write_bytes(bytes(16))
        partial.rename(checkpoints / f"checkpoint-{step}")
    print(f"step {step} loss {history[-1]}", flush=True)
(pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "model.txt").write_text("weights")
print("training finished")
"""
RETRIED = """\
import os, pathlib, sys, time

attempt = int(os.environ["FLEXAI_RESTART_COUNT"]) + 1
print(f"attempt {attempt} says hello", flush=True)
if attempt == 1:
    deadline = time.monotonic() + 120
    while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # until the test saw this line on the page
    sys.exit(3)  # the job runs again (--retry-on-exit-codes 3)
for tick in range(6):
    print(f"attempt {attempt} tick {tick}", flush=True)
    time.sleep(0.5)
"""
HOSTILE_LINES = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>"]
HOSTILE = "".join(f"print({line!r})\n" for line in HOSTILE_LINES)
ARRIVALS = """() => {
  const log = document.getElementById("log");
  window.__from = log.textContent.length;
  window.__arrivals = [];
  new MutationObserver(() => window.__arrivals.push([Date.now(), log.textContent.length]))
    .observe(log, {childList: true, characterData: true, subtree: true});
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "chromium is missing: scripts/test installs it (apt-get)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def shots(cluster: Cluster) -> Path:
    """Where screenshots go: ``$FLEXAI_SCREENSHOTS`` (to refresh the README's), else beside
    the cluster."""
    where = Path(os.environ.get("FLEXAI_SCREENSHOTS") or cluster.root / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def sign_in(browser: Browser, cluster: Cluster, token: str, width: int = 1280) -> Page:
    page = browser.new_context(base_url=cluster.api_url,
                               viewport={"width": width, "height": 900}).new_page()  # fmt: skip
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/sign-in\?next=%2F$"))
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("Signed in as")).to_be_visible()
    return page


def user_token(cluster: Cluster, name: str) -> str:
    made = cluster.api("POST", "/v1/admin/users", json={"name": name})
    made.raise_for_status()
    return str(made.json()["token"]["token"])


def row_of(page: Page, name: str) -> Locator:
    return page.locator("tr", has=page.get_by_role("link", name=name, exact=True))


def screenshot(page: Page, path: Path, height: int = 720) -> None:
    """The page's top ``height`` pixels (the README shows them)."""
    width = page.viewport_size["width"] if page.viewport_size else 1280
    page.screenshot(path=str(path), full_page=True,
                    clip={"x": 0, "y": 0, "width": width, "height": height})  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def log_delays(page: Page) -> list[float]:
    """For each tick line that came since :data:`ARRIVALS` ran: seconds from the job's print
    to the page's text."""
    text: str = page.locator("#log").text_content() or ""
    arrivals: list[list[float]] = page.evaluate("window.__arrivals")
    start: int = page.evaluate("window.__from")
    delays = []
    for line in re.finditer(r"tick \d+ at (\d+\.\d+)\n", text[start:]):
        shown = next((at for at, length in arrivals if length >= start + line.end()), None)
        if shown is not None:
            delays.append(shown / 1000 - float(line.group(1)))
    return delays


def test_the_list_shows_a_running_job_whose_log_grows_live_and_stop_ends_it_on_its_page(
    cluster: Cluster, browser: Browser, repo_factory: RepoFactory, job_name: str, shots: Path
) -> None:
    ticker = repo_factory({"requirements.txt": "", "train.py": TICKER})
    waiter = f"{job_name}-next"
    page = sign_in(browser, cluster, cluster.token)
    cluster.flexai("training", "run", job_name, "-u", str(ticker), "--", "train.py")
    try:
        page.reload()
        expect(row_of(page, job_name).locator("[data-field=status]")).to_have_text(
            "in progress", timeout=SLOW_S)  # live: the page is not reloaded meanwhile
        quick = repo_factory({"requirements.txt": "", "train.py": "print('my turn')\n"})
        cluster.flexai("training", "run", waiter, "-u", str(quick), "--", "train.py")
        page.reload()
        expect(row_of(page, waiter).locator("[data-field=reason]")).to_contain_text(
            "waits for", timeout=SLOW_S)  # fmt: skip
        screenshot(page, shots / "console-jobs.png", height=480)

        page.get_by_role("link", name=job_name, exact=True).click()
        page.evaluate("window.__stayed = true")
        expect(page.locator("#log")).to_contain_text("tick 2 at", timeout=SLOW_S)
        page.evaluate(ARRIVALS)
        seen = len(re.findall("tick", page.locator("#log").text_content() or ""))
        expect(page.locator("#log")).to_contain_text(f"tick {seen + 5} at", timeout=20_000)
        delays = log_delays(page)
        assert len(delays) >= 5 and sorted(delays)[len(delays) // 2] < 1.0, delays

        page.get_by_text("Stop this job…").click()
        page.get_by_role("button", name="Yes, stop it").click()
        expect(page.locator(".job-head [data-field=status]")).to_have_text("stopped",
                                                                         timeout=SLOW_S)
        timeline = page.locator("ol.timeline .what .status")
        expect(timeline.last).to_have_text("stopped")
        assert "stop in progress" in timeline.all_text_contents()
        expect(page.locator("[data-field=log-state]")).to_have_text(
            "The job ended: this is its last line.", timeout=20_000)
        expect(page.locator("#log")).to_contain_text("caught SIGTERM after the last tick")
        assert page.evaluate("window.__stayed") is True  # all of it without a reload
        expect(page.locator("details[data-action=stop]")).to_be_hidden()
    finally:
        cluster.api("POST", f"/v1/jobs/{job_name}/stop")
    cluster.wait_for(waiter, {"succeeded"}, timeout=120)


def test_the_loss_chart_has_a_point_per_logged_step_and_the_history_every_status_in_order(
    cluster: Cluster, browser: Browser, repo_factory: RepoFactory, job_name: str, shots: Path
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": LOSSES})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    cluster.wait_for(job_name, {"succeeded"}, timeout=120)
    page = sign_in(browser, cluster, cluster.token)
    page.goto(f"/jobs/{job_name}")

    train = page.locator("svg circle.point.train")
    assert [train.nth(i).get_attribute("data-step") for i in range(train.count())] == [
        "10", "20", "30", "40", "50", "60", "70", "80"]  # fmt: skip
    evals = page.locator("svg circle.point.eval")
    assert [evals.nth(i).get_attribute("data-step") for i in range(evals.count())] == [
        "20", "40", "60", "80"]  # fmt: skip
    statuses: list[str] = []
    for status in page.locator("ol.timeline .what .status").all_text_contents():
        if not statuses or statuses[-1] != status:
            statuses.append(status)
    assert statuses == ["pending", "scheduling", "building", "in progress", "succeeded"]
    expect(page.locator("#log")).to_contain_text("training finished")
    expect(page.get_by_role("link", name="output_0.zip")).to_be_visible()
    screenshot(page, shots / "console-job.png", height=1300)

    page.locator("#version").fill("2")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("[data-field=past-status]")).to_have_text("scheduling")
    expect(page.locator("ol.timeline li[aria-current=step]")).to_have_attribute(
        "data-version", "2")  # fmt: skip
    expect(page.locator(".job-head [data-field=status]")).to_have_text("succeeded")


def test_a_retried_jobs_page_moves_on_to_its_next_attempt_and_shows_the_first_when_picked(
    cluster: Cluster, browser: Browser, repo_factory: RepoFactory, job_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    repo = repo_factory({"requirements.txt": "", "train.py": RETRIED})
    seen = tmp_path / "first-attempt-seen"
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--max-retries", "1",
                   "--retry-on-exit-codes", "3", "--", "train.py", str(seen))  # fmt: skip
    page = sign_in(browser, cluster, cluster.token)
    page.goto(f"/jobs/{job_name}")
    log = page.locator("#log")
    expect(log).to_contain_text("attempt 1 says hello", timeout=SLOW_S)
    seen.touch()  # the first attempt ends: the page follows the job on, to its next attempt
    expect(log).to_contain_text("attempt 2 says hello", timeout=SLOW_S)
    expect(page.locator("#logs-title")).to_have_text("Logs, attempt 2")
    expect(log).to_contain_text("attempt 2 tick 5", timeout=SLOW_S)
    expect(page.locator("[data-field=log-state]")).to_have_text(
        "The job ended: this is its last line.", timeout=20_000)
    assert "attempt 1 says hello" not in (log.text_content() or "")
    expect(page.get_by_role("link", name="attempt 2 (current)")).to_have_attribute(
        "aria-current", "true")  # fmt: skip

    page.get_by_role("link", name="attempt 1", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job_name}\?attempt=1#logs-title$"))
    expect(page.locator("[data-field=log-state]")).to_have_text(
        "Attempt 1 ended: this is its last line.", timeout=20_000)
    expect(log).to_contain_text("attempt 1 says hello")
    assert "attempt 2" not in (log.text_content() or "")
    expect(page.locator("#logs-title")).to_have_text("Logs, attempt 1")
    page.get_by_role("link", name="attempt 2 (current)").click()
    expect(log).to_contain_text("attempt 2 tick 5")
    assert cluster.inspect(job_name)["status"] == "succeeded"


def test_another_users_job_is_a_404_page(
    cluster: Cluster, browser: Browser, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('hi')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--accels", "64", "--",
                   "train.py")  # fmt: skip
    cluster.wait_for(job_name, {"rejected"})
    mine = sign_in(browser, cluster, cluster.token)
    assert mine.goto(f"/jobs/{job_name}").status == 200  # type: ignore[union-attr]
    theirs = sign_in(browser, cluster, user_token(cluster, f"u{job_name[2:]}"))
    answer = theirs.goto(f"/jobs/{job_name}")
    assert answer is not None and answer.status == 404
    expect(theirs.get_by_role("heading", name="Job not found")).to_be_visible()
    expect(theirs.locator("table.jobs")).to_have_count(0)


def test_a_script_in_a_log_line_is_shown_as_text_and_never_runs(
    cluster: Cluster, browser: Browser, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": HOSTILE})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    cluster.wait_for(job_name, {"succeeded"}, timeout=120)
    page = sign_in(browser, cluster, cluster.token)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(f"/jobs/{job_name}")
    expect(page.locator("[data-field=log-state]")).to_have_text(
        "The job ended: this is its last line.", timeout=20_000)
    for line in HOSTILE_LINES:
        expect(page.locator("#log")).to_contain_text(line)
    assert page.locator("#log img, #log script").count() == 0
    with page.expect_download() as download:  # the API's route, with the session's cookie
        page.get_by_role("link", name="Download the whole log").click()
    whole = Path(download.value.path()).read_text()
    assert all(line in whole for line in HOSTILE_LINES) and download.value.suggested_filename \
        == f"{job_name}-node0.log"  # fmt: skip
    page.wait_for_timeout(500)
    assert dialogs == []


def test_pages_work_by_keyboard_on_a_phones_width_and_sign_out_ends_the_session(
    cluster: Cluster, browser: Browser, job_name: str
) -> None:
    cluster.api("POST", "/v1/jobs", json={"name": job_name, "repository_url": "/nowhere",
                                          "entry_point": ["train.py"], "accels": 64})  # fmt: skip
    page = browser.new_context(base_url=cluster.api_url,
                               viewport={"width": 390, "height": 844}).new_page()  # fmt: skip
    page.goto("/")
    expect(page.get_by_label("API token")).to_be_focused()  # no click needed
    page.keyboard.type(cluster.token)
    page.keyboard.press("Enter")
    expect(page.get_by_text("Signed in as")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.get_by_role("link", name=job_name, exact=True).focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(f"/jobs/{job_name}$"))
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    cookies = {cookie["name"]: cookie["value"] for cookie in page.context.cookies()}
    assert list(cookies) == ["flexai_session"]
    session = page.context.cookies()[0]
    assert session.get("httpOnly") and session.get("sameSite") == "Strict"
    assert page.evaluate("document.cookie") == "" and page.evaluate("localStorage.length") == 0
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/sign-in$"))
    page.goto("/nodes")
    expect(page).to_have_url(re.compile(r"/sign-in\?next=%2Fnodes$"))
    assert httpx.get(f"{cluster.api_url}/v1/jobs", cookies=cookies).status_code == 401
