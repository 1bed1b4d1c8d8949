"""Fixtures for Weir's client-compatibility tests.

Every test talks to a real `weir server` process through real clients (confluent-kafka, which is
librdkafka, kafka-python and kcat). The binary is `target/debug/weir` unless WEIR_BIN says
otherwise. Most tests share one broker for the whole session and use topic and group names of
their own (see `unique`); tests that kill or restart the broker get a fresh one.

When a test fails, the lines the broker(s) wrote to stderr during that test are attached to the
failure report. Cluster tests run several brokers as one cluster (cluster.py, the
`cluster_factory` and `cluster` fixtures); their nodes' logs are attached the same way.
"""

import atexit
import os
import pathlib
import random
import re
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


_HANDED_OUT_PORTS = set()


def _ports_to_hand_out():
    """Ports below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), in an order that
    starts at a random place. A port handed out is bound by its broker only a moment later, and
    meanwhile any outgoing connection on the machine (a client's, or a cluster node's to its
    peers) may take an ephemeral port as its own source port: the broker then fails to start
    with "address in use". Connections never take a port below the range. None when the range
    leaves too little room below it; then the kernel picks (port 0)."""
    try:
        low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    first = 20_000
    if low - first < 2_000:
        return None
    start = random.randrange(first, low)
    return list(range(start, low)) + list(range(first, start))


_PORT_CANDIDATES = _ports_to_hand_out()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now, and never handed out before in
    this run: a broker's ports are chosen before it binds them, so a port given to one broker but
    not bound yet must not go to another (a cluster node once got another's RocketMQ port)."""
    for port in _PORT_CANDIDATES or ():
        if port in _HANDED_OUT_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT_PORTS.add(port)
        return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT_PORTS:
            _HANDED_OUT_PORTS.add(port)
            return port


def broker_env():
    """The broker reads WEIR_* variables as settings (WEIR_LOG_RETENTION_MS...): pass none of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    # A panic prints its backtrace; an error that ends the process prints only its message
    # (anyhow captures a backtrace by RUST_LIB_BACKTRACE, else by RUST_BACKTRACE), so the
    # message is what a log's tail shows.
    env["RUST_BACKTRACE"] = "1"
    env["RUST_LIB_BACKTRACE"] = "0"
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
        # A fixed port of its own for the RocketMQ listener: clients reconnect to the same
        # endpoint after a restart.
        self.rocketmq_port = free_port()
        self.settings["rocketmq.listeners"] = f"127.0.0.1:{self.rocketmq_port}"
        self.settings.update(settings or {})
        self.port = free_port()
        self.proc = None
        self.starts = 0
        self.paused = False
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
    def rocketmq_endpoint(self):
        """Where RocketMQ 5 clients reach this broker (their `endpoints`)."""
        return f"{self.host}:{self.rocketmq_port}"

    def admin_url(self, timeout=10.0):
        """The admin HTTP API (admin.listeners=127.0.0.1:0), from the line the broker printed at
        its last start. A start returns once the Kafka listener accepts connections; the admin
        line may come a moment later, so it is waited for."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_path.read_text(errors="replace")
            starts = text.split("=== test harness: start")
            urls = re.findall(r"^admin (https?://\S+) \(JSON API", starts[-1] if len(starts) > 1 else text, re.M)
            if urls:
                return urls[-1]
            assert time.monotonic() < deadline and self.alive(), f"{self} printed no admin line"
            time.sleep(0.05)

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    # -- lifecycle -------------------------------------------------------------------------
    def command(self):
        cmd = [str(weir_bin()), "server", "--data-dir", str(self.data_dir)]
        # A cluster node names its listeners itself (PLAINTEXT and CONTROLLER, see cluster.py);
        # its PLAINTEXT port is still self.port.
        if "listeners" not in self.settings:
            cmd += ["--listen", self.bootstrap]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, wait=True):
        """Starts the process; with wait, returns once it accepts connections (see wait_ready).

        A cluster node accepts connections only once the controller has unfenced it, which
        needs a majority of the voters: start them all with wait=False, then wait for each.
        """
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
        if wait:
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

    def pause(self):
        """SIGSTOP: the process is frozen (no heartbeat, no answer) but keeps its sockets open."""
        assert self.alive(), f"{self.name} is not running\n{self.tail()}"
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        with open(self.log_path, "ab") as log:
            log.write(b"=== test harness: sent SIGSTOP\n")

    def resume(self):
        """SIGCONT after pause (nothing if not paused)."""
        if self.paused and self.alive():
            with open(self.log_path, "ab") as log:
                log.write(b"=== test harness: sent SIGCONT\n")
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

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
        """The end of the log, after the lines that say why a process ended (an error or a
        panic), which a long backtrace could push out of the tail."""
        text = self.log_since(max(0, self.log_size() - chars))
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        why = []
        for i, line in enumerate(lines):
            if line.startswith("Error: "):
                why.append(line)
            elif " panicked at " in line:
                # The panic's message is on the next line.
                why.extend(lines[i : i + 2])
        head = "".join(f"{line}\n" for line in why[-6:] if line not in text)
        return f"--- {self.log_path} (tail) ---\n{head}{text}"

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
def cluster_factory(tmp_path):
    """Makes clusters of `weir` processes (cluster.py), started and formed unless start=False;
    every node is killed at the end of the test and its log attached to a failure report."""
    from cluster import Cluster  # cluster.py imports this module: not at the top

    made = []

    def make(voters=3, brokers=0, settings=None, start=True, controller_only=False, network=None):
        c = Cluster(
            tmp_path / f"cluster{len(made)}",
            voters=voters,
            brokers=brokers,
            settings=settings,
            controller_only=controller_only,
            network=network,
        )
        made.append(c)
        _ALL_BROKERS.extend(c.nodes.values())
        if start:
            c.start()
            c.wait_formed()
        return c

    yield make
    for c in made:
        c.cleanup()
        for node in c.nodes.values():
            _ALL_BROKERS.remove(node)
        if os.environ.get("WEIR_KEEP_DATA") is None:
            shutil.rmtree(c.root, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Three combined nodes shared by a module's tests that leave the cluster as they found it."""
    from cluster import Cluster

    c = Cluster(tmp_path_factory.mktemp("weir-cluster"))
    _ALL_BROKERS.extend(c.nodes.values())
    try:
        c.start()
        c.wait_formed()
        yield c
        codes = c.stop()
        assert all(code == 0 for code in codes.values()), f"exit codes after SIGTERM: {codes}"
    finally:
        c.cleanup()
        for node in c.nodes.values():
            _ALL_BROKERS.remove(node)


@pytest.fixture
def cluster(shared_cluster):
    """The module's shared cluster; fails the test if a node died during it."""
    dead = [n for n in shared_cluster.nodes.values() if not n.alive()]
    if dead:
        pytest.fail(f"shared cluster nodes died before this test: {dead}")
    yield shared_cluster
    dead = [n for n in shared_cluster.nodes.values() if not n.alive()]
    if dead:
        pytest.fail(f"nodes exited during this test: {dead}\n" + "\n".join(n.tail() for n in dead))


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
