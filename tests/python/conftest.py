"""Fixtures for Weir's client-compatibility tests.

Every test talks to a real `weir server` process through real clients (confluent-kafka, which is
librdkafka, kafka-python and kcat). The binary is `target/debug/weir` unless WEIR_BIN says
otherwise. Most tests share one broker for the whole session and use topic and group names of
their own (see `unique`); tests that kill or restart the broker get a fresh one.

When a test fails, the lines the broker(s) wrote to stderr during that test are attached to the
failure report.
"""

import atexit
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

import pytest

from helpers import close_quietly

REPO = pathlib.Path(__file__).resolve().parents[2]

# Settings every broker of the suite starts with; a test may add or override some.
# Several brokers run at once: each takes a free admin port rather than the fixed default.
DEFAULT_SETTINGS = {"group.initial.rebalance.delay.ms": "0", "admin.listeners": "127.0.0.1:0"}

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 20_000

_LIVE_PROCESSES = set()


def weir_bin():
    return pathlib.Path(os.environ.get("WEIR_BIN") or REPO / "target" / "debug" / "weir").resolve()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_env():
    """The broker reads WEIR_* variables as settings (WEIR_LOG_RETENTION_MS...): pass none of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    env["RUST_BACKTRACE"] = "1"
    return env


class BrokerError(AssertionError):
    pass


class Broker:
    """One `weir server` process on 127.0.0.1, its data directory and its stderr log.

    start/stop/kill9/restart keep the same port and data directory, so clients reconnect to the
    same bootstrap address and a restart recovers what the previous process wrote.
    """

    def __init__(self, workdir, settings=None, name="weir"):
        self.workdir = pathlib.Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{name}.stderr.log"
        self.name = name
        self.settings = dict(DEFAULT_SETTINGS)
        self.settings.update(settings or {})
        self.port = free_port()
        self.proc = None
        self.starts = 0
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()

    # -- addresses -------------------------------------------------------------------------
    @property
    def host(self):
        return "127.0.0.1"

    @property
    def bootstrap(self):
        return f"{self.host}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    # -- lifecycle -------------------------------------------------------------------------
    def command(self):
        cmd = [str(weir_bin()), "server", "--listen", self.bootstrap, "--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self):
        assert not self.alive(), "broker already running"
        binary = weir_bin()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            pytest.exit(f"weir binary not found at {binary} (build it, or set WEIR_BIN)", returncode=3)
        self.starts += 1
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"=== test harness: start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env=broker_env(),
            )
        _LIVE_PROCESSES.add(self.proc)
        self.wait_ready()
        return self

    def wait_ready(self, timeout=READY_TIMEOUT_S):
        """Polls a TCP connect to the port until it succeeds; fails if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise BrokerError(
                    f"{self.name} exited with code {code} before accepting connections\n{self.tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"{self.name} did not accept connections on {self.bootstrap} within {timeout}s\n{self.tail()}"
                )
            time.sleep(0.05)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM and wait; returns the exit code. Kills (and fails) if it does not exit in time."""
        if self.proc is None:
            return None
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                _LIVE_PROCESSES.discard(proc)
                raise BrokerError(f"{self.name} did not exit within {timeout}s of SIGTERM\n{self.tail()}")
        _LIVE_PROCESSES.discard(proc)
        return proc.returncode

    def kill9(self):
        """SIGKILL, as a crash or power cut would: no chance to flush or close anything."""
        assert self.alive(), f"{self.name} is not running\n{self.tail()}"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        _LIVE_PROCESSES.discard(self.proc)
        with open(self.log_path, "ab") as log:
            log.write(b"=== test harness: sent SIGKILL\n")

    def restart(self):
        if self.alive():
            self.stop()
        return self.start()

    def cleanup(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            _LIVE_PROCESSES.discard(self.proc)

    # -- logs ------------------------------------------------------------------------------
    def log_size(self):
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset):
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            data = f.read()
        text = data.decode("utf-8", errors="replace")
        if len(text) > LOG_TAIL_CHARS:
            text = f"[... {len(text) - LOG_TAIL_CHARS} characters cut ...]\n" + text[-LOG_TAIL_CHARS:]
        return text

    def tail(self, chars=4000):
        text = self.log_since(max(0, self.log_size() - chars))
        return f"--- {self.log_path} (tail) ---\n{text}"

    def __repr__(self):
        return f"Broker({self.name}, {self.bootstrap}, pid={self.pid})"


@atexit.register
def _kill_leftovers():
    for proc in list(_LIVE_PROCESSES):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- report broker logs on failure -------------------------------------------------------------

_ALL_BROKERS = []
_LOG_MARKS = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    marks = item.stash.get(_LOG_MARKS, {})
    for broker in _ALL_BROKERS:
        start = marks.get(id(broker), 0)
        if broker.log_size() <= start:
            continue
        report.sections.append(
            (f"weir stderr: {broker.name} {broker.bootstrap} ({broker.log_path})", broker.log_since(start))
        )


@pytest.fixture(autouse=True)
def _mark_broker_logs(request):
    request.node.stash[_LOG_MARKS] = {id(b): b.log_size() for b in _ALL_BROKERS}
    yield


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("weir-shared"), name="shared")
    _ALL_BROKERS.append(broker)
    broker.start()
    yield broker
    alive = broker.alive()
    code = broker.stop()
    if alive and code != 0:
        pytest.fail(f"shared broker exited with code {code} after SIGTERM (expected 0)\n{broker.tail()}")


@pytest.fixture
def broker(shared_broker):
    """The session's shared broker, (re)started if an earlier test left it dead."""
    if not shared_broker.alive():
        shared_broker.start()
    yield shared_broker
    if not shared_broker.alive():
        pytest.fail(
            f"the shared broker exited (code {shared_broker.proc.returncode}) during this test\n"
            f"{shared_broker.tail()}"
        )


@pytest.fixture
def broker_factory(tmp_path):
    """Makes fresh brokers (own port and data dir); all are killed at the end of the test."""
    made = []

    def make(settings=None, name=None):
        name = name or f"fresh{len(made)}"
        b = Broker(tmp_path / name, settings=settings, name=name)
        _ALL_BROKERS.append(b)
        made.append(b)
        return b.start()

    yield make
    for b in made:
        b.cleanup()
        _ALL_BROKERS.remove(b)
    if os.environ.get("WEIR_KEEP_DATA") is None:
        for b in made:
            shutil.rmtree(b.data_dir, ignore_errors=True)


@pytest.fixture
def fresh_broker(broker_factory):
    return broker_factory()


@pytest.fixture
def closer():
    """Collects clients to close at the end of the test, even when it fails."""
    clients = []

    class Closer:
        def add(self, client):
            clients.append(client)
            return client

    yield Closer()
    for client in reversed(clients):
        close_quietly(client)
