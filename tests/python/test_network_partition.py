"""A network partition, made with network namespaces (netns.py): three `weir server` nodes, each
in its own namespace, and the test cutting the links between a partition's leader and the
other two while clients still reach all three.

What it proves: the isolated old leader acknowledges none of the `acks=all` writes sent to it
(its followers stopped fetching, and it cannot shrink its ISR without the controller); the
majority fences it, elects an in-sync leader at a higher epoch and takes writes; once the
partition heals the old leader truncates what it alone had, catches up and rejoins the ISR, and
when it leads again its log holds exactly the acknowledged writes. Both when the old leader is
the active controller (the quorum elects another) and when it is not.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2).
"""

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from helpers import unique
from netns import Network, unavailable
from test_replication import REPLICATION_SETTINGS, create_replicated, partition_states, produce, read_partition


@pytest.fixture
def network():
    why = unavailable()
    if why:
        pytest.skip(f"network partitions need network namespaces: {why}")
    net = Network(3)
    try:
        net.check_reachable()
        yield net
    finally:
        net.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("leader_is_controller", [True, False], ids=["leader-is-controller", "leader-is-not"])
def test_an_isolated_leader_cannot_acknowledge_acks_all_writes(network, cluster_factory, leader_is_controller):
    cluster = cluster_factory(voters=3, settings=REPLICATION_SETTINGS, network=network)
    controller = cluster.active_controller(1)
    old = controller if leader_is_controller else next(i for i in cluster.ids() if i != controller)
    others = [i for i in cluster.ids() if i != old]
    topic = unique("partitioned")
    states = create_replicated(cluster, topic, assignment=[[old] + others], config={"min.insync.replicas": "2"})
    assert states[0][0] == old, states

    before = [f"before-{i}".encode() for i in range(200)]
    reports = produce(cluster.bootstrap(), topic, before)
    assert all(err is None for err, _ in reports.values())

    network.isolate(old, others)
    # A producer that reaches only the old leader, whose metadata still names itself.
    isolated = [f"isolated-{i}".encode() for i in range(50)]
    reports = produce(cluster.node(old).bootstrap, topic, isolated, timeout=15, retries=0)
    acknowledged = [v for v, (err, _) in reports.items() if err is None]
    assert acknowledged == [], f"the isolated leader acknowledged {len(acknowledged)} acks=all writes"
    errors = sorted({str(err.name()) for err, _ in reports.values() if err is not None})
    print(f"\n[partition] the isolated leader's answers: {errors}", flush=True)

    def majority_leader():
        s = partition_states(cluster, topic, via=others[0]).get(0)
        return s if s and s[0] in others and old not in s[2] else None

    after = cluster.wait(majority_leader, 30, "the majority electing a leader without the isolated node")
    majority = [f"majority-{i}".encode() for i in range(200)]
    reports = produce(cluster.bootstrap(others), topic, majority, timeout=30)
    assert all(err is None for err, _ in reports.values()), [r for r in reports.values() if r[0]][:3]

    network.heal()

    def rejoined():
        s = partition_states(cluster, topic, via=others[0]).get(0)
        return s if s and old in s[2] and len(s[2]) == 3 else None

    cluster.wait(rejoined, 60, "the old leader truncating, catching up and rejoining the ISR")
    # Let the old leader lead again: its log is then what consumers read.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})

    def old_leads():
        if partition_states(cluster, topic).get(0, (None,))[0] == old:
            return True
        # It is the preferred replica: a preferred election gives the partition back to it.
        admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)])
        return False

    cluster.wait(old_leads, 30, "the old leader leading again", interval=1.0)
    got = read_partition(cluster.bootstrap(), topic, 0, len(before) + len(majority) + 1, timeout=60)
    values = [v for _, v in got]
    assert values == before + majority, (
        f"{len(values)} records; isolated ones present: {sum(v.startswith(b'isolated') for v in values)}"
    )
    assert after[0] != old
