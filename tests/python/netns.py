"""Network namespaces the cluster tests make themselves, to cut links between nodes.

Layout (all on this machine; nothing leaves it):

    test process (this namespace) 10.213.X.254 ── veth ──┐
                                                          hub namespace: bridge
    node N (namespace weir-T-N)   10.213.X.N   ── veth ──┘

Each node runs in its own namespace (`ip netns exec`) and listens on its own address, so clients
in this namespace reach every node through the hub's bridge. The bridge lives in a namespace of
its own, whose empty firewall forwards everything whatever this machine's firewall does with
bridged traffic. `isolate(a, [b, c])` adds blackhole routes in a's namespace and in b's and
c's, so that a and the others cannot reach each other (sends fail at once) while clients still
reach all of them; `heal()` removes them.

Needs root (CAP_NET_ADMIN) and iproute2's `ip`; `unavailable()` says why not, and the tests
skip with that reason.
"""

import os
import shutil
import socket
import subprocess
import threading


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def unavailable():
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"weir-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Network:
    """Namespaces for nodes 1..count and the hub; `close()` removes them all."""

    def __init__(self, count):
        self.tag = f"{os.getpid() % 100000}"
        self.subnet = f"10.213.{20 + os.getpid() % 200}"
        self.hub = f"weir-{self.tag}-hub"
        self.count = count
        self.namespaces = {i: f"weir-{self.tag}-{i}" for i in range(1, count + 1)}
        self.routes = []  # (namespace, address) blackholes in place
        self.uplink = f"wr{self.tag}"
        try:
            self._build()
        except Exception:
            self.close()
            raise

    def _build(self):
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("-n", self.hub, "link", "set", "lo", "up")
        # This namespace's end of the uplink.
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "dev", "uplink", "master", "br0", "up")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")
        for i, ns in self.namespaces.items():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"n{i}", "netns", self.hub)
            _ip("-n", self.hub, "link", "set", "dev", f"n{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def address(self, node_id):
        return f"{self.subnet}.{node_id}"

    def exec_prefix(self, node_id):
        return ["ip", "netns", "exec", self.namespaces[node_id]]

    def check_reachable(self, timeout=5.0):
        """Asserts that this namespace reaches an address in node 1's namespace (a listener
        started there for the purpose)."""
        port = 19091
        server = subprocess.Popen(
            self.exec_prefix(1)
            + [
                "python3",
                "-c",
                "import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                f"s.bind(('{self.address(1)}',{port}));s.listen();print('up',flush=True);s.settimeout({timeout});"
                "c,_=s.accept();c.close()",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            ready = threading.Event()
            threading.Thread(target=lambda: (server.stdout.readline(), ready.set()), daemon=True).start()
            assert ready.wait(timeout), "the probe listener did not start in the namespace"
            with socket.create_connection((self.address(1), port), timeout=timeout):
                pass
        finally:
            server.kill()
            server.wait()

    def isolate(self, node_id, others):
        """Cuts `node_id` off from each of `others`, both ways; clients still reach every node."""
        for other in others:
            for ns, address in ((self.namespaces[node_id], self.address(other)),
                                (self.namespaces[other], self.address(node_id))):
                _ip("-n", ns, "route", "add", "blackhole", f"{address}/32")
                self.routes.append((ns, address))

    def heal(self):
        for ns, address in self.routes:
            _ip("-n", ns, "route", "del", "blackhole", f"{address}/32", check=False)
        self.routes = []

    def close(self):
        self.heal()
        _ip("link", "del", self.uplink, check=False)
        for ns in list(self.namespaces.values()) + [self.hub]:
            _ip("netns", "del", ns, check=False)
