"""A horde behind the nginx block of docs/how-to/expose_to_the_internet.md:
a vision worker that reaches the horde only through nginx pops a job whose
image URL names nginx, and fetches the image through it; a streamed OpenAI
call through nginx gets each event as it is sent.

The block is read from the document (its ``listen`` and ``ssl_`` lines
replaced by a plain listener on a free port), so the documented
configuration is the tested one. nginx is the system's (``nginx`` on PATH,
or ``HORDELITE_TEST_NGINX``); .ci/run installs it, and the test skips only
when it is absent.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import FakeChatWorker
from tests.integration._env import open_env
from tests.integration.test_front import CHAT, open_front
from tests.integration.test_front_streaming import body, data_events
from tests.integration.test_images import (
    MODEL,
    VISION,
    assert_jpeg,
    client_for,
    image_url_of,
    submit_image_request,
)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "how-to" / "expose_to_the_internet.md"
NGINX = (
    os.environ.get("HORDELITE_TEST_NGINX")
    or shutil.which("nginx")
    or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        NGINX is None, reason="no nginx: HORDELITE_TEST_NGINX is unset and nginx is not installed"
    ),
]


def documented_server_block(listen: str, upstream: str) -> str:
    """The guide's nginx block, listening on ``listen`` in plain HTTP and
    proxying to ``upstream`` instead of 127.0.0.1:7001."""
    [block] = re.findall(r"```nginx\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    lines = [
        f"    listen {listen};" if line.strip().startswith("listen ") else line
        for line in block.splitlines()
        if not line.strip().startswith("ssl_")
    ]
    return "\n".join(lines).replace("127.0.0.1:7001", upstream)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def running_nginx(upstream: str) -> AsyncIterator[str]:
    """nginx with the documented block in front of ``upstream``; yields its URL."""
    assert NGINX is not None
    with tempfile.TemporaryDirectory(prefix="hordelite-nginx-") as tmp:
        port = free_port()
        conf = Path(tmp) / "nginx.conf"
        # Every path nginx writes is in tmp: no root, no /var/log.
        conf.write_text(
            f"pid {tmp}/nginx.pid;\n"
            f"error_log {tmp}/error.log;\n"
            "worker_processes 1;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            "    access_log off;\n"
            f"    client_body_temp_path {tmp}/body;\n"
            f"    proxy_temp_path {tmp}/proxy;\n"
            f"    fastcgi_temp_path {tmp}/fastcgi;\n"
            f"    uwsgi_temp_path {tmp}/uwsgi;\n"
            f"    scgi_temp_path {tmp}/scgi;\n"
            f"{documented_server_block(f'127.0.0.1:{port}', upstream)}\n"
            "}\n",
            encoding="utf-8",
        )
        # nginx binds its listener before it detaches, so once this command
        # has returned the port accepts connections: no wait is needed.
        started = await anyio.run_process([NGINX, "-p", tmp, "-c", str(conf)], check=False)
        assert started.returncode == 0, started.stderr.decode()
        pid = int((Path(tmp) / "nginx.pid").read_text(encoding="utf-8"))
        exited = os.pidfd_open(pid)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            os.kill(pid, signal.SIGTERM)
            # The master is not our child: its pidfd turns readable on exit.
            with anyio.fail_after(10):
                await anyio.wait_readable(exited)
            os.close(exited)


async def test_a_remote_vision_worker_fetches_its_image_through_nginx() -> None:
    config = Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
        server={"trusted_proxies": "127.0.0.1"},
    )
    async with (
        open_env(config=config) as env,
        client_for(env.horde) as http,
        running_nginx(env.horde.url.removeprefix("http://")) as proxied,
    ):
        async with FakeChatWorker(
            proxied, env.owner, model_id=MODEL, chat_features=VISION, image_transports=("url",)
        ) as worker:
            assert (await worker.pop())["id"] is None  # online, through nginx
            await submit_image_request(env, http)
            job = await worker.pop()
            url = image_url_of(job)
            assert url.startswith(proxied + "/blobs/"), url
            async with httpx.AsyncClient(timeout=30) as remote:
                fetched = await remote.get(url)
            assert fetched.status_code == 200, fetched.text
            assert fetched.headers["content-type"] == "image/jpeg"
            assert_jpeg(fetched.content, (64, 48))


async def test_a_stream_through_nginx_passes_each_event_as_it_comes() -> None:
    # The worker serves only once a keep-alive comment came through nginx: a
    # proxy holding the stream back would make the test fail at its deadline
    # instead of hanging. (nginx 1.22 with a fast local client passes these
    # events even with proxy_buffering on, so this does not show that the
    # guide's proxy_buffering off is needed, only that the block streams.)
    async with (
        open_front({"keepalive_interval": 0.1}) as front,
        running_nginx(front.url.removeprefix("http://")) as proxied,
    ):
        worker = await front.worker("w1")
        started: list[bool] = []
        lines: list[str] = []
        headers = {"Authorization": f"Bearer {front.env.requester}"}
        with anyio.fail_after(10):
            async with (
                anyio.create_task_group() as tg,
                httpx.AsyncClient(base_url=proxied, timeout=30) as client,
                client.stream("POST", CHAT, headers=headers, json=body()) as response,
            ):
                async for line in response.aiter_lines():
                    if line.startswith(":") and not started:
                        started.append(True)
                        tg.start_soon(worker.serve_one)
                    if line:
                        lines.append(line)
        assert response.status_code == 200
        assert started
        assert lines[-1] == "data: [DONE]"
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in data_events(lines))
        assert content == "reply to: Name one colour."
