"""Smoke tests of the benchmarks: scripts/bench-kafka.py and `weir bench partitions` print sane
numbers on a tiny run (no performance claims)."""

import json
import pathlib
import subprocess
import sys

from conftest import weir_bin

BENCH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench-kafka.py"


def run_bench(*args, timeout=120):
    cmd = [sys.executable, str(BENCH), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_bench_json(broker):
    out = run_bench("--bootstrap", broker.bootstrap, "--messages", "2000", "--pid", str(broker.pid), "--json")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] is True
    assert (result["messages"], result["size"], result["partitions"], result["acks"]) == (2000, 1024, 6, "1")
    assert result["produce"]["messages_acked"] == 2000 and result["produce"]["errors"] == 0
    assert result["consume"]["messages"] == 2000 and result["consume"]["errors"] == 0
    for phase in ("produce", "consume"):
        r = result[phase]
        assert 0 < r["seconds"] < 60
        assert r["msg_per_s"] > 0 and r["mb_per_s"] > 0
        assert abs(r["mb_per_s"] - r["msg_per_s"] * 1024 / 1e6) < 1e-6 * max(1.0, r["mb_per_s"])
    assert 1024 < result["broker_peak_rss_kib"] < 8 * 1024 * 1024  # between 1 MiB and 8 GiB


def test_bench_text_with_acks_all(broker):
    out = run_bench("--bootstrap", broker.bootstrap, "--messages", "500", "--size", "100", "--acks", "all",
                    "--partitions", "2", "--pid", str(broker.pid))
    lines = out.splitlines()
    assert any(line.startswith("produce") and "MB/s" in line and "msg/s" in line and "500 records" in line
               for line in lines), out
    assert any(line.startswith("consume") and "MB/s" in line and "500 records" in line for line in lines), out
    assert any(line.startswith("broker peak RSS (VmHWM):") for line in lines), out


def test_bench_partitions_quick(tmp_path):
    """`weir bench partitions` on a tiny scale: three real nodes grown to 30 and 60 partitions
    (topics of 3, replication factor 3). Every figure it reports must be there and sane."""
    report_path = tmp_path / "partitions.json"
    cmd = [str(weir_bin()), "bench", "partitions", "--counts", "30,60", "--per-topic", "3",
           "--settle", "0.5", "--idle", "1", "--json", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    (run,) = json.loads(report_path.read_text())
    assert [step["partitions"] for step in run["steps"]] == [30, 60]
    for step in run["steps"]:
        assert step["created"] == 30 and 0 < step["seconds"] < 60 and step["partitions_per_s"] > 0
        assert len(step["nodes"]) == 3
        for node in step["nodes"]:
            # 60 partitions x 3 replicas on 3 nodes: each node holds up to 60 open segments.
            assert 0 <= node["idle_cpu_percent"] < 200
            assert 1 < node["rss_mib"] < 4096
            assert node["open_files"] >= step["partitions"], node
            # Indexes are mapped once a partition is used: these idle ones map none.
            assert 0 < node["memory_maps"] < 2 * step["partitions"] + 1000, node
    assert "| 60 |" in proc.stdout, proc.stdout


def test_bench_elastic_quick(tmp_path):
    """`weir bench elastic` on a tiny scale: a split under load on three real nodes, and a plain
    against an elastic topic on one. Every figure must be there and sane: the split moved the
    upper half of the first physical partition, writes flowed before, during and after it, and
    both topics took and served bytes."""
    report_path = tmp_path / "elastic.json"
    cmd = [str(weir_bin()), "bench", "elastic", "--stable-partitions", "8", "--seconds", "2", "--rounds", "1",
           "--json", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(report_path.read_text())
    split = report["split"]
    assert split["moved"] == [2, 3], split
    assert split["acks_per_sec_before"] > 0 and split["acks_per_sec_after"] > 0, split
    assert 0 < split["split_seconds"] < 120 and split["stall_moved_p99_ms"] > 0, split
    assert [c["kind"] for c in report["cost"]] == ["plain", "elastic"]
    for cost in report["cost"]:
        assert cost["produce_mb_per_s"][0] > 0 and cost["fetch_mb_per_s"][0] > 0, cost
        assert cost["produce_cpu_seconds_per_gb"] > 0, cost
    assert "produce stall, moved partitions" in proc.stdout, proc.stdout


def test_bench_native_quick(tmp_path):
    """`weir bench native` on a tiny scale: each client on each topic writes, is answered and
    persisted. On the memory-first topic the native producer is answered before the store has
    its write, and Kafka acks=all only once it has; a native write is persisted at about a
    store round, never before its answer."""
    report_path = tmp_path / "native.json"
    cmd = [str(weir_bin()), "bench", "native", "--writes", "20", "--bytes", "4M", "--rounds", "1",
           "--json", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    rows = {(r["topic"], r["client"]): r for r in json.loads(report_path.read_text())}
    assert set(rows) == {(t, c) for t in ("memory-first", "page cache") for c in ("native", "Kafka acks=all")}
    for row in rows.values():
        # A 4 MiB stream may take less CPU than /proc's 10 ms ticks show: 0 is a reading.
        assert row["mb_per_s"] > 0 and row["cpu_seconds_per_gb"] >= 0, row
        assert 0 < row["answered_p50_ms"] <= row["persisted_p50_ms"], row
    native, kafka = rows[("memory-first", "native")], rows[("memory-first", "Kafka acks=all")]
    # memory.flush.ms is 50: the store's round is what Kafka waits for, and the native
    # producer only for its checkpoint.
    assert native["answered_p50_ms"] < kafka["answered_p50_ms"], (native, kafka)
    assert native["persisted_p50_ms"] >= 20, native
    assert "| memory-first | native |" in proc.stdout, proc.stdout


def test_bench_tls_quick(tmp_path):
    """`weir bench tls --quick`: both brokers take the produce and give every byte back, the
    TLS one through rustls (a fetch over TLS costs more CPU per GB than sendfile)."""
    report_path = tmp_path / "tls.json"
    cmd = [str(weir_bin()), "bench", "tls", "--quick", "--json", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    rows = {r["listener"]: r for r in json.loads(report_path.read_text())}
    assert set(rows) == {"PLAINTEXT (sendfile)", "SSL (rustls)"}
    for row in rows.values():
        assert row["produce_mb_per_s"][0] > 0 and row["fetch_mb_per_s"][0] > 0, row
    assert "TLS / plain text: produce" in proc.stdout, proc.stdout
