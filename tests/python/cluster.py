"""A Weir cluster of real `weir server` processes on 127.0.0.1 (or each in a network namespace
of its own, see netns.py), for the cluster tests.

Each node is a `Broker` (conftest.py) with a node id, a CONTROLLER port and the cluster
settings: `--set listeners=PLAINTEXT://127.0.0.1:P,CONTROLLER://127.0.0.1:C` instead of
`--listen`, the same `controller.quorum.voters` on every node, and short timings so that faults
show within seconds. Node ids are 1..voters for the voters (`process.roles=broker,controller`),
then the broker-only nodes.

A node accepts Kafka connections only once the controller has unfenced it, which needs a
majority of the voters: `start` launches every process first and then waits for each.

`RawClient` speaks the Kafka protocol (kafka-python's message classes) over one connection to
one node. The client libraries send a request to whichever broker they choose (Metadata to any,
CreateTopics to the controller), so when a test must ask a given node (what does node 2's
Metadata say? is a CreateTopics through a non-controller forwarded?), it uses this.
"""

import json
import pathlib
import socket
import subprocess
import time
from typing import Dict, NamedTuple, Optional, Tuple

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.parser import KafkaProtocol

from conftest import READY_TIMEOUT_S, Broker, broker_env, free_port, weir_bin

# Short timings: a fault shows within a few seconds, yet a busy 2-core machine (several
# debug-build nodes and the clients) does not miss heartbeats or elections by accident.
HEARTBEAT_MS = 200
SESSION_TIMEOUT_MS = 2000
ELECTION_TIMEOUT_MS = 600
REQUEST_TIMEOUT_MS = 2000

CLUSTER_SETTINGS = {
    "broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
    "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "controller.quorum.election.timeout.ms": str(ELECTION_TIMEOUT_MS),
    "controller.quorum.request.timeout.ms": str(REQUEST_TIMEOUT_MS),
    # Few enough to create quickly, enough to spread the groups' coordinators over the brokers.
    "offsets.topic.num.partitions": "6",
}

# Kafka error codes the tests look for.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
REQUEST_TIMED_OUT = 7
NOT_CONTROLLER = 41

NO_LEADER = -1
# DescribeConfigs/AlterConfigs resource type of a topic.
TOPIC_RESOURCE = 2


class Node(Broker):
    """One node of a cluster: a Broker with a node id and a CONTROLLER listener. A
    controller-only node has no Kafka listener: its `port` is then the CONTROLLER port (what
    start() waits for), and it is no bootstrap address."""

    def __init__(self, workdir, node_id, controller_port, voters, roles, settings=None, host=None, prefix=()):
        merged = dict(CLUSTER_SETTINGS)
        merged.update(settings or {})
        # Set before Broker.__init__: the listeners below are built from the host.
        self._host = host or "127.0.0.1"
        self.prefix = list(prefix)
        super().__init__(workdir, settings=merged, name=f"node{node_id}")
        self.node_id = node_id
        self.controller_port = controller_port
        self.roles = roles
        self.settings.update(
            {
                "node.id": str(node_id),
                "process.roles": roles,
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{controller_port}",
            }
        )
        if not self.broker:
            self.port = controller_port
            self.settings["listeners"] = f"CONTROLLER://{self.host}:{controller_port}"

    @property
    def host(self):
        """127.0.0.1, or the node's address in its network namespace (netns.py)."""
        return self._host

    def command(self):
        """The broker's command, run through `prefix` (`ip netns exec NS`) when there is one."""
        return self.prefix + super().command()

    @property
    def voter(self):
        return "controller" in self.roles

    @property
    def broker(self):
        return "broker" in self.roles

    def __repr__(self):
        return f"Node({self.node_id}, {self.bootstrap}, roles={self.roles}, pid={self.pid})"


class PartitionView(NamedTuple):
    leader: int
    error_code: int


class TopicView(NamedTuple):
    error_code: int
    partitions: Dict[int, PartitionView]

    def leaders(self):
        return {p: v.leader for p, v in sorted(self.partitions.items())}


class MetadataView(NamedTuple):
    """One node's Metadata answer."""

    brokers: Dict[int, Tuple[str, int]]
    controller_id: int
    cluster_id: Optional[str]
    topics: Dict[str, TopicView]


class RawClient:
    """One connection to one node; every request waits for its response, bounded by timeout."""

    def __init__(self, node, timeout=10.0):
        self.node = node
        self.sock = socket.create_connection((node.host, node.port), timeout=timeout)
        self.protocol = KafkaProtocol(client_id="weir-cluster-test")

    def request(self, request, timeout=10.0):
        self.protocol.send_request(request)
        self.sock.sendall(self.protocol.send_bytes())
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer from {self.node} within {timeout}s to {type(request).__name__}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            if not data:
                raise ConnectionError(f"{self.node} closed the connection")
            responses = self.protocol.receive_bytes(data)
            if responses:
                return responses[0][1]

    def metadata(self, topics=None, timeout=10.0):
        """Metadata v5 without auto-creation: topics=None means every topic."""
        response = self.request(
            MetadataRequest[5](topics=topics, allow_auto_topic_creation=False), timeout=timeout
        )
        brokers = {b[0]: (b[1], b[2]) for b in response.brokers}
        views = {}
        for error_code, name, _internal, partitions in response.topics:
            views[name] = TopicView(
                error_code, {p[1]: PartitionView(leader=p[2], error_code=p[0]) for p in partitions}
            )
        return MetadataView(brokers, response.controller_id, response.cluster_id, views)

    def create_topic(self, name, partitions, timeout_ms=30_000, timeout=40.0):
        """CreateTopics v3 of one topic; returns (error_code, error_message)."""
        request = CreateTopicsRequest[3](
            create_topic_requests=[(name, partitions, 1, [], [])], timeout=timeout_ms, validate_only=False
        )
        [(topic, code, message)] = self.request(request, timeout=timeout).topic_errors
        assert topic == name
        return code, message

    def create_partitions(self, name, count, timeout_ms=30_000, timeout=40.0):
        request = CreatePartitionsRequest[1](
            topic_partitions=[(name, (count, None))], timeout=timeout_ms, validate_only=False
        )
        [(topic, code, message)] = self.request(request, timeout=timeout).topic_errors
        assert topic == name
        return code, message

    def delete_topic(self, name, timeout_ms=30_000, timeout=40.0):
        response = self.request(DeleteTopicsRequest[3](topics=[name], timeout=timeout_ms), timeout=timeout)
        [(topic, code)] = response.topic_error_codes
        assert topic == name
        return code

    def alter_topic_configs(self, name, configs, timeout=40.0):
        """AlterConfigs v1 of a topic (Kafka's non-incremental kind: these become its configs)."""
        request = AlterConfigsRequest[1](resources=[(TOPIC_RESOURCE, name, list(configs.items()))], validate_only=False)
        [(code, message, _type, resource)] = self.request(request, timeout=timeout).resources
        assert resource == name
        return code, message

    def topic_configs(self, name, timeout=10.0):
        """DescribeConfigs v1 of a topic, as this node answers it: {name: value}."""
        request = DescribeConfigsRequest[1](resources=[(TOPIC_RESOURCE, name, None)], include_synonyms=False)
        [(code, message, _type, _name, entries)] = self.request(request, timeout=timeout).resources
        assert code == NONE, f"DescribeConfigs {name} on {self.node}: {code} {message}"
        return {e[0]: e[1] for e in entries}

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Cluster:
    """`voters` combined nodes (ids 1..voters; controller-only ones with controller_only) and
    `brokers` broker-only nodes after them. What asks brokers (ids(), bootstrap(), Metadata
    views) leaves controller-only nodes out."""

    def __init__(self, root, voters=3, brokers=0, settings=None, controller_only=False, network=None):
        """`network` (a netns.Network) runs each node in its own network namespace, at its own
        address: the test can then cut links between nodes while clients still reach each."""
        self.root = pathlib.Path(root)
        ids = list(range(1, voters + brokers + 1))
        host = (lambda i: network.address(i)) if network else (lambda i: "127.0.0.1")
        prefix = (lambda i: network.exec_prefix(i)) if network else (lambda i: ())
        ports = set()
        controller_ports = {}
        for node_id in ids:
            port = free_port()
            while port in ports:
                port = free_port()
            ports.add(port)
            controller_ports[node_id] = port
        self.voters = ",".join(f"{i}@{host(i)}:{controller_ports[i]}" for i in ids[:voters])
        self.nodes = {}
        for node_id in ids:
            voter_roles = "controller" if controller_only else "broker,controller"
            roles = voter_roles if node_id <= voters else "broker"
            node = Node(
                self.root / f"node{node_id}",
                node_id,
                controller_ports[node_id],
                self.voters,
                roles,
                settings,
                host=host(node_id),
                prefix=prefix(node_id),
            )
            # Kafka ports must not collide with the CONTROLLER ports either.
            while node.broker and node.port in ports:
                node.port = free_port()
                node.settings["listeners"] = (
                    f"PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}"
                )
            ports.add(node.port)
            self.nodes[node_id] = node

    # -- processes --------------------------------------------------------------------------
    def node(self, node_id):
        return self.nodes[node_id]

    def live(self):
        return [n for n in self.nodes.values() if n.alive()]

    def live_brokers(self):
        return [n for n in self.live() if n.broker]

    def ids(self, nodes=None):
        """The ids of the given nodes, by default of the live brokers."""
        return sorted(n.node_id for n in (self.live_brokers() if nodes is None else nodes))

    def start(self, ids=None, timeout=READY_TIMEOUT_S):
        """Starts the given nodes (all by default) together, then waits until each serves."""
        nodes = [self.nodes[i] for i in (ids or self.nodes)]
        for node in nodes:
            node.start(wait=False)
        for node in nodes:
            node.wait_ready(timeout=timeout)
        return self

    def stop(self, ids=None):
        """SIGTERM every given (default: live) node at once, then waits; returns their exit codes."""
        nodes = [self.nodes[i] for i in ids] if ids else self.live()
        for node in nodes:
            if node.alive():
                node.proc.terminate()
        return {node.node_id: node.stop() for node in nodes}

    def cleanup(self):
        for node in self.nodes.values():
            node.resume()
            node.cleanup()

    def bootstrap(self, ids=None):
        nodes = [self.nodes[i] for i in ids] if ids else self.live_brokers()
        return ",".join(n.bootstrap for n in nodes)

    def expected_brokers(self, ids=None):
        """What Metadata should list for the given (default: live) nodes: id -> (host, port)."""
        nodes = [self.nodes[i] for i in ids] if ids else self.live_brokers()
        return {n.node_id: (n.host, n.port) for n in nodes}

    # -- per-node requests ------------------------------------------------------------------
    def raw(self, node_id, timeout=10.0):
        return RawClient(self.nodes[node_id], timeout=timeout)

    def metadata(self, node_id, topics=None, timeout=10.0):
        client = self.raw(node_id, timeout)
        try:
            return client.metadata(topics, timeout)
        finally:
            client.close()

    def views(self, ids=None, topics=None):
        """Every given (default: live) node's Metadata, by node id."""
        return {i: self.metadata(i, topics) for i in (ids or self.ids())}

    def wait(self, predicate, timeout, what, interval=0.05):
        """Calls predicate until it returns something truthy (which is returned). A node that
        is starting or stopping may refuse a connection meanwhile: that counts as not yet."""
        deadline = time.monotonic() + timeout
        last_error = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, TimeoutError, ConnectionError) as e:
                last_error = e
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}"
                    + (f" (last error: {last_error!r})" if last_error else "")
                )
            time.sleep(interval)

    def active_controller(self, via=None, timeout=10.0):
        """The active controller (the metadata quorum's leader) as node `via` (default: the
        first live broker) sees it: `weir cluster info --json` against its admin API, run in
        the node's network namespace when it has one (its admin listener is on its own
        127.0.0.1 there); None during an election. Kafka's Metadata does not say: each broker
        names itself as the controller there."""
        node = self.nodes[via] if via else self.live_brokers()[0]
        command = node.prefix + [str(weir_bin()), "cluster", "info", "--json", "--admin", node.admin_url()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=broker_env())
        if done.returncode != 0:
            raise ConnectionError(f"weir cluster info on {node}: {done.stderr.strip()}")
        return json.loads(done.stdout)["controller"]

    def wait_formed(self, ids=None, timeout=20.0):
        """Waits until every given (default: live) node lists exactly those brokers, names
        itself as the controller in Metadata (as KRaft brokers do: a live broker, which
        forwards to the active controller), shows the same cluster id, and sees the same
        active controller (a voter among them, or any voter without one); returns
        (active controller id, cluster_id)."""
        ids = ids or self.ids()
        expected = self.expected_brokers(ids)
        voter_ids = {i for i in ids if self.nodes[i].voter}

        def formed():
            views = self.views(ids)
            clusters = {v.cluster_id for v in views.values()}
            if any(v.brokers != expected for v in views.values()):
                return None
            if any(v.controller_id != i for i, v in views.items()):
                return None
            if len(clusters) != 1:
                return None
            [cluster_id] = clusters
            actives = {self.active_controller(i) for i in ids}
            if len(actives) != 1 or not cluster_id:
                return None
            [active] = actives
            voters = voter_ids or {n.node_id for n in self.nodes.values() if n.voter}
            if active not in voters:
                return None
            return active, cluster_id

        return self.wait(formed, timeout, f"nodes {ids} to agree on brokers {sorted(expected)} and a controller")

    def wait_topic(self, name, partitions, ids=None, timeout=15.0, leaders_in=None):
        """Waits until every given (default: live) node shows the topic with all its partitions
        led (by one of leaders_in, when given); returns its leaders as one node sees them."""
        ids = ids or self.ids()

        def ready():
            seen = None
            for i in ids:
                t = self.metadata(i, [name]).topics.get(name)
                if t is None or t.error_code != NONE or len(t.partitions) != partitions:
                    return None
                leaders = t.leaders()
                if any(l == NO_LEADER for l in leaders.values()):
                    return None
                if leaders_in is not None and not set(leaders.values()) <= set(leaders_in):
                    return None
                if seen is not None and leaders != seen:
                    return None
                seen = leaders
            return seen

        return self.wait(ready, timeout, f"topic {name} with {partitions} led partitions on nodes {ids}")

    def create_topic(self, via, name, partitions, timeout=15.0):
        """CreateTopics through node `via` (forwarded when it is not the controller), then waits
        until every live node shows it; returns its leaders."""
        client = self.raw(via)
        try:
            code, message = client.create_topic(name, partitions)
        finally:
            client.close()
        assert code == NONE, f"CreateTopics {name} through node {via}: error {code} {message}"
        return self.wait_topic(name, partitions, timeout=timeout)
