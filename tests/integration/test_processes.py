"""``hordelite serve --processes N``: real processes on one port (PostgreSQL).

* Two serving processes answer a heartbeat and a whole text cycle through the
  one port, and the parent has exactly two live children.
* A child killed with SIGKILL is replaced, and the horde keeps answering.
* A job popped before every child was killed with SIGKILL comes back through
  its lease once the children are replaced: not before the lease ends, and
  then to the next pop, as a new job of the same request.
* SIGTERM to the parent stops every child, and the parent exits 0 in time.
* The parent killed with SIGKILL leaves no child behind.
* Without PostgreSQL or without Redis signals the command refuses in one
  line, exit 2, before it binds or migrates anything.
* Two sweeps at once on PostgreSQL: one runs, the other skips (or waits).
* Every scrape of /metrics, whichever child answers (on the horde's port or
  a metrics port of its own), reports the totals of all; a child killed
  with SIGKILL loses no count and doubles none, its open streams leave the
  gauge, and the metrics directory is gone after the stop.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hordelite import __version__
from hordelite.cli import main
from hordelite.cli._processes import RESTART_DELAY, STOP_MARGIN
from hordelite.config import Config
from hordelite.contract.limits import ANONYMOUS_API_KEY
from hordelite.horde.service import Horde, hash_key, new_api_key
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.timers import SWEEP_LOCK_KEY
from tests.integration._helpers import ServeProcess, run_hordelite

pytestmark = pytest.mark.postgres

START_DEADLINE = 30.0
REPLACE_DEADLINE = 20.0
GRACE_PERIOD = 2.0
# What a stop may take: the children's grace period, the parent's margin
# past it, and the interpreter's own exit.
STOP_DEADLINE = GRACE_PERIOD + STOP_MARGIN + 5.0
MODEL = "fake-model"
POP = {
    "name": "fake-worker",
    "models": [MODEL],
    "max_length": 512,
    "max_context_length": 4096,
    "bridge_agent": "hordelite-fake-worker:1:test",
}
# A short lease, swept often: a job leased when every child died comes back
# within seconds. Still longer than replacing both children takes (their
# restart delay, then their start: 2 to 4 s on a quiet machine, 8.8 s seen in
# a full run of the suite on two cores), so that pops reach the new children
# while the lease runs.
JOB_TTL = 20.0
SWEEP_INTERVAL = 0.5
# What a loaded machine may add, past the lease's end and the next sweep,
# before a pop gets the job again.
LEASE_MARGIN = 5.0


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def write_config(
    tmp_path: Path,
    database: str,
    signals: str,
    *,
    processes: int = 2,
    backend: str = "trio",
    port: int = 0,
    horde: dict[str, float] | None = None,
) -> Path:
    config = tmp_path / "serve.toml"
    settings = [f"{key} = {value}" for key, value in (horde or {}).items()]
    config.write_text(
        "\n".join(
            [
                "[server]",
                'host = "127.0.0.1"',
                f"port = {port}",
                f'backend = "{backend}"',
                f"grace_period = {GRACE_PERIOD}",
                f"processes = {processes}",
                "[storage]",
                # A JSON string is a TOML basic string.
                f"database = {json.dumps(database)}",
                "[signals]",
                f"url = {json.dumps(signals)}",
                *(["[horde]", *settings] if settings else []),
                "",
            ]
        ),
        encoding="utf-8",
    )
    return config


def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of ``pid``, read from /proc."""
    found: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # the process is gone: no child of its
        return found
    for task in tasks:
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return {child for child in found if alive(child)}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone (ESRCH: between open and read)
        return False
    # The state follows the command's closing parenthesis.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def until(condition: Any, deadline: float, what: str) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` past the deadline."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline} s: {what}")
        time.sleep(0.05)


class Served(ServeProcess):
    """A real ``hordelite serve`` process and its children (each one seen
    is killed at the clean-up too); its stderr in ``stderr.log``."""

    def __init__(self, config: Path) -> None:
        self.seen: set[int] = set()  # every child seen, for the clean-up
        super().__init__(
            config,
            log_name="stderr.log",
            start_deadline=START_DEADLINE,
            stop_deadline=STOP_DEADLINE,
        )
        self.pid = self.process.pid

    def children(self) -> set[int]:
        found = children(self.pid)
        self.seen |= found
        return found

    def rest_of_output(self) -> list[str]:
        """Stdout after the banner, once the process has ended."""
        self.reader.join(timeout=STOP_DEADLINE)
        lines = []
        while (line := self.lines.get_nowait()) is not None:
            lines.append(line)
        return lines

    def stop(self) -> None:
        """Kill whatever is left: the parent, then any child seen."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for child in self.seen:
            if alive(child):
                os.kill(child, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(config: Path) -> Served:
        served = Served(config)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()


@pytest.fixture
def served(tmp_path: Path, postgres_schema_url: str, redis_url: str, serve: Any) -> Served:
    """A horde of two processes on a PostgreSQL schema of the test's own,
    its signals through Redis."""
    return serve(write_config(tmp_path, postgres_schema_url, redis_url))  # type: ignore[no-any-return]


def replaced(served: Served, *victims: int) -> bool:
    """Two live children again, none of the victims among them."""
    now = served.children()
    return len(now) == 2 and not now & set(victims)


def worker_key(database: str) -> str:
    """A new user's key, for the worker (the anonymous key runs none)."""
    db = Database(database, 1)
    try:
        key = new_api_key()
        db.run_sync(queries.create_user, True, "bob", hash_key(key), 0.0, False, False, time.time())
        return key
    finally:
        db.dispose()


def text_cycle(url: str, worker: str) -> None:
    """Submit, pop, submit the generation, read the status: each on a new
    connection, so that the processes behind the port share the work."""
    with httpx.Client(
        base_url=f"{url}/api/v2",
        timeout=10,
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as client:
        r = client.post(
            "/generate/text/async",
            headers={"apikey": ANONYMOUS_API_KEY},
            json={"prompt": "Once upon", "params": {"max_length": 16}, "models": [MODEL]},
        )
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        r = client.post("/generate/text/pop", headers={"apikey": worker}, json=POP)
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["id"] is not None, job
        assert job["payload"]["prompt"] == "Once upon"
        r = client.post(
            "/generate/text/submit",
            headers={"apikey": worker},
            json={"id": job["id"], "generation": "there was", "state": "ok"},
        )
        assert r.status_code == 200, r.text
        status = client.get(f"/generate/text/status/{request_id}").json()
        assert status["done"] is True, status
        assert status["generations"][0]["text"] == "there was"


def heartbeat(url: str) -> None:
    r = httpx.get(f"{url}/api/v2/status/heartbeat", timeout=10)
    assert r.status_code == 200
    assert r.json()["message"] == "OK"


# Serving -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_two_processes_answer_a_heartbeat_and_a_text_cycle_through_one_port(
    tmp_path: Path, postgres_schema_url: str, redis_url: str, serve: Any, backend: str
) -> None:
    served = serve(write_config(tmp_path, postgres_schema_url, redis_url, backend=backend))
    text = "\n".join(served.banner)
    assert "processes: 2" in text
    assert text.count("serving at") == 1  # the parent's banner, once
    assert len(served.children()) == 2
    heartbeat(served.url)
    text_cycle(served.url, worker_key(postgres_schema_url))
    for _ in range(4):
        heartbeat(served.url)
    assert len(served.children()) == 2


def test_a_child_killed_with_SIGKILL_is_replaced_and_the_horde_keeps_answering(
    postgres_schema_url: str, served: Served
) -> None:
    first = served.children()
    assert len(first) == 2
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    until(
        functools.partial(replaced, served, victim),
        REPLACE_DEADLINE,
        f"a second child in place of {victim}",
    )
    until(
        lambda: f"process {victim} exited with code -9" in served.log.read_text(),
        REPLACE_DEADLINE,
        "the log line naming the killed child",
    )
    heartbeat(served.url)
    text_cycle(served.url, worker_key(postgres_schema_url))
    assert served.process.poll() is None


# A model no worker of the metrics test serves: its requests stay queued.
IDLE_MODEL = "idle-model"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One /metrics scrape on a new connection (any child may answer)."""
    r = httpx.get(f"{url}/metrics", timeout=10, headers={"Connection": "close"})
    assert r.status_code == 200, r.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(r.text)
        for sample in family.samples
    }


def counted(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """The figures the metrics test reads, from one scrape."""
    submits = ("/api/v2/generate/text/async", "POST", "202")
    return {
        "pops": samples.get(("hordelite_pops_total", (("outcome", "job"),)), 0.0),
        "submits": samples.get(
            (
                "hordelite_http_requests_total",
                tuple(sorted(zip(("route", "method", "status"), submits, strict=True))),
            ),
            0.0,
        ),
        "done": samples.get(("hordelite_request_latency_seconds_count", (("kind", "text"),)), 0.0),
        # No online worker serves IDLE_MODEL: its requests are "unserved".
        "queued": samples.get(
            ("hordelite_queue_depth", (("kind", "text"), ("model", "unserved"))), 0.0
        ),
        "workers": samples.get(("hordelite_workers_online", ()), 0.0),
    }


@pytest.mark.parametrize("own_port", [False, True], ids=["horde-port", "metrics-port"])
def test_every_child_answers_the_metrics_of_all_and_a_killed_child_loses_none(
    tmp_path: Path,
    postgres_schema_url: str,
    redis_url: str,
    serve: Any,
    own_port: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The supervisor's metrics directory is made here, so that its removal shows.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    config = write_config(tmp_path, postgres_schema_url, redis_url)
    metrics_port = free_port() if own_port else 0
    config.write_text(config.read_text() + f"[metrics]\nport = {metrics_port}\n")
    served = serve(config)
    metrics_url = f"http://127.0.0.1:{metrics_port}" if own_port else served.url
    worker = worker_key(postgres_schema_url)
    for _ in range(5):
        text_cycle(served.url, worker)
    # Two more requests wait (for a model no worker serves): counted once,
    # from the database, not once per child.
    with httpx.Client(base_url=f"{served.url}/api/v2", timeout=10) as client:
        for _ in range(2):
            r = client.post(
                "/generate/text/async",
                headers={"apikey": ANONYMOUS_API_KEY, "Connection": "close"},
                json={"prompt": "Later", "params": {"max_length": 16}, "models": [IDLE_MODEL]},
            )
            assert r.status_code == 202, r.text
    expected = {"pops": 5, "submits": 7, "done": 5, "queued": 2, "workers": 1}
    # Several scrapes, each on a new connection, reach both children.
    started = set()
    for _ in range(8):
        samples = scrape(metrics_url)
        assert counted(samples) == expected
        # The build and the process are the answering child's, never summed.
        assert samples[("hordelite_build_info", (("version", __version__),))] == 1
        started.add(samples[("process_start_time_seconds", ())])
        assert samples[("process_resident_memory_bytes", ())] > 0
    assert 1 <= len(started) <= 2
    victim = min(served.children())
    os.kill(victim, signal.SIGKILL)
    until(functools.partial(replaced, served, victim), REPLACE_DEADLINE, "a replaced child")
    # The killed child's counts stay in the sums, once.
    for _ in range(8):
        assert counted(scrape(metrics_url)) == expected
    text_cycle(served.url, worker)
    after = {**expected, "pops": 6, "submits": 8, "done": 6}
    for _ in range(4):
        assert counted(scrape(metrics_url)) == after
    assert [p.name.startswith("hordelite-metrics-") for p in temporary.iterdir()] == [True]
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=STOP_DEADLINE) == 0, served.log.read_text()
    assert list(temporary.iterdir()) == []


CHAT_POP = {
    **POP,
    "chat_jobs": True,
    "chat_features": ["prompt_overflow_refused"],
    "chat_limits": {"max_context_length": 4096, "max_length": 512},
    "model_id": MODEL,
}


def test_the_open_streams_of_killed_children_leave_the_gauge(
    postgres_schema_url: str, served: Served
) -> None:
    worker = {"apikey": worker_key(postgres_schema_url)}
    r = httpx.post(f"{served.url}/api/v2/generate/text/pop", headers=worker, json=CHAT_POP)
    assert r.status_code == 200, r.text
    assert r.json()["id"] is None  # the worker is online, with nothing to do
    call = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    gauge = ("hordelite_sse_streams_open", ())
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{served.url}/v1/chat/completions", json=call) as stream,
    ):
        assert stream.status_code == 200  # its headers are out: the stream is open
        assert scrape(served.url)[gauge] == 1
        # Whichever child holds the stream dies.
        victims = served.children()
        for victim in victims:
            os.kill(victim, signal.SIGKILL)
        until(
            lambda: len(served.children()) == 2 and not served.children() & victims,
            REPLACE_DEADLINE,
            "two new children",
        )
    until(lambda: answers_scrape(served.url), REPLACE_DEADLINE, "a scrape answered")
    assert scrape(served.url)[gauge] == 0


def answers_scrape(url: str) -> bool:
    try:
        scrape(url)
    except httpx.TransportError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The serve's start, the lease's 20 s and the margins: past the suite's 60 s
# on a loaded machine.
@pytest.mark.timeout(150)
def test_a_job_popped_before_every_child_was_killed_comes_back_through_its_lease(
    tmp_path: Path, postgres_schema_url: str, redis_url: str, serve: Any
) -> None:
    horde = {"job_ttl": JOB_TTL, "sweep_interval": SWEEP_INTERVAL}
    served = serve(write_config(tmp_path, postgres_schema_url, redis_url, horde=horde))
    worker = {"apikey": worker_key(postgres_schema_url)}
    prompt = f"Leased {uuid.uuid4().hex}"
    errors: list[str] = []

    def no_5xx(response: httpx.Response) -> None:
        if response.status_code >= 500:
            response.read()
            errors.append(f"{response.request.url.path}: {response.status_code} {response.text}")

    # A new connection for each call: the processes behind the port share them.
    with httpx.Client(
        base_url=f"{served.url}/api/v2",
        timeout=10,
        limits=httpx.Limits(max_keepalive_connections=0),
        event_hooks={"response": [no_5xx]},
    ) as client:

        def pop() -> dict[str, Any]:
            r = client.post("/generate/text/pop", headers=worker, json=POP)
            assert r.status_code == 200, r.text
            answer: dict[str, Any] = r.json()
            return answer

        def status() -> dict[str, Any]:
            r = client.get(f"/generate/text/status/{request_id}")
            assert r.status_code == 200, r.text
            answer: dict[str, Any] = r.json()
            return answer

        r = client.post(
            "/generate/text/async",
            headers={"apikey": ANONYMOUS_API_KEY},
            json={"prompt": prompt, "params": {"max_length": 16}, "models": [MODEL]},
        )
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        popped = time.monotonic()  # the lease ends no sooner than JOB_TTL past this
        first = pop()
        assert first["id"] is not None, first
        assert first["payload"]["prompt"] == prompt
        assert first["ttl"] == JOB_TTL
        assert pop()["id"] is None  # the request's one job is leased
        before = status()
        assert (before["processing"], before["waiting"], before["restarted"]) == (1, 0, 0)

        kids = served.children()
        assert len(kids) == 2
        for kid in kids:
            os.kill(kid, signal.SIGKILL)
        until(
            functools.partial(replaced, served, *kids),
            REPLACE_DEADLINE,
            f"two children in place of {sorted(kids)}",
        )
        pops: list[tuple[float, dict[str, Any]]] = []

        def pop_answers() -> bool:
            # A pop is the probe: a heartbeat first, then a pop, would leave
            # a gap in which a loaded machine can let the lease run out.
            try:
                r = client.post("/generate/text/pop", headers=worker, json=POP)
            except httpx.TransportError:
                return False
            if r.status_code != 200:  # a child still starting
                return False
            pops.append((time.monotonic(), r.json()))
            return True

        until(pop_answers, REPLACE_DEADLINE, "the horde answering pops again")
        answered = pops[0][0]
        log = served.log.read_text()
        assert all(f"process {kid} exited with code -9" in log for kid in kids), log
        # Else the pops below would not show whether the new children kept the lease.
        assert answered < popped + JOB_TTL, "the children came back after the lease ended"

        def job_back() -> bool:
            return pop_answers() and pops[-1][1]["id"] is not None

        back_by = max(popped + JOB_TTL, answered) + SWEEP_INTERVAL + LEASE_MARGIN
        if pops[-1][1]["id"] is None:  # else the probe got it: the assertions below fail
            until(job_back, back_by - time.monotonic(), "the leased job back to a pop")
        received, again = pops[-1]
        # While its lease ran the job went to no pop, after the restart too.
        assert received - popped >= JOB_TTL, pops
        assert any(t < popped + JOB_TTL for t, _ in pops), pops  # and one pop saw it hold
        # The same request's job again, as a new job.
        assert again["payload"]["prompt"] == prompt
        assert again["id"] != first["id"]
        assert again["ttl"] == JOB_TTL
        requeued = status()
        assert (requeued["processing"], requeued["waiting"], requeued["restarted"]) == (1, 0, 1)
        assert requeued["done"] is False

        r = client.post(
            "/generate/text/submit",
            headers=worker,
            json={"id": again["id"], "generation": "after the restart", "state": "ok"},
        )
        assert r.status_code == 200, r.text
        done = status()
        assert done["done"] is True, done
        assert (done["finished"], done["restarted"], done["faulted"]) == (1, 1, False)
        assert [g["text"] for g in done["generations"]] == ["after the restart"]
    assert errors == []
    assert served.process.poll() is None


def test_a_child_that_keeps_dying_at_start_is_restarted_after_a_growing_delay(
    served: Served,
) -> None:
    delays = []
    kids = served.children()
    victim = min(kids)
    for _ in range(2):
        os.kill(victim, signal.SIGKILL)
        until(
            functools.partial(replaced, served, victim),
            REPLACE_DEADLINE,
            f"a second child in place of {victim}",
        )
        found = re.search(
            rf"process {victim} exited with code -9 \(SIGKILL\); restarting it in (\S+) s",
            served.log.read_text(),
        )
        assert found, served.log.read_text()
        delays.append(float(found.group(1)))
        # The same slot's new child dies next.
        (victim,) = served.children() - kids
    # Each served well under STABLE_SECONDS: 1 s, then twice that.
    assert delays == [RESTART_DELAY, 2 * RESTART_DELAY]


def test_a_child_killed_before_it_read_its_configuration_is_restarted(served: Served) -> None:
    kids = served.children()
    first = min(kids)
    os.kill(first, signal.SIGKILL)
    # Read /proc without a pause, so that the kill lands while the new child
    # starts, before the parent has sent it its configuration line.
    end = time.monotonic() + REPLACE_DEADLINE
    new: set[int] = set()
    while not new and time.monotonic() < end:
        new = served.children() - kids
    assert new, served.log.read_text()
    (second,) = new
    os.kill(second, signal.SIGKILL)
    until(
        functools.partial(replaced, served, first, second),
        REPLACE_DEADLINE,
        f"a third child in place of {first} and {second}",
    )
    log = served.log.read_text()
    assert f"process {second} exited with code -9 (SIGKILL); restarting it in" in log, log
    assert "Traceback" not in log, log
    assert served.process.poll() is None
    heartbeat(served.url)


def test_SIGTERM_stops_every_child_and_the_parent_exits_0_within_the_grace_period(
    served: Served,
) -> None:
    kids = served.children()
    assert len(kids) == 2
    heartbeat(served.url)
    stopping = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=STOP_DEADLINE) == 0, served.log.read_text()
    assert time.monotonic() - stopping < GRACE_PERIOD + STOP_MARGIN
    assert not any(alive(kid) for kid in kids)
    assert "hordelite: SIGTERM, stopping 2 processes" in served.rest_of_output()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{served.url}/api/v2/status/heartbeat", timeout=5)


def test_children_stop_when_the_parent_is_killed_with_SIGKILL(served: Served) -> None:
    kids = served.children()
    assert len(kids) == 2
    served.process.kill()
    served.process.wait()
    until(
        lambda: not any(alive(kid) for kid in kids),
        STOP_DEADLINE,
        f"children {sorted(kids)} stopping after their parent",
    )


# Refusals ----------------------------------------------------------------------------


def refused_at_start(config: Path, cwd: Path, code: int) -> str:
    """The one stderr line of a ``serve`` that exits ``code`` at start,
    nothing on stdout (no banner: it never served)."""
    done = run_hordelite("--config", str(config), "serve", cwd=cwd, timeout=START_DEADLINE)
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""
    return done.stderr


def refused_line(tmp_path: Path, config: Path) -> str:
    """The one stderr line of a ``serve`` refused for its processes before
    anything is bound: exit 2, nothing on stdout, no "in use" (the taken
    port was never tried)."""
    line = refused_at_start(config, tmp_path, 2)
    assert "server.processes" in line
    assert "in use" not in line
    return line


def schema_tables(postgres_url: str, database: str) -> list[str]:
    schema = re.search(r"search_path%3D(\w+)", database)
    assert schema, database
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema.group(1),),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on: a serve that bound it first would
    fail with "in use" (exit 1), not with its refusal."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_several_processes_on_SQLite_are_refused_in_one_line_before_anything_is_bound(
    tmp_path: Path, redis_url: str, taken_port: int
) -> None:
    db = tmp_path / "horde.db"
    line = refused_line(tmp_path, write_config(tmp_path, str(db), redis_url, port=taken_port))
    assert "PostgreSQL" in line
    assert "storage.database" in line
    assert "signals.url" not in line  # it is set
    assert not db.exists()


def test_several_processes_without_a_signals_url_are_refused_in_one_line_before_anything_is_bound(
    tmp_path: Path, postgres_url: str, postgres_schema_url: str, taken_port: int
) -> None:
    config = write_config(tmp_path, postgres_schema_url, "", port=taken_port)
    line = refused_line(tmp_path, config)
    assert "signals.url" in line
    assert "redis://" in line
    assert "storage.database" not in line  # it is PostgreSQL
    assert schema_tables(postgres_url, postgres_schema_url) == []  # not migrated


def test_the_processes_option_is_refused_the_same_way_naming_both_requirements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./hordelite.toml of the checkout
    for name in list(os.environ):
        if name.startswith("HORDELITE_") and not name.startswith("HORDELITE_TEST_"):
            monkeypatch.delenv(name)
    db = tmp_path / "horde.db"
    assert main(["serve", "--processes", "3", "--database", str(db)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert "server.processes: 3 processes need" in err
    assert "storage.database" in err
    assert "signals.url" in err
    assert out == ""
    assert not db.exists()


def serve_refused_in_use(config: Path) -> str:
    """The one stderr line of a ``serve`` whose port is held: exit 1,
    nothing on stdout (no banner: it never served)."""
    line = refused_at_start(config, config.parent, 1)
    assert "in use" in line
    assert "Traceback" not in line
    return line


@pytest.mark.parametrize("processes", [2, 1])
def test_a_second_horde_on_a_port_another_horde_serves_is_refused_at_start(
    tmp_path: Path, postgres_schema_url: str, redis_url: str, serve: Any, processes: int
) -> None:
    # Each process of a horde binds the port with SO_REUSEPORT, which
    # another horde's SO_REUSEPORT sockets would join: the kernel then
    # spread the connections over both hordes.
    first = serve(write_config(tmp_path, postgres_schema_url, redis_url))
    port = int(first.url.rsplit(":", 1)[1])
    second = tmp_path / "second"
    second.mkdir()
    config = write_config(second, postgres_schema_url, redis_url, processes=processes, port=port)
    line = serve_refused_in_use(config)
    assert f"127.0.0.1:{port}" in line
    assert "--port" in line
    # The first horde's processes still share the port and answer.
    with httpx.Client(timeout=10) as client:
        for _ in range(4):
            assert client.get(f"{first.url}/api/v2/status/heartbeat").status_code == 200
    assert len(first.children()) == 2


def test_a_metrics_port_held_by_another_program_is_refused_at_start_naming_it(
    tmp_path: Path, postgres_schema_url: str, redis_url: str, taken_port: int
) -> None:
    config = write_config(tmp_path, postgres_schema_url, redis_url)
    config.write_text(config.read_text() + f"[metrics]\nport = {taken_port}\n")
    line = serve_refused_in_use(config)
    assert f"127.0.0.1:{taken_port}" in line
    assert "metrics.port" in line


# The sweep lock ----------------------------------------------------------------------


@pytest.fixture
def migrated(postgres_schema_url: str) -> Iterator[tuple[Database, queries.Rules]]:
    db = Database(postgres_schema_url, 3)
    try:
        horde = Horde(Config(), db)
        horde.migrate()
        yield db, horde.rules
    finally:
        db.dispose()


def sweep_lock_waiters(postgres_url: str) -> int:
    """Transactions waiting for the sweep lock (of any schema)."""
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = %s",
            (SWEEP_LOCK_KEY,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_two_sweeps_at_once_on_PostgreSQL_do_not_both_run(
    migrated: tuple[Database, queries.Rules], postgres_url: str
) -> None:
    db, rules = migrated
    sweeping = threading.Event()
    finish = threading.Event()
    results: dict[str, queries.SweepResult] = {}

    def held_sweep(conn: Any) -> queries.SweepResult:
        result = queries.sweep(conn, time.time(), rules)
        sweeping.set()
        assert finish.wait(timeout=30)  # the transaction, and its lock, stay open
        return result

    def run(name: str, fn: Any, *args: Any, **kwargs: Any) -> threading.Thread:
        def target() -> None:
            results[name] = db.run_sync(fn, True, *args, **kwargs)

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    first = run("first", held_sweep)
    try:
        assert sweeping.wait(timeout=30)
        # A second sweep meanwhile skips its round at once.
        second = db.run_sync(queries.sweep, True, time.time(), rules)
        assert second.skipped
        # One that waits (TestHorde.sweep) waits for the first to commit.
        waiting = run("waiting", queries.sweep, time.time(), rules, wait=True)
        until(lambda: sweep_lock_waiters(postgres_url) >= 1, 10.0, "the waiting sweep queued")
        assert "waiting" not in results
    finally:
        finish.set()
        first.join(timeout=30)
    waiting.join(timeout=30)
    assert not results["first"].skipped
    assert not results["waiting"].skipped
    # The lock ends with its transaction: the next sweep runs.
    assert not db.run_sync(queries.sweep, True, time.time(), rules).skipped
