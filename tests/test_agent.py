"""The cluster agent (clusters/agent/server.py) as a real process on a scratch home: what it does on
its allow-list, and what it refuses. Persona: mallory holds the agent's address and tries to leave the
home or run something; the console holds the key."""

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from clusters import processes, tls
from clusters.agent import server
from clusters.agent.client import AgentClient, AgentEndpoint, AgentRefused
from clusters.work import TransientBackendError

from .conftest import agent_process, wait_until
from .factories import connected_in_a_burst


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """The agent as the backends start it: TLS with the cluster's own CA, and the console's client pinned to it."""
    with agent_process(tmp_path_factory.mktemp("agent")) as started:
        yield started


def test_it_reads_tails_lists_and_writes_inside_the_home(agent):
    client, home, _root = agent
    client.write("runs/7/config.json", b'{"steps": 3}\n', mode=0o640)
    assert (home / "runs/7/config.json").read_bytes() == b'{"steps": 3}\n'
    assert oct((home / "runs/7/config.json").stat().st_mode & 0o777) == "0o640"
    (home / "runs/7/slurm-12.out").write_text("".join(f"line {i}\n" for i in range(100)))
    (home / "runs/7/slurm-9.out").write_text("old\n")
    assert client.list("runs/7", "slurm-*.out") == ["slurm-12.out", "slurm-9.out"]
    assert client.tail("runs/7/slurm-12.out", lines=2) == "line 98\nline 99"
    assert client.read("runs/7/slurm-12.out", offset=7, limit=7) == b"line 1\n"
    assert client.read("runs/7/slurm-12.out", offset=10**6) == b""
    assert client.stat("runs/7/config.json") == {"exists": True, "size": 13, "is_dir": False, "owner": "root"}
    assert client.stat("runs/7/missing.json")["exists"] is False
    with pytest.raises(AgentRefused) as missing:
        client.read("runs/7/missing.json")
    assert missing.value.status == 404
    assert not [p for p in (home / "runs/7").iterdir() if p.name.startswith(".agent-")]  # no temporary left


@pytest.mark.parametrize(
    "path",
    ["../agent.key", "/etc/passwd", "runs/../../agent.key", "runs/7/../../..", "", "a\x00b", "escape/agent.key",
     "leak"],
)  # fmt: skip
def test_mallory_cannot_leave_the_home(agent, path):
    client, home, root = agent
    if not (home / "escape").exists():
        (home / "escape").symlink_to(root)  # a folder link that leads out
        (home / "leak").symlink_to(root / "agent.key")  # a file link that leads out
    for operation in ("read", "stat", "tail"):
        with pytest.raises(AgentRefused) as refused:
            getattr(client, operation)(path)
        assert refused.value.status == 400, (operation, path)
    with pytest.raises(AgentRefused):
        client.write(path, b"owned")
    assert (root / "agent.key").stat().st_size == 32  # the key is untouched


def test_it_follows_no_link_even_one_that_stays_inside_the_home(agent):
    client, home, _root = agent
    (home / "data.txt").write_text("inside\n")
    (home / "alias.txt").symlink_to(home / "data.txt")
    (home / "shelf").mkdir()
    (home / "door").symlink_to(home / "shelf")
    for read in (lambda: client.read("alias.txt"), lambda: client.tail("alias.txt"), lambda: client.list("door")):
        with pytest.raises(AgentRefused) as refused:
            read()
        assert refused.value.status == 400 and "follows no link" in str(refused.value)


MALLORY = 65534  # a project member: her jobs write in the project's home as her own account (here: nobody)


def planted(home, path, target):
    """A link `path` -> `target` that mallory's job made in the home."""
    link = home / path
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    os.lchown(link, MALLORY, MALLORY)
    return link


def test_mallorys_link_in_place_of_a_run_file_is_not_written_through(agent):
    client, home, _root = agent
    runtime = home / ".tcc/runtime-abc/train.py"  # root's: every user's job runs it
    runtime.parent.mkdir(parents=True)
    runtime.write_text("the console's code\n")
    planted(home, "runs/41/config.json", "../../.tcc/runtime-abc/train.py")
    with pytest.raises(AgentRefused, match="follows no link"):
        client.write("runs/41/config.json", b'{"steps": 3}\n')
    assert runtime.read_text() == "the console's code\n"
    planted(home, "runs/41/part", "../../.tcc/runtime-abc/train.py")  # appending a part through her link
    with pytest.raises(AgentRefused) as refused:
        client.call("write", path="runs/41/part", data="eA==", offset=runtime.stat().st_size)
    assert refused.value.status == 400 and "follows no link" in str(refused.value)
    assert runtime.read_text() == "the console's code\n"


def test_mallory_cannot_have_another_folder_handed_to_her_through_a_link(agent):
    client, home, _root = agent
    theirs = home / "runs/42"
    theirs.mkdir(parents=True)
    (theirs / "secret.txt").write_text("bob's run\n")
    planted(home, "runs/43", "42")
    with pytest.raises(AgentRefused, match="not a link"):
        client.own("runs/43", "nobody")
    assert (theirs.stat().st_uid, (theirs / "secret.txt").stat().st_uid) == (0, 0)
    victim = home / "runs/44/victim"
    victim.parent.mkdir(parents=True)
    victim.write_text("root's\n")
    planted(home, "runs/45/link", "../44/victim")  # a link inside a folder handed over changes hands itself
    (home / "runs/45").chmod(0o755)
    client.own("runs/45", "nobody")
    assert victim.stat().st_uid == 0 and (home / "runs/45/link").lstat().st_uid == MALLORY


def test_the_console_never_uses_a_folder_of_its_own_that_mallory_made_first(agent):
    client, home, _root = agent
    fake = home / "models"
    fake.mkdir(exist_ok=True)
    os.chown(fake, MALLORY, MALLORY)
    try:
        with pytest.raises(AgentRefused, match="models/ in the cluster's home was made by uid 65534") as refused:
            client.write("models/alpha.llama/v1/config.json", b"{}")
        assert refused.value.status == 409
        assert not (fake / "alpha.llama").exists()
    finally:
        shutil.rmtree(fake)
    client.write("models/alpha.llama/v1/config.json", b"{}")  # once it is gone, the agent makes its own
    assert ((home / "models").stat().st_uid, oct((home / "models").stat().st_mode & 0o777)) == (0, "0o755")


def test_it_refuses_unknown_operations_a_wrong_key_and_oversized_writes(agent):
    client, home, _root = agent
    for operation in ("exec", "run", "../stat", "delete"):
        with pytest.raises(AgentRefused) as refused:
            client.call(operation, path="x")
        assert refused.value.status == 404
    stranger = AgentClient(AgentEndpoint(client.endpoint.url, secrets.token_hex(32), client.endpoint.ca))
    with pytest.raises(AgentRefused) as refused:
        stranger.stat("runs")
    assert refused.value.status == 401
    with pytest.raises(AgentRefused) as refused:
        client.write("big.bin", b"x" * (server.MAX_WRITE + 1))
    assert refused.value.status == 400 and not (home / "big.bin").exists()
    for bad in ({"path": "x", "offset": -1}, {"path": "x", "limit": 10**9}, {"path": "x", "lines": "all"}):
        with pytest.raises(AgentRefused) as refused:
            client.call("read" if "lines" not in bad else "tail", **bad)
        assert refused.value.status in (400, 404)
    assert "key" not in repr(client.endpoint)


def test_the_console_talks_to_its_agent_only_over_tls_pinned_to_the_clusters_own_ca(agent):
    client, _home, _root = agent
    other_cluster = tls.ca_of(tls.controller_bundle("other"))
    for ca in (other_cluster, ""):  # another cluster's CA; none (the machine's public CAs are never asked)
        misled = AgentClient(AgentEndpoint(client.endpoint.url, client.endpoint.key, ca), timeout=5)
        with pytest.raises(TransientBackendError, match=r"did not sign|no CA to check"):
            misled.stat("runs")
    plain = AgentClient(AgentEndpoint(client.endpoint.url.replace("https:", "http:"), client.endpoint.key), timeout=5)
    with pytest.raises(TransientBackendError):
        plain.stat("runs")  # the agent speaks TLS only: a plain request gets no answer
    assert client.stat("runs")["exists"] in (True, False)  # and the agent is still serving


def test_a_rotation_switches_the_running_agent_to_a_new_ca_and_its_old_key_is_gone(tmp_path):
    """After a suspected leak of the controller's key, the console rotates: the agent takes the new bundle
    over the old pin and serves it from its next connection, without a restart. A client pinned to the old
    CA alone (or holding the leaked key's CA: mallory's) is refused; one pinned to both (the console while
    it switches) and one pinned to the new CA are served; the file a restarted agent reads holds the new key,
    root's alone. A bundle whose key is not its certificate's is refused, and the current one goes on."""
    old = tls.controller_bundle("rotate-test")
    (tmp_path / "home").mkdir()
    (tmp_path / "agent.key").write_bytes(key := secrets.token_bytes(32))
    (tmp_path / "tls.pem").write_bytes(old)
    command = [sys.executable, server.__file__, "--home", str(tmp_path / "home"), "--key-file",
               str(tmp_path / "agent.key"), "--listen", "127.0.0.1:0", "--port-file", str(tmp_path / "port"),
               "--tls-bundle", str(tmp_path / "tls.pem")]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_until((tmp_path / "port").exists, timeout=20, message="the agent to listen")
        url = f"https://127.0.0.1:{(tmp_path / 'port').read_text()}"

        def pinned(*bundles):
            return AgentClient(AgentEndpoint(url, key.hex(), "".join(tls.ca_of(b) for b in bundles)), timeout=5)

        new = tls.renewed(old)
        assert tls.ca_of(new) != tls.ca_of(old) and tls.not_after(new) >= tls.not_after(old)
        assert tls.ca_of(tls.trusting(old, new)) == tls.ca_of(old) + tls.ca_of(new)
        assert pinned(old).tls(new) == {"installed": True}
        with pytest.raises(TransientBackendError, match="did not sign"):
            pinned(old).stat(".")
        assert pinned(old, new).stat(".")["exists"] and pinned(new).stat(".")["exists"]
        assert (tmp_path / "tls.pem").read_bytes() == new
        assert (tmp_path / "tls.pem").stat().st_mode & 0o777 == 0o400
        mismatched = new.split(b"-----END PRIVATE KEY-----\n")[1]  # certificates only ...
        mismatched = old.split(b"-----BEGIN CERTIFICATE-----")[0] + mismatched  # ... behind the old key
        with pytest.raises(AgentRefused, match="not a controller bundle") as refused:
            pinned(new).tls(mismatched)
        assert refused.value.status == 400
        assert pinned(new).stat(".")["exists"] and (tmp_path / "tls.pem").read_bytes() == new
        assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.key", "home", "port", "tls.pem"]
    finally:
        process.kill()
        process.wait()


def test_an_agent_that_does_not_answer_is_a_transient_error():
    with socket.socket() as held:  # bound, never listening: connections to it are refused while we hold it
        held.bind(("127.0.0.1", 0))
        silent = AgentClient(AgentEndpoint(f"http://127.0.0.1:{held.getsockname()[1]}", "00"), timeout=2)
        with pytest.raises(TransientBackendError, match="not answering"):
            silent.stat("runs")


def test_tensorboard_is_the_one_program_and_only_when_the_agent_was_given_it(agent):
    client, _home, _root = agent
    with pytest.raises(AgentRefused) as refused:
        client.tensorboard("/clusters/alpha/demo/tensorboard")
    assert refused.value.status == 409  # this agent was started without --tensorboard-python
    for action, prefix in (("start", "/etc"), ("start", "/clusters/a/b/tensorboard;rm -rf /"), ("exec", None)):
        with pytest.raises(AgentRefused) as refused:
            client.call("tensorboard", action=action, path_prefix=prefix)
        assert refused.value.status == 400


def test_tensorboard_answers_through_the_agent_alone_on_a_socket_only_nobody_reaches():
    """The console relays TensorBoard through the agent (TLS, key): TensorBoard listens on no TCP port, and its
    socket's folder is nobody's, 0700. Its own answers pass through (a 404 stays a 404); the agent's
    refusals (a bad prefix, a wrong key) are the agent's."""
    root = Path(tempfile.mkdtemp(prefix="tcc-agent-tb-", dir="/tmp"))  # nobody must reach the home
    try:
        root.chmod(0o755)
        (root / "home" / "runs").mkdir(parents=True)
        (root / "agent.key").write_bytes(key := secrets.token_bytes(32))
        (root / "tls.pem").write_bytes(tls.controller_bundle("tb-test"))
        command = [sys.executable, server.__file__, "--home", str(root / "home"), "--key-file", str(root / "agent.key"),
                   "--listen", "127.0.0.1:0", "--port-file", str(root / "port"), "--tls-bundle", str(root / "tls.pem"),
                   "--tensorboard-python", sys.executable, "--tensorboard-socket-dir", str(root / "tb")]  # fmt: skip
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            wait_until((root / "port").exists, timeout=20, message="the agent to listen")
            url = f"https://127.0.0.1:{(root / 'port').read_text()}"
            client = AgentClient(AgentEndpoint(url, key.hex(), tls.ca_of((root / "tls.pem").read_bytes())))
            prefix = "/clusters/alpha/demo/tensorboard"
            status, _headers, body = client.relay_tensorboard(prefix, "GET", "data/runs")
            assert (status, json.loads(body)) == (200, [])
            assert client.relay_tensorboard(prefix, "GET", "data/no-such-route")[0] == 404  # TensorBoard's own
            with pytest.raises(AgentRefused) as refused:
                client.relay_tensorboard("/etc", "GET", "data/runs")
            assert refused.value.status == 400
            with pytest.raises(AgentRefused) as refused:
                AgentClient(AgentEndpoint(url, "00" * 32, client.endpoint.ca)).relay_tensorboard(prefix, "GET", "")
            assert refused.value.status == 401
            folder = root / "tb"
            assert folder.stat().st_mode & 0o777 == 0o700
            assert folder.stat().st_uid == pwd.getpwnam("nobody").pw_uid
            assert [p.name for p in folder.iterdir()] == ["tb.sock"]
            process.terminate()  # TensorBoard stops with it
            process.wait(timeout=30)
            wait_until(lambda: not tensorboards(root), timeout=20, message="TensorBoard to stop with its agent")
        finally:
            process.kill()
            processes.stop(tensorboards(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tensorboards(root):
    return sorted(
        pid for pid, argv in processes.command_lines() if any(str(root) in arg for arg in argv[1:3] + argv[3:])
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"action": "shutdown"}, "action must be"),
        ({"action": "drain", "node": "cpu-0;reboot", "reason": "x"}, "node must be"),
        ({"action": "drain", "node": "--all", "reason": "x"}, "node must be"),
        ({"action": "drain", "node": "cpu-0", "reason": "two\nlines"}, "reason must be"),
        ({"action": "hold", "name": "h", "nodes": "cpu-0"}, "nodes must be"),
        ({"action": "hold", "name": "h x", "nodes": ["cpu-0"]}, "name must be"),
        ({"action": "release", "name": "../x"}, "name must be"),
    ],
)
def test_mallory_gets_no_slurm_action_off_the_list_and_no_argument_unchecked(agent, arguments, message):
    client, _home, _root = agent
    action = arguments.pop("action")
    with pytest.raises(AgentRefused, match=message) as refused:
        client.slurm(action, **arguments)
    assert refused.value.status == 400


def test_a_folder_is_handed_to_an_account_but_never_the_home_or_to_root(agent):
    client, home, _root = agent
    (home / "runs/8").mkdir(parents=True)
    (home / "runs/8/job.sbatch").write_text("#!/bin/bash\n")
    for path, user, message in [
        (".", "nobody", "a folder below"),
        ("runs/8/job.sbatch", "nobody", "a folder below"),
        ("runs/8", "root", "other than root"),
        ("runs/8", "no-such-account-here", "other than root"),
        ("../etc", "nobody", "without '..'"),
    ]:
        with pytest.raises(AgentRefused, match=message):
            client.own(path, user)
    with pytest.raises(AgentRefused, match="an existing group of the user's"):
        client.own("runs/8", "nobody", "root")
    with pytest.raises(AgentRefused, match="an existing group of the user's"):
        client.own("runs/8", "nobody", "mail")  # a group nobody is not in
    assert client.own("runs/8", "nobody") == {"owner": "nobody", "group": "nogroup"}
    nobody = pwd.getpwnam("nobody")
    for path in (home / "runs/8", home / "runs/8/job.sbatch"):
        assert (path.stat().st_uid, path.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
    assert oct((home / "runs/8").stat().st_mode & 0o7777) == "0o2750"
    assert home.stat().st_uid == 0


def test_mallory_makes_no_account_outside_the_consoles_prefix_and_the_console_makes_its_own(agent):
    import grp

    client, home, _root = agent
    for user, group in [("root", "tcc-p-x"), ("tcc-m", "root"), ("daemon", "daemon"), ("tcc-../x", "tcc-p")]:
        with pytest.raises(AgentRefused, match="must be an account name starting with tcc-") as refused:
            client.account(user, group)
        assert refused.value.status == 400
    try:
        assert client.account("tcc-agent-test-1", "tcc-p-agent-test-1") == {
            "user": "tcc-agent-test-1",
            "group": "tcc-p-agent-test-1",
        }
        client.account("tcc-agent-test-1", "tcc-p-agent-test-1")  # again: nothing to do
        group = grp.getgrnam("tcc-p-agent-test-1")
        assert pwd.getpwnam("tcc-agent-test-1").pw_gid == group.gr_gid
        assert (home.stat().st_gid, oct(home.stat().st_mode & 0o7777)) == (group.gr_gid, "0o3770")
        client.write("runs/9/x.txt", b"x")
        client.own("runs/9", "tcc-agent-test-1", "tcc-p-agent-test-1")
        assert client.stat("runs/9/x.txt")["owner"] == "tcc-agent-test-1"
    finally:
        subprocess.run(["userdel", "tcc-agent-test-1"], capture_output=True)
        subprocess.run(["groupdel", "tcc-p-agent-test-1"], capture_output=True)


def test_it_prunes_old_entries_of_a_folder_below_the_home_and_nothing_else(agent):
    import os
    import time

    client, home, _root = agent
    for name in ("old", "new"):
        client.write(f"scans/{name}/result.json", b"{}")
    client.write("scans/old-file.txt", b"x")
    an_hour_ago = time.time() - 3600
    for path in (home / "scans/old", home / "scans/old-file.txt"):
        os.utime(path, (an_hour_ago, an_hour_ago))
    assert client.prune("scans", older_than=time.time() - 60) == 2
    assert sorted(p.name for p in (home / "scans").iterdir()) == ["new"]
    assert client.prune("no-such-folder", older_than=time.time()) == 0
    with pytest.raises(AgentRefused, match="a folder below"):
        client.prune(".", older_than=time.time())
    with pytest.raises(AgentRefused):
        client.prune("../", older_than=time.time())
    assert (home / "scans/new/result.json").exists()


@pytest.fixture
def store():
    """A plain HTTP store that keeps each PUT (path with query, headers, body) and answers with an ETag,
    or with the status in `answer` (mutable) when set."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    puts, answer = [], {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_PUT(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            puts.append((self.path, dict(self.headers), body))
            status = answer.get("status", 200)
            text = answer.get("text", "").encode()
            self.send_response(status)
            self.send_header("ETag", f'"etag-{len(puts)}"')
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", puts, answer
    server.shutdown()
    server.server_close()


def test_it_sends_a_byte_range_of_a_home_file_to_a_part_url(agent, store):
    client, home, _root = agent
    url, puts, _answer = store
    data = os.urandom(3 << 20)
    (home / "runs/50/checkpoints/step-2").mkdir(parents=True)
    (home / "runs/50/checkpoints/step-2/__0_0.distcp").write_bytes(data)
    path = "runs/50/checkpoints/step-2/__0_0.distcp"
    answer = client.upload(path, f"{url}/bucket/x?partNumber=2&uploadId=u1", offset=1 << 20, length=2 << 20,
                           headers={"x-goog-meta-run": "50"})  # fmt: skip
    assert answer == {"etag": '"etag-1"', "bytes": 2 << 20}
    sent_path, headers, body = puts[0]
    assert sent_path == "/bucket/x?partNumber=2&uploadId=u1" and body == data[1 << 20 :]
    assert headers["x-goog-meta-run"] == "50"
    assert client.upload(path, f"{url}/empty", offset=len(data), length=0)["bytes"] == 0  # an empty last part


def test_mallory_cannot_have_a_root_file_sent_to_the_store_through_a_link(agent, store):
    client, home, _root = agent
    url, puts, _answer = store
    secret = home / ".tcc/munge.key"  # root's, 0600: what her link aims at
    secret.parent.mkdir(exist_ok=True)
    secret.write_bytes(b"k" * 1024)
    secret.chmod(0o600)
    planted(home, "runs/51/checkpoints/step-9/__0_0.distcp", "../../../../.tcc/munge.key")
    with pytest.raises(AgentRefused) as refused:
        client.upload("runs/51/checkpoints/step-9/__0_0.distcp", f"{url}/b/o", offset=0, length=1024)
    assert refused.value.status == 400 and "follows no link" in str(refused.value)
    planted(home, "runs/52/checkpoints", "../../.tcc")  # a link higher up the path
    with pytest.raises(AgentRefused, match="follows no link"):
        client.upload("runs/52/checkpoints/munge.key", f"{url}/b/o", offset=0, length=1024)
    assert puts == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "file:///etc/shadow"}, "url must be an http(s) URL"),
        ({"url": "gopher://127.0.0.1/x"}, "url must be an http(s) URL"),
        ({"headers": {"X-Evil": "a\r\nHost: elsewhere"}}, "headers must map"),
        ({"headers": {"Bad Name": "x"}}, "headers must map"),
        ({"length": (5 << 30) + 1}, "length must be a whole number"),
        ({"offset": -1}, "offset must be a whole number"),
    ],
)
def test_mallory_gets_no_upload_off_its_checked_arguments(agent, store, arguments, message):
    client, home, _root = agent
    url, puts, _answer = store
    (home / "runs/53").mkdir(parents=True, exist_ok=True)
    (home / "runs/53/weights").write_bytes(b"w" * 64)
    body = {"path": "runs/53/weights", "url": f"{url}/b/o", "offset": 0, "length": 64, **arguments}
    with pytest.raises(AgentRefused) as refused:
        client.call("upload", **body)
    assert refused.value.status == 400 and message in str(refused.value)
    assert puts == []


def test_a_part_beyond_the_file_or_refused_by_the_store_is_an_error_that_keeps_the_url_secret(agent, store):
    client, home, _root = agent
    url, _puts, answer = store
    (home / "runs/54").mkdir(parents=True, exist_ok=True)
    (home / "runs/54/weights").write_bytes(b"w" * 100)
    with pytest.raises(AgentRefused) as short:
        client.upload("runs/54/weights", f"{url}/b/o", offset=50, length=51)
    assert short.value.status == 409 and "holds 100 bytes" in str(short.value)
    answer.update(status=403, text="<Error><Code>SignatureDoesNotMatch</Code></Error>")
    signed = f"{url}/b/o?partNumber=1&X-Goog-Signature=5ec7e7"
    with pytest.raises(AgentRefused) as refused:
        client.upload("runs/54/weights", signed, offset=0, length=100)
    assert refused.value.status == 502 and "answered 403" in str(refused.value)
    assert "SignatureDoesNotMatch" in str(refused.value) and "5ec7e7" not in str(refused.value)
    with pytest.raises(AgentRefused) as silent:
        client.upload("runs/54/weights", "http://127.0.0.1:9/b/o?X-Goog-Signature=5ec7e7", offset=0, length=100)
    assert silent.value.status == 502 and "did not answer" in str(silent.value) and "5ec7e7" not in str(silent.value)


def test_a_burst_of_connections_waits_for_the_agent_none_is_dropped():
    """The agent takes many calls at once (a worker's parallel part uploads, TensorBoard's page fetching
    dozens of files through the console, the sync's reads). With Python's default backlog of 5, a burst
    beyond it while the accept loop was busy had its SYNs dropped: 1 s, 3 s, ... until the 127 s of every
    retry failed the call."""
    agent = server.AgentServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # listening; nothing accepts yet
    try:
        assert connected_in_a_burst(agent.server_address[:2]) == 40
    finally:
        agent.server_close()
