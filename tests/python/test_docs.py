"""The commands the docs give, run as they are written, so that the docs cannot drift from what
Weir does.

A test takes a `sh` block from a doc, changes only what a test must (the `weir` on PATH is the
binary under test, data directories go to a scratch directory instead of /var/lib/weir) and
runs it with bash. Where a recipe starts servers in the background and then talks to them, the
test waits until every server printed that it serves before running the rest: a person would
wait too.
"""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import REPO, weir_bin

KCAT = shutil.which("kcat")


def shell_block(doc, heading):
    """The first ```sh block after `heading` in docs/`doc`."""
    text = (REPO / "docs" / doc).read_text()
    assert heading in text, f"docs/{doc} has no heading {heading!r}"
    after = text[text.index(heading):]
    match = re.search(r"```sh\n(.*?)```", after, re.S)
    assert match, f"no sh block after {heading!r} in docs/{doc}"
    return match.group(1)


def ports_in(script):
    """Every 127.0.0.1 port a script names, with `$id` expanded for ids 1 to 3."""
    ports = set()
    for host_port in re.findall(r"127\.0\.0\.1:([0-9$a-z]+)", script):
        for node_id in (1, 2, 3):
            port = host_port.replace("$id", str(node_id))
            if port.isdigit():
                ports.add(int(port))
    return ports


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Shell:
    """bash with `weir` on PATH as the binary under test, run in a scratch directory."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        (bin_dir / "weir").symlink_to(weir_bin())
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_") and k != "RUST_LOG"}
        self.env["PATH"] = f"{bin_dir}:{self.env.get('PATH', '')}"

    def adapt(self, script):
        return script.replace("/var/lib/weir", str(self.root / "data"))


def test_the_three_node_recipe_in_docs_cluster_md_starts_a_cluster_that_serves_a_replicated_topic(tmp_path):
    """docs/cluster.md's "Starting a three-node cluster", as written: the three nodes start (each
    with listeners of its own), form one cluster, and the commands after them list three
    brokers, show the nodes, create a topic of three replicas and round-trip a record through
    node 1, whichever node leads its partition. The servers log no ERROR meanwhile."""
    assert KCAT is not None, "kcat is not installed (apt-get install kcat)"
    script = shell_block("cluster.md", "## Starting a three-node cluster")
    start, sep, rest = script.partition("done\n")
    assert sep, f"the recipe has no `for ... done` loop that starts the nodes:\n{script}"
    busy = sorted(p for p in ports_in(script) if not port_is_free(p))
    if busy:
        pytest.skip(f"the recipe's fixed ports {busy} are taken on this machine")

    shell = Shell(tmp_path)
    log_path = tmp_path / "servers.log"
    with open(log_path, "wb") as log:
        servers = subprocess.Popen(
            # SIGTERM to this shell stops the servers as a person's Ctrl-C would, and waits.
            ["bash", "-c", shell.adapt(start + sep) + "trap 'kill $(jobs -p) 2>/dev/null; wait' TERM\nwait\n"],
            cwd=tmp_path,
            env=shell.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            text = log_path.read_text(errors="replace")
            serving = re.findall(r"^weir \S+ listening on", text, re.M)
            if len(serving) == 3:
                break
            assert servers.poll() is None, f"the servers' shell exited ({servers.returncode}):\n{text[-4000:]}"
            assert "cannot listen" not in text, f"a node could not bind a listener:\n{text[-4000:]}"
            assert time.monotonic() < deadline, f"three nodes did not serve within 60 s:\n{text[-4000:]}"
            time.sleep(0.2)

        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", shell.adapt(rest)],
            cwd=tmp_path,
            env=shell.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = done.stdout
        assert done.returncode == 0, f"the recipe's commands failed ({done.returncode}):\n{out}\n{done.stderr}"
        assert re.search(r"3 brokers:", out), f"kcat -L does not list three brokers:\n{out}"
        for node_id in (1, 2, 3):
            assert re.search(rf"broker {node_id} at 127\.0\.0\.1:920{node_id}", out), out
        assert out.rstrip().endswith("hello"), f"weir consume did not print the record:\n{out}"
        text = log_path.read_text(errors="replace")
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert not errors, "the servers logged errors:\n" + "\n".join(errors[:20])
    finally:
        servers.terminate()
        try:
            servers.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(servers.pid, signal.SIGKILL)
            servers.wait(timeout=10)
