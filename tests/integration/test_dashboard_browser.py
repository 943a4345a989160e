"""The dashboard in a real headless Chromium (the system's, driven by
Playwright): the pool and workers show, a playground reply streams in before
the worker submits, a typed key is used and sent nowhere but /v1, hostile
names stay text, and the page fits a phone's width.

The browser runs in a worker thread (Playwright's sync API) beside the horde
and its fake workers on the test's event loop; the thread calls back into
the loop with ``anyio.from_thread.run``. Screenshots go to
``$HORDELITE_TEST_ARTIFACTS`` (default ``.artifacts/`` at the repository
root) and their paths are printed at the end of the run.

Chromium comes from ``HORDELITE_TEST_CHROMIUM`` (default ``/usr/bin/chromium``
when it exists); the tests skip only when neither is there. .ci/run installs
it, so CI never skips them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from playwright.sync_api import Page, Request, expect, sync_playwright

from hordelite.testing import FakeChatWorker
from tests.integration import conftest
from tests.integration._chat_helpers import MODEL, STRICT, ChatEnv, open_chat_horde
from tests.unit.test_cli import START_DEADLINE, STOP_TIMEOUT, _banner, _lines

ROOT = Path(__file__).resolve().parents[2]
_DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM = os.environ.get("HORDELITE_TEST_CHROMIUM") or (
    _DEFAULT_CHROMIUM if Path(_DEFAULT_CHROMIUM).exists() else None
)
ARTIFACTS = Path(os.environ.get("HORDELITE_TEST_ARTIFACTS") or ROOT / ".artifacts")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium: HORDELITE_TEST_CHROMIUM is unset and /usr/bin/chromium is absent",
    ),
]

DEADLINE_MS = 15_000  # for anything the page shows: a deadline, not a sleep
expect.set_options(timeout=DEADLINE_MS)
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
HOSTILE_WORKER = '<img src=x onerror="document.body.dataset.pwned=1;alert(1)">'
HOSTILE_MODEL = '"><script>document.body.dataset.pwned=2</script>'
HOSTILE_REPLY = '<img src=x onerror="document.body.dataset.pwned=3">'


@contextlib.contextmanager
def browser_page(viewport: dict[str, int], *, phone: bool = False) -> Iterator[Page]:
    """A fresh Chromium page (a new profile: no storage, no cookies)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = browser.new_context(
                viewport=viewport,
                is_mobile=phone,
                has_touch=phone,
                device_scale_factor=2 if phone else 1,
            )
            page = context.new_page()
            page.set_default_timeout(DEADLINE_MS)
            yield page
            context.close()
        finally:
            browser.close()


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    conftest.ARTIFACT_PATHS.append(path)
    print(f"screenshot: {path}")
    return path


def on_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run the async ``fn`` on the test's event loop, from the browser thread."""
    return anyio.from_thread.run(fn, *args)


async def pop_streamed_job(worker: FakeChatWorker) -> dict[str, Any]:
    """The worker's next job, long-polling for it (the page queues it)."""
    job = await worker.pop(wait=10)
    assert job["id"] is not None, job
    assert job["payload"].get("stream_progress") is True, job["payload"]
    return job


async def post_progress(worker: FakeChatWorker, job: dict[str, Any], seq: int, text: str) -> None:
    response = await worker.client.post(
        "/generate/text/progress", json={"id": job["id"], "seq": seq, "delta": {"content": text}}
    )
    assert response.status_code == 200, response.text


async def submit(worker: FakeChatWorker, job: dict[str, Any], text: str) -> None:
    reply = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    response = await worker.submit_reply(job, reply)
    assert response.status_code == 200, response.text


def open_dashboard(page: Page, env: ChatEnv) -> None:
    page.goto(env.horde.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def refresh(page: Page) -> None:
    """Click Refresh and wait until the script has redrawn from the routes."""
    before = page.locator("body").get_attribute("data-refreshed") or "0"
    page.click("#refresh")
    expect(page.locator("body")).to_have_attribute("data-refreshed", str(int(before) + 1))


def refresh_until(page: Page, done: Callable[[], bool], why: Callable[[], str]) -> None:
    """Refresh every 250 ms until ``done()``; past DEADLINE_MS, fail with ``why()``."""
    deadline = time.monotonic() + DEADLINE_MS / 1000
    while not done():
        assert time.monotonic() < deadline, why()
        page.wait_for_timeout(250)
        refresh(page)


def chat_turn(
    page: Page, worker: FakeChatWorker, message: str, partial: str, full: str
) -> dict[str, Any]:
    """Send ``message`` from the playground; the worker posts ``partial`` as
    progress, the page must show it while the reply is still streaming, then
    the worker submits ``full``, which the page must show whole. Returns the job."""
    page.fill("#message", message)
    page.click("#send")
    job: dict[str, Any] = on_loop(pop_streamed_job, worker)
    on_loop(post_progress, worker, job, 1, partial)
    reply = page.locator("#transcript li.assistant").last
    expect(reply).to_have_text(partial)  # shown before the worker has submitted
    assert reply.get_attribute("data-state") == "streaming"
    on_loop(submit, worker, job, full)
    expect(reply).to_have_attribute("data-state", "done")
    expect(reply).to_have_text(full)
    return job


async def test_the_page_shows_the_pool_and_a_reply_streams_in_before_the_worker_submits(
    anyio_backend: str,
) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("honest-worker", STRICT)

        def browse() -> None:
            with browser_page(DESKTOP) as page:
                open_dashboard(page, env)
                model_row = page.locator("#models tbody tr", has_text=MODEL)
                expect(model_row).to_have_count(1)
                expect(model_row.locator("td").nth(1)).to_have_text("1")  # its workers
                worker_row = page.locator("#workers tbody tr", has_text="honest-worker")
                expect(worker_row).to_have_count(1)
                expect(worker_row.locator("td.status")).to_have_text("online")
                expect(page.locator("#model")).to_have_value(MODEL)

                sent: list[Request] = []
                page.on("request", lambda r: sent.append(r))
                chat_turn(page, worker, "Name a colour.", "Blue, ", "Blue, like the sea.")
                chats = [r for r in sent if r.url.endswith("/v1/chat/completions")]
                assert len(chats) == 1
                # No key typed: the anonymous user, with no Authorization header.
                assert "authorization" not in chats[0].headers
                assert '"stream":true' in (chats[0].post_data or "")

                # The activity figures are cached for a few seconds: refresh
                # until they count the job, within the deadline.
                summary = page.locator("#activity-summary")
                refresh_until(
                    page, lambda: "1 jobs done" in summary.inner_text(), summary.inner_text
                )
                # The whole hour, whatever the retention (30 min by default).
                assert summary.inner_text().startswith("Last hour: 1 jobs done"), (
                    summary.inner_text()
                )
                assert page.locator("#chart-jobs polyline").count() == 1
                screenshot(page, f"dashboard-desktop-{anyio_backend}")

        await anyio.to_thread.run_sync(browse)


async def test_a_key_typed_in_the_page_is_used_and_sent_only_to_v1() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("keyed-worker", STRICT)
        key = await env.horde.create_key("carol", kudos=1000)
        kudos_before = await env.kudos(key)

        def browse() -> None:
            with browser_page(DESKTOP) as page:
                sent: list[Request] = []
                page.on("request", lambda r: sent.append(r))
                open_dashboard(page, env)
                page.fill("#key", key)
                chat_turn(page, worker, "Hello", "Hi", "Hi there.")
                refresh(page)
                to_v1 = [r for r in sent if r.url == env.horde.url + "/v1/chat/completions"]
                assert to_v1, [r.url for r in sent]  # the chat went out, with the key
                for request in sent:
                    if request in to_v1:
                        assert request.headers["authorization"] == f"Bearer {key}"
                        assert key not in (request.post_data or "")
                        continue
                    assert key not in request.url, request.url
                    assert all(key not in v for v in request.all_headers().values()), request.url
                    assert key not in (request.post_data or ""), request.url
                assert len(sent) > 5  # page, files, routes, the chat, the refresh
                # Kept in this tab's sessionStorage only: no localStorage, no cookie.
                assert page.evaluate("sessionStorage.getItem('hordelite.dashboard.apiKey')") == key
                assert page.evaluate("localStorage.length") == 0
                assert page.context.cookies() == []

        await anyio.to_thread.run_sync(browse)
        # The horde served the call as carol: she paid for it.
        assert await env.kudos(key) < kudos_before


async def test_hostile_names_and_replies_show_as_text_and_run_nothing() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker(HOSTILE_WORKER, STRICT, model_id=HOSTILE_MODEL)

        def browse() -> None:
            with browser_page(DESKTOP) as page:
                dialogs: list[str] = []
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                open_dashboard(page, env)
                for round_ in ("server-rendered", "redrawn by the script"):
                    expect(page.locator("#workers td.name")).to_have_text([HOSTILE_WORKER])
                    expect(page.locator("#models td.name")).to_have_text([HOSTILE_MODEL])
                    assert page.locator("main img, main script").count() == 0, round_
                    refresh(page)
                expect(page.locator("#model")).to_have_value(HOSTILE_MODEL)
                chat_turn(page, worker, HOSTILE_REPLY, "<img", HOSTILE_REPLY)
                expect(page.locator("#transcript li.user")).to_have_text([HOSTILE_REPLY])
                assert page.locator("main img, main script").count() == 0
                assert page.locator("body").get_attribute("data-pwned") is None
                assert dialogs == []

        await anyio.to_thread.run_sync(browse)


async def test_on_a_phone_the_page_has_no_horizontal_scroll_and_the_playground_works(
    anyio_backend: str,
) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("phone-worker", STRICT)
        # A long unbroken name must wrap, not widen the page.
        await env.chat_worker("w" * 60, STRICT)

        def browse() -> None:
            with browser_page(PHONE, phone=True) as page:
                open_dashboard(page, env)
                width = page.evaluate("document.documentElement.clientWidth")
                assert width == PHONE["width"]
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                for control in ("#model", "#key", "#message", "#send"):
                    box = page.locator(control).bounding_box()
                    assert box is not None, control
                    assert box["x"] >= 0, control
                    assert box["x"] + box["width"] <= width, control
                page.locator("#model").select_option(MODEL)
                page.locator("#message").tap()
                page.fill("#message", "Short answer please.")
                page.locator("#send").tap()
                job = on_loop(pop_streamed_job, worker)
                on_loop(post_progress, worker, job, 1, "Sure")
                reply = page.locator("#transcript li.assistant").last
                expect(reply).to_have_text("Sure")
                on_loop(submit, worker, job, "Sure: red.")
                expect(reply).to_have_attribute("data-state", "done")
                expect(reply).to_have_text("Sure: red.")
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                screenshot(page, f"dashboard-phone-{anyio_backend}")

        await anyio.to_thread.run_sync(browse)


def test_the_readme_quick_start_leads_to_a_dashboard_that_chats_with_a_workers_model(
    tmp_path: Path,
) -> None:
    """``hordelite serve`` prints the dashboard's URL; with the README's
    ``hordelite worker --backend fake`` running, that page shows the worker
    and its model, and its playground gets the model's reply."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    hordelite = [sys.executable, "-m", "hordelite"]
    config = tmp_path / "hordelite.toml"
    config.write_text('[server]\nhost = "127.0.0.1"\nport = 0\ngrace_period = 2\n')
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, log: str) -> subprocess.Popen[str]:
        with (tmp_path / log).open("w") as out:
            process = subprocess.Popen(
                [*hordelite, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=tmp_path,
                env=env,
            )
        started.append(process)
        return process

    serve = subprocess.Popen(
        [*hordelite, "serve"], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    )
    started.append(serve)
    reader = None
    try:
        assert serve.stdout is not None
        lines, reader = _lines(serve.stdout)
        banner = "\n".join(_banner(lines, time.monotonic() + START_DEADLINE))
        match = re.search(r"dashboard and chat playground: (http://127\.0\.0\.1:\d+)/", banner)
        assert match, banner
        url = match.group(1)
        created = subprocess.run(
            [*hordelite, "keys", "create", "alice", "--kudos", "100"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            check=True,
        )
        key = created.stdout.split()[-1]
        start(
            "worker",
            "--horde",
            url,
            f"--key={key}",
            "--name",
            "my-worker",
            "--backend",
            "fake",
            log="worker.log",
        )

        with browser_page(DESKTOP) as page:
            page.goto(url + "/")
            expect(page.locator("body")).to_have_attribute("data-ready", "true")
            worker_row = page.locator("#workers tbody tr", has_text="my-worker")
            refresh_until(  # until the worker has checked in
                page, lambda: worker_row.count() > 0, (tmp_path / "worker.log").read_text
            )
            expect(page.locator("#models tbody tr", has_text="fake-model")).to_have_count(1)
            expect(page.locator("#model")).to_have_value("fake-model")
            page.fill("#message", "Name a colour.")
            page.click("#send")
            reply = page.locator("#transcript li.assistant").last
            expect(reply).to_have_attribute("data-state", "done")
            expect(reply).to_have_text("echo: Name a colour.")
            screenshot(page, "dashboard-quick-start")
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if reader is not None:
            reader.join(timeout=STOP_TIMEOUT)
        if serve.stdout is not None and not (reader and reader.is_alive()):
            serve.stdout.close()
