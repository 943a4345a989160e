"""``hordelite serve --processes N``: one port, N serving processes.

The parent binds one SO_REUSEPORT socket per child on the port and migrates
the database once, then starts N children (``python -m hordelite serve
--socket-fd S --control-fd C``), each a whole horde (native API, front,
timers) on its inherited socket; the kernel hands each new connection to
one of them. The parent serves nothing itself: it
prints the banner once every child serves, restarts a child that dies, and
on SIGINT/SIGTERM stops them all (decision 0040).

Each child has a socket pair to the parent, its control socket: the parent
sends the configuration on it (one JSON line, so that a database password
never shows on a command line), the child answers ``ready`` once it serves,
and the child watches it for end of file: a parent that is gone, even
killed with SIGKILL, closes its end, and the child then stops as at SIGTERM.

The parent also makes the children's metrics directory (decision 0043):
each child keeps its counters in files there, and a scrape of any child
reads them all; a dead child's open-stream gauge is dropped
(``mark_process_dead``), its counts stay. The directory goes at the stop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from types import FrameType

import anyio
from prometheus_client import multiprocess

from hordelite.config import Config, build_config
from hordelite.horde.metrics import MULTIPROCESS_ENV
from hordelite.server import open_server

log = logging.getLogger("hordelite")

# What a child sends on its control socket once it serves.
READY = b"ready\n"
# A child that dies before it served, or within this many seconds of it,
# "keeps dying at start": it is restarted after a delay that starts at
# RESTART_DELAY and doubles, up to RESTART_DELAY_MAX. One that served
# longer is restarted at once.
STABLE_SECONDS = 10.0
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 30.0
# Seconds past server.grace_period a stopping parent waits for its children
# (each stops its timers and closes its database after its HTTP drain)
# before it kills what is left.
STOP_MARGIN = 5.0
# The most a configuration line may take (it is a few kilobytes).
_MAX_CONFIG_BYTES = 1024 * 1024


# The parent -------------------------------------------------------------------


@dataclasses.dataclass
class _Child:
    slot: int
    process: subprocess.Popen[bytes]
    control: socket.socket
    ready_at: float | None = None


class Supervisor:
    """Starts, watches and stops the serving processes of one port: the
    child of each slot serves that slot's socket (all bound to the port)."""

    def __init__(self, config: Config, socks: list[socket.socket]) -> None:
        self.config = config
        self.socks = socks
        self._config_line = json.dumps(dataclasses.asdict(config)).encode() + b"\n"
        self._children: dict[int, _Child] = {}  # by slot
        self._failures = [0] * config.server.processes  # by slot: quick deaths in a row
        self._restart_at: dict[int, float] = {}  # slot: when its child is started again
        self._selector = selectors.DefaultSelector()
        self._stop_signal: int | None = None
        self._serving = False  # every first child served: the banner is out
        self._metrics_dir = ""  # made by run

    def run(self, banner: list[str]) -> int:
        """Serve until SIGINT or SIGTERM; 0 after a clean stop, 1 when the
        children could not all start or had to be killed."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
        }
        # Every signal also writes a byte here, so that a select wakes at once.
        previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        self._selector.register(wake_read, selectors.EVENT_READ, None)
        self._metrics_dir = tempfile.mkdtemp(prefix="hordelite-metrics-")
        try:
            for slot in range(self.config.server.processes):
                self._start(slot)
            failed = self._supervise(banner)
            clean = self._stop()
            return 0 if clean and not failed else 1
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._selector.close()
            os.close(wake_read)
            os.close(wake_write)
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD and self._stop_signal is None:
            self._stop_signal = signum

    def _start(self, slot: int) -> None:
        parent_end, child_end = socket.socketpair()
        with child_end:
            fds = (self.socks[slot].fileno(), child_end.fileno())
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "hordelite", "serve"),
                    *("--socket-fd", str(fds[0]), "--control-fd", str(fds[1])),
                    *("--slot", str(slot)),
                ],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                env={**os.environ, MULTIPROCESS_ENV: self._metrics_dir},
                # Its own process group: a Ctrl+C in the terminal reaches the
                # parent alone, which stops the children in order.
                process_group=0,
            )
        try:
            parent_end.sendall(self._config_line)
        except OSError:
            # It died before it read a byte (a kill that lands at its start):
            # its exit comes with SIGCHLD and is restarted as any other.
            pass
        parent_end.setblocking(False)
        child = _Child(slot, process, parent_end)
        self._children[slot] = child
        self._selector.register(parent_end, selectors.EVENT_READ, child)

    def _supervise(self, banner: list[str]) -> bool:
        """Until a stop signal: True when a child died before every first
        child served (a fault to show, not to retry: the parent stops), else
        False."""
        while self._stop_signal is None:
            timeout = None
            if self._restart_at:
                timeout = max(0.0, min(self._restart_at.values()) - time.monotonic())
            self._wait(timeout)
            if self._stop_signal is not None:
                break
            for child in list(self._children.values()):
                code = child.process.poll()
                if code is None:
                    continue
                self._forget(child)
                if not self._serving:
                    log.error(
                        "process %d exited with code %s before the horde served; stopping",
                        child.process.pid,
                        _code(code),
                    )
                    return True
                self._schedule_restart(child, code)
            now = time.monotonic()
            for slot, at in list(self._restart_at.items()):
                if at <= now:
                    del self._restart_at[slot]
                    self._start(slot)
            if not self._serving and all(c.ready_at for c in self._children.values()):
                self._serving = True
                for line in banner:
                    print(line, flush=True)
        return False

    def _wait(self, timeout: float | None) -> None:
        """Until a signal (a child's exit included), a control socket's
        message or end, or ``timeout``; reads what woke it."""
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                _drain(key.fd)
            else:
                self._read_control(key.data)

    def _read_control(self, child: _Child) -> None:
        try:
            data = child.control.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data.startswith(READY.strip()) and child.ready_at is None:
            child.ready_at = time.monotonic()
        if not data:  # the child is exiting: its exit is read from SIGCHLD
            self._selector.unregister(child.control)

    def _forget(self, child: _Child) -> None:
        del self._children[child.slot]
        # Its open streams are gone; its counts stay in the sums.
        multiprocess.mark_process_dead(child.process.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
        if _registered(self._selector, child.control):
            self._selector.unregister(child.control)
        child.control.close()

    def _schedule_restart(self, child: _Child, code: int) -> None:
        served = 0.0 if child.ready_at is None else time.monotonic() - child.ready_at
        if served >= STABLE_SECONDS:
            self._failures[child.slot] = 0
            delay = 0.0
        else:
            self._failures[child.slot] += 1
            delay = min(RESTART_DELAY * 2 ** (self._failures[child.slot] - 1), RESTART_DELAY_MAX)
        log.warning(
            "process %d exited with code %s; restarting it in %g s",
            child.process.pid,
            _code(code),
            delay,
        )
        self._restart_at[child.slot] = time.monotonic() + delay

    def _stop(self) -> bool:
        """SIGTERM to every child, SIGKILL past the grace period and margin;
        True when every child stopped by itself."""
        self._restart_at.clear()
        if self._stop_signal is not None:
            name = signal.Signals(self._stop_signal).name
            print(f"hordelite: {name}, stopping {len(self._children)} processes", flush=True)
        for child in self._children.values():
            _signal(child.process, signal.SIGTERM)
        deadline = time.monotonic() + self.config.server.grace_period + STOP_MARGIN
        while self._children and time.monotonic() < deadline:
            # SIGCHLD, or a child closing its control socket, wakes this.
            self._wait(max(0.0, deadline - time.monotonic()))
            for child in list(self._children.values()):
                if child.process.poll() is not None:
                    self._forget(child)
        clean = not self._children
        for child in list(self._children.values()):
            log.error("process %d did not stop in time: killed", child.process.pid)
            _signal(child.process, signal.SIGKILL)
            child.process.wait()
            self._forget(child)
        return clean


def _registered(selector: selectors.BaseSelector, sock: socket.socket) -> bool:
    try:
        selector.get_key(sock)
    except KeyError:
        return False
    return True


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:  # it died meanwhile
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _code(code: int) -> str:
    """An exit code as the log says it: a signal by its name."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


# A child ------------------------------------------------------------------------


def serve_child(socket_fd: int, control_fd: int, slot: int = 0) -> int:
    """Serve the inherited listening socket as one whole horde until SIGINT,
    SIGTERM or the parent's end; no banner, no migration (the parent did both)."""
    control = socket.socket(fileno=control_fd)
    line = _read_line(control)
    if line is None:
        return 1  # the parent was gone before it said anything
    config = build_config(json.loads(line))
    sock = socket.socket(fileno=socket_fd)
    sock.setblocking(False)
    watcher = threading.Thread(
        target=_stop_when_parent_ends, args=(control.dup(),), name="parent-watch", daemon=True
    )
    watcher.start()
    anyio.run(_run_child, config, sock, control, slot, backend=config.server.backend)
    return 0


def _read_line(control: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = control.recv(65536)
        if not chunk or len(data) > _MAX_CONFIG_BYTES:
            return None
        data += chunk
    return data


def _stop_when_parent_ends(control: socket.socket) -> None:
    """The parent never writes again after the configuration: the end of
    file comes when it closes its end, or when it is gone however it died."""
    try:
        while control.recv(64):
            pass
    except OSError:
        pass
    log.warning("the supervising process is gone: stopping")
    os.kill(os.getpid(), signal.SIGTERM)


async def _run_child(
    config: Config, sock: socket.socket, control: socket.socket, slot: int
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_server(config, sock=sock, migrate=False, slot=slot):
            control.sendall(READY)
            async for _ in signals:
                break
