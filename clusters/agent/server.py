"""The cluster agent (runs on the cluster's controller; standard library only).

    python3 server.py --home /home --key-file /etc/tcc/agent.key --listen 127.0.0.1:6821
        --tls-bundle /etc/tcc/tls.pem --slurmrestd-relay 127.0.0.1:6820=/run/tcc/slurmrestd.sock

With --tls-bundle it serves TLS only (the console pins the cluster's CA: clusters/tls.py), and with
--slurmrestd-relay it also serves TLS on slurmrestd's port, relayed to slurmrestd's Unix socket.

Every request is `POST /v1/<operation>` with a JSON object and `Authorization: Bearer <key>` (the hex
of the cluster's agent key file, compared in constant time). Operations, all on paths RELATIVE to the cluster's
shared home, walked inside it with directory descriptors (no absolute paths, no `..`, no NUL, and no
link anywhere on the path: the agent runs as root in a home every project member can write, so it
follows no link at all). The home's runs/, models/, scans/ and .tcc/ are the agent's own (root's);
one a user made first is refused (409), never used:

    stat  {path}                         -> {exists, size, is_dir, owner}
    read  {path, offset=0, limit=1 MiB}  -> {data (base64), offset, size}      whole lines not promised
    tail  {path, lines=40}               -> {text}                             the last lines (UTF-8, replaced)
    list  {path, pattern="*"}            -> {names}                            sorted, at most 1,000
    write {path, data (base64), mode, offset=0} -> {size}                      atomic; parents made; 4 MiB at most
                                         (offset > 0: appends to a file of exactly that size, for a
                                          larger file written in parts into a folder that is then moved)
    move  {path, to}                     -> {moved}                            rename; refused if `to` exists
    upload {path, url, offset, length, headers={}} -> {etag, bytes}           PUT that byte range to url: one part
                                         of a multipart upload the registry's MLflow signed (5 GiB at most)
    own   {path, user, group?}           -> {owner, group}                     a run's folder becomes a user's
    prune {path, older_than}             -> {removed}                          entries of a folder older than a time
    account {user, group}                -> {user, group}                      a user's account in its project group
    tensorboard {action: start|stop, path_prefix}  -> {started} | {stopped}   TensorBoard over <home>/runs
    slurm {action, node?, reason?, name?, nodes?}  -> {done, ...}             what slurmrestd 0.0.38 cannot do

and one relay, `GET|HEAD|POST /tensorboard/<path>` with the key and `X-TensorBoard-Prefix`: TensorBoard's own
answer (started first if need be); the agent's own refusals carry `X-Agent-Error: 1`.

`slurm` runs scontrol (never a shell) for a fixed list of actions, each with checked arguments:
drain/resume/down a node, reconfigure, hold (create or widen a reservation for root, FLEX and
IGNORE_JOBS) and release (delete it; done when it is already gone). The agent finds the cluster's
slurm.conf as scontrol does (--slurm-conf or $SLURM_CONF, else /etc/slurm/slurm.conf).

Anything else is 404, a bad key 401, a bad argument 400 with {"error": ...}. The one program the agent
starts is TensorBoard (with --tensorboard-python), on the home's runs folder, as nobody, on a Unix socket in
--tensorboard-socket-dir (nobody's, 0700: no other account can reach it or take its place), with a path
prefix the console chooses (checked); it never reads outside the home. `account` makes or
joins only accounts and groups named with --account-prefix, never the machine's own.
"""

import argparse
import base64
import binascii
import contextlib
import fnmatch
import grp
import hmac
import http.client
import json
import os
import pwd
import re
import secrets
import selectors
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_READ = 4 << 20
MAX_WRITE = 4 << 20
MAX_BODY = 6 << 20
MAX_NAMES = 1000
MAX_PART = 5 << 30  # the largest part of a multipart upload (GCS's XML API and S3)
UPLOAD_TIMEOUT = 120  # seconds a store may leave a part's connection silent
HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,100}")
TAIL_WINDOW = 256 << 10


class Refused(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def bad(message):
    return Refused(HTTPStatus.BAD_REQUEST, message)


# Top-level folders of the home that only the agent (root) makes: what it writes there (run files, staged
# models, scan jobs and their results, the nodes' runtime) is trusted by the console and by every user's
# jobs, so one a user made first (the home is the project's, group-writable) is never used.
AGENT_FOLDERS = frozenset({"runs", "models", "scans", ".tcc"})
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Home:
    """The cluster's shared home. Every path is walked from the home's own folder one component at a
    time with directory descriptors and O_NOFOLLOW, and each operation acts on a descriptor of what it
    found: a link anywhere on the path is refused, so a link planted by a user's job (the agent runs as
    root) is never followed, not even one swapped in between a check and its use."""

    def __init__(self, root):
        self.root = os.path.realpath(root)

    def parts(self, path):
        """The components of `path` (relative to the home), refused when it could leave the home."""
        if not isinstance(path, str) or not path or "\x00" in path or len(path) > 1024:
            raise bad("path must be a non-empty relative path")
        if path.startswith("/") or any(part == ".." for part in path.split("/")):
            raise bad("path must be relative to the cluster's home, without '..'")
        return [part for part in path.split("/") if part not in ("", ".")]

    @contextlib.contextmanager
    def folder(self, parts, *, create=False):
        """A descriptor of the folder at `parts` below the home (the home itself for []), made (with its
        parents) when `create`. 400 when a component is a link or not a folder, 404 when it is missing
        and not `create`, 409 when one of AGENT_FOLDERS was made by someone other than root."""
        fd = os.open(self.root, FOLDER_FLAGS)
        try:
            for depth, part in enumerate(parts):
                try:
                    child = open_folder(part, fd)
                except FileNotFoundError:
                    if not create:
                        raise Refused(HTTPStatus.NOT_FOUND, f"no such folder: {'/'.join(parts[: depth + 1])}") from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755 if depth == 0 and part in AGENT_FOLDERS else 0o777, dir_fd=fd)
                    child = open_folder(part, fd)
                except (NotADirectoryError, OSError) as exc:
                    raise bad(f"{'/'.join(parts[: depth + 1])} is a link or not a folder ({exc.strerror}); "
                              "the agent follows no link") from None  # fmt: skip
                os.close(fd)
                fd = child
                if depth == 0 and part in AGENT_FOLDERS and os.fstat(fd).st_uid != 0:
                    raise Refused(
                        HTTPStatus.CONFLICT,
                        f"{part}/ in the cluster's home was made by uid {os.fstat(fd).st_uid}, not by the console; "
                        "move it away so the console can make its own",
                    )
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def parent(self, path, *, create=False):
        """(descriptor of the folder that holds `path`, its last component); `path` must be below the home."""
        parts = self.parts(path)
        if not parts:
            raise bad("path must be below the cluster's home")
        with self.folder(parts[:-1], create=create) as fd:
            yield fd, parts[-1]

    @contextlib.contextmanager
    def open_file(self, path, flags=os.O_RDONLY, mode=0o640):
        """A descriptor of the regular file at `path`, never through a link (a link there is refused)."""
        with self.parent(path) as (folder, name):
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
            except FileNotFoundError:
                raise Refused(HTTPStatus.NOT_FOUND, f"no such file: {path}") from None
            except IsADirectoryError:
                raise bad("path is a folder") from None
            except OSError as exc:
                raise bad(f"{path} is a link or cannot be opened ({exc.strerror}); the agent follows no link") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise bad("path is not a regular file")
            yield fd
        finally:
            os.close(fd)

    def lstat(self, path):
        """os.lstat of `path` (a link is reported as itself), or None when nothing is there."""
        parts = self.parts(path)
        if not parts:
            return os.stat(self.root)
        try:
            with self.folder(parts[:-1]) as folder:
                return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except Refused as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return None
            raise


def open_folder(name, parent):
    return os.open(name, FOLDER_FLAGS, dir_fd=parent)


def number(body, key, default, low, high):
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(f"{key} must be a whole number from {low} to {high}")
    return value


def op_stat(home, body):
    found = home.lstat(body.get("path"))
    if found is None:
        return {"exists": False, "size": 0, "is_dir": False, "owner": ""}
    if stat.S_ISLNK(found.st_mode):
        raise bad(f"{body['path']} is a link; the agent follows no link")
    try:
        owner = pwd.getpwuid(found.st_uid).pw_name
    except KeyError:
        owner = str(found.st_uid)
    return {"exists": True, "size": found.st_size, "is_dir": stat.S_ISDIR(found.st_mode), "owner": owner}


def op_read(home, body):
    offset = number(body, "offset", 0, 0, 1 << 62)
    limit = number(body, "limit", 1 << 20, 1, MAX_READ)
    with home.open_file(body.get("path")) as fd:
        size = os.fstat(fd).st_size
        data = os.pread(fd, limit, offset)
    return {"data": base64.b64encode(data).decode(), "offset": offset, "size": size}


def op_upload(home, body):
    """PUT `length` bytes of the file from `offset` to `url`: one part of a multipart upload into the
    registry's artifact store (a URL its MLflow server signed for that part alone; the console never
    holds the bucket's credentials, and the bytes never pass through it). The file is read through the
    same no-link walk as `read`; the URL's query is a credential: it is never logged or echoed."""
    url = body.get("url")
    target = urllib.parse.urlsplit(url) if isinstance(url, str) and len(url) <= 16384 else None
    if target is None or target.scheme not in ("https", "http") or not target.hostname:
        raise bad("url must be an http(s) URL")
    headers = body.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and HEADER_NAME.fullmatch(k) and not set("\r\n\0") & set(v)
        for k, v in headers.items()
    ):
        raise bad("headers must map header names to single-line values")
    offset = number(body, "offset", 0, 0, 1 << 62)
    length = number(body, "length", 0, 0, MAX_PART)
    with home.open_file(body.get("path")) as fd:
        size = os.fstat(fd).st_size
        if offset + length > size:
            raise Refused(HTTPStatus.CONFLICT, f"{body['path']} holds {size} bytes, not {offset + length}")
        status, etag, answer = put_range(target, headers, fd, offset, length)
    if not 200 <= status < 300:
        raise Refused(HTTPStatus.BAD_GATEWAY, f"the artifact store answered {status}: {answer}")
    return {"etag": etag, "bytes": length}


def put_range(target, headers, fd, offset, length):
    """(status, ETag, the start of the answer's text) of a PUT of the file's bytes [offset, offset+length)."""
    kind = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    extra = {"context": ssl.create_default_context()} if target.scheme == "https" else {}
    connection = kind(target.hostname, target.port, timeout=UPLOAD_TIMEOUT, **extra)
    try:
        connection.putrequest("PUT", target.path + (f"?{target.query}" if target.query else ""),
                              skip_accept_encoding=True)  # fmt: skip
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        sent = 0
        while sent < length:
            chunk = os.pread(fd, min(1 << 20, length - sent), offset + sent)
            if not chunk:
                raise Refused(HTTPStatus.CONFLICT, "the file shrank while it was sent")
            connection.send(chunk)
            sent += len(chunk)
        response = connection.getresponse()
        text = response.read(2048).decode(errors="replace")
        return response.status, response.getheader("ETag", ""), " ".join(text.split())[:300]
    except OSError as exc:
        raise Refused(HTTPStatus.BAD_GATEWAY, f"the artifact store did not answer: {exc.strerror or exc}") from None
    finally:
        connection.close()


def op_tail(home, body):
    lines = number(body, "lines", 40, 1, 1000)
    with home.open_file(body.get("path")) as fd:
        size = os.fstat(fd).st_size
        text = os.pread(fd, TAIL_WINDOW, max(0, size - TAIL_WINDOW)).decode(errors="replace")
    return {"text": "\n".join(text.splitlines()[-lines:])}


def op_list(home, body):
    pattern = body.get("pattern", "*")
    if not isinstance(pattern, str) or "/" in pattern or len(pattern) > 200:
        raise bad("pattern must be a file name pattern such as slurm-*.out")
    with home.folder(home.parts(body.get("path"))) as fd:
        names = sorted(name for name in os.listdir(fd) if fnmatch.fnmatchcase(name, pattern))
    return {"names": names[:MAX_NAMES]}


def op_write(home, body):
    path = body.get("path")
    try:
        data = base64.b64decode(body.get("data", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise bad("data must be base64") from None
    if len(data) > MAX_WRITE:
        raise bad(f"data must be at most {MAX_WRITE} bytes")
    mode = number(body, "mode", 0o640, 0, 0o777)
    offset = number(body, "offset", 0, 0, 1 << 50)
    if offset:
        try:
            with home.open_file(path, os.O_WRONLY | os.O_APPEND) as fd:
                if os.fstat(fd).st_size != offset:
                    raise Refused(HTTPStatus.CONFLICT, f"{path} does not have {offset} bytes to append to")
                os.write(fd, data)
        except Refused as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                raise Refused(HTTPStatus.CONFLICT, f"{path} does not have {offset} bytes to append to") from None
            raise
        return {"size": offset + len(data)}
    with home.parent(path, create=True) as (folder, name):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                raise bad(f"{path} is a link; the agent follows no link")
        temporary = f".agent-{secrets.token_hex(8)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder)  # fmt: skip
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                os.fchmod(handle.fileno(), mode)
            # rename never follows a link at `name` (one swapped in since the check above is replaced)
            os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
            raise
    return {"size": len(data)}


def op_move(home, body):
    """Rename a file or folder below the home to a path below the home that does not exist yet (a
    folder staged in parts appears whole, once)."""
    with home.parent(body.get("path")) as (source, name):
        try:
            os.stat(name, dir_fd=source, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused(HTTPStatus.NOT_FOUND, f"no such file: {body.get('path')}") from None
        with home.parent(body.get("to"), create=True) as (target, to):
            try:
                os.stat(to, dir_fd=target, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                raise Refused(HTTPStatus.CONFLICT, f"{body['to']} already exists")
            os.rename(name, to, src_dir_fd=source, dst_dir_fd=target)
    return {"moved": True}


def op_prune(home, body):
    """Remove the entries directly in the folder (a folder below the home, never the home) whose
    modification time is before `older_than` (Unix seconds): the retention of old scan folders."""
    parts = home.parts(body.get("path"))
    older_than = number(body, "older_than", 0, 0, 1 << 40)
    if not parts:
        raise bad("path must be a folder below the cluster's home")
    try:
        with home.folder(parts) as fd:
            return {"removed": prune_in(fd, older_than)}
    except Refused as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return {"removed": 0}
        raise


def prune_in(fd, older_than):
    removed = 0
    for entry in os.scandir(fd):
        found = entry.stat(follow_symlinks=False)
        if found.st_mtime < older_than:
            if stat.S_ISDIR(found.st_mode):
                shutil.rmtree(entry.name, dir_fd=fd, ignore_errors=True)  # never follows a link
            else:
                os.unlink(entry.name, dir_fd=fd)
            removed += 1
    return removed


def op_own(home, body):
    """The folder (a run's, below the home) and what is in it become `user`'s and `group`'s (a
    project's group the user is in; default the user's own), writable by the user alone; the home
    itself never changes hands, and no link is followed (a link in it changes hands itself, not what
    it points to)."""
    parts = home.parts(body.get("path"))
    user, group = body.get("user"), body.get("group")
    found = home.lstat(body.get("path")) if parts else None
    if found is None or not stat.S_ISDIR(found.st_mode):
        raise bad("path must be a folder below the cluster's home (not a link)")
    try:
        account = pwd.getpwnam(user) if isinstance(user, str) else None
        team = grp.getgrnam(group) if isinstance(group, str) else grp.getgrgid(account.pw_gid) if account else None
    except KeyError:
        account = team = None
    if account is None or account.pw_uid == 0:
        raise bad("user must be an existing account other than root")
    if team is None or team.gr_gid == 0 or (team.gr_gid != account.pw_gid and account.pw_name not in team.gr_mem):
        raise bad("group must be an existing group of the user's, other than root")
    with home.folder(parts) as top:
        for _folder, names, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            os.fchown(fd, account.pw_uid, team.gr_gid)
            for name in names + files:
                os.chown(name, account.pw_uid, team.gr_gid, dir_fd=fd, follow_symlinks=False)
        os.fchmod(top, 0o2750)
    return {"owner": account.pw_name, "group": team.gr_name}


ACCOUNT = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
ACCOUNTS = {"prefix": "tcc-"}  # --account-prefix: the only accounts and groups the agent makes or changes


def run_checked(*command):
    """Run a shadow-utils command (no shell; they live in sbin); refused (502) when it fails."""
    program = shutil.which(command[0], path="/usr/sbin:/usr/bin:/sbin:/bin")
    if program is None:
        raise Refused(HTTPStatus.CONFLICT, f"{command[0]} is not installed beside this agent")
    result = subprocess.run([program, *command[1:]], capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    if result.returncode != 0:
        raise Refused(HTTPStatus.BAD_GATEWAY, f"{command[0]}: {(result.stderr or result.stdout).strip()[-300:]}")


def op_account(home, body):
    """The user's account (no login shell, no home of its own) in its project's group, which owns the
    shared home (3770: setgid, and sticky so members cannot rename the console's folders), as on a
    local cluster (clusters/backends/local/accounts.py). Only names with the console's prefix: the
    agent never touches the machine's own accounts."""
    user, group = account_names(body)
    try:
        grp.getgrnam(group)
    except KeyError:
        run_checked("groupadd", "--system", group)
    joined = False
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        run_checked("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", group,
                    "--home-dir", home.root, user)  # fmt: skip
        account = pwd.getpwnam(user)
        joined = True
    team = grp.getgrnam(group)
    if account.pw_gid == left_group():  # a member who left and is back: the project's group is theirs again
        run_checked("usermod", "--gid", group, user)
        joined = True
    elif account.pw_gid != team.gr_gid and user not in team.gr_mem:
        run_checked("usermod", "--append", "--groups", group, user)
        joined = True
    refresh_allowed(group, joined)
    if os.stat(home.root).st_gid != team.gr_gid:
        os.chown(home.root, 0, team.gr_gid)
    # The project's members write here; nobody else reads. Sticky: a member may not rename or delete what
    # is not theirs, so the console's root-owned .tcc/ (code that root runs on every node) stays its own.
    os.chmod(home.root, 0o3770)
    publish_accounts(home)
    return {"user": user, "group": group}


def account_names(body):
    """(user, group) of a request: account names with the console's prefix, or refused (400)."""
    user, group = body.get("user"), body.get("group")
    for what, name in (("user", user), ("group", group)):
        prefix = ACCOUNTS["prefix"]
        if not isinstance(name, str) or not ACCOUNT.match(name) or not name.startswith(prefix):
            raise bad(f"{what} must be an account name starting with {prefix}")
    return user, group


def left_group():
    """The gid of the prefix's group for members who left their project (made the first time): a
    primary group that opens nothing."""
    name = f"{ACCOUNTS['prefix']}left"
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        run_checked("groupadd", "--system", name)
        return grp.getgrnam(name).gr_gid


def op_leave(home, body):
    """A member left the project: their account leaves its group (its primary group becomes the
    prefix's `left` group, which opens nothing), so the shared home (3770), munge's socket and the
    partitions (AllowGroups, refreshed now) no longer admit it, then every job of theirs on this
    cluster is cancelled (what they left running or queued would still read the project's files).
    The account itself stays: its uid owns their files, and a uid freed and reused would hand them
    to whoever got it next."""
    user, group = account_names(body)
    try:
        account, team = pwd.getpwnam(user), grp.getgrnam(group)
    except KeyError:
        return {"user": user, "left": False}
    if account.pw_gid == team.gr_gid:
        run_checked("usermod", "--gid", str(left_group()), user)
    if user in team.gr_mem:
        run_checked("gpasswd", "--delete", user, group)
    refresh_allowed(group, True)
    run_checked("scancel", f"--user={user}")
    publish_accounts(home)
    return {"user": user, "left": True}


def publish_accounts(home):
    """Every account and group of the console's (its prefix) as this machine has them, in the home's
    root-owned .tcc/accounts: the other nodes of a gce cluster make the same names with the same uids
    and gids from it (startup.sh's sync_accounts, from a loop and from each job's Prolog), so a job's
    files on the shared home belong to the same account on every node."""
    prefix = ACCOUNTS["prefix"]
    groups = sorted((g for g in grp.getgrall() if g.gr_name.startswith(prefix)), key=lambda g: g.gr_gid)
    users = sorted((u for u in pwd.getpwall() if u.pw_name.startswith(prefix)), key=lambda u: u.pw_uid)
    lines = [f"group {g.gr_name} {g.gr_gid}" for g in groups]
    lines += [f"user {u.pw_name} {u.pw_uid} {u.pw_gid}" for u in users]
    lines += [f"member {m} {g.gr_name}" for g in groups for m in sorted(g.gr_mem) if m.startswith(prefix)]
    data = base64.b64encode(("\n".join(lines) + "\n").encode()).decode()
    op_write(home, {"path": ".tcc/accounts", "data": data, "mode": 0o644})


def refresh_allowed(group, joined):
    """slurmctld keeps the users of each partition's AllowGroups from its last read (slurm.conf(5),
    AllowGroups: refreshed on a reconfigure, a reset of the value, or every GroupUpdateTime): when an
    account has just joined `group`, set each partition that admits the group to the same value again,
    so the new member can submit now rather than in ten minutes."""
    if not joined:
        return
    shown = scontrol("show", "partition", "--oneliner", check=False)
    for line in shown.stdout.splitlines():
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        allowed = fields.get("AllowGroups", "")
        if group in allowed.split(","):
            scontrol("update", f"PartitionName={fields['PartitionName']}", f"AllowGroups={allowed}")


NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
RESERVATION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


def scontrol(*args, check=True):
    """Run scontrol with `args` (no shell); its result. Refused (502) when Slurm says no."""
    program = shutil.which("scontrol", path=os.environ.get("PATH", "/usr/bin:/bin"))
    if program is None:
        raise Refused(HTTPStatus.CONFLICT, "scontrol is not installed beside this agent")
    try:
        result = subprocess.run([program, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Refused(HTTPStatus.GATEWAY_TIMEOUT, f"scontrol {args[0]} did not answer within 30 s") from None
    if check and result.returncode != 0:
        raise Refused(HTTPStatus.BAD_GATEWAY, f"scontrol {args[0]}: {(result.stderr or result.stdout).strip()[-300:]}")
    return result


def node_arg(body):
    node = body.get("node")
    if not isinstance(node, str) or not NODE.match(node):
        raise bad("node must be a Slurm node name")
    return node


def reason_arg(body):
    reason = body.get("reason", "")
    if not isinstance(reason, str) or not reason.strip() or any(ord(c) < 32 for c in reason):
        raise bad("reason must be one line of text")
    return reason.strip()[:100]


def hold(name, nodes):
    fields = dict(f.split("=", 1) for f in scontrol("show", "reservation", name, "-o", check=False).stdout.split()
                  if "=" in f)  # fmt: skip
    if fields.get("Nodes"):
        nodes = sorted(set(scontrol("show", "hostnames", fields["Nodes"]).stdout.split()) | set(nodes))
        scontrol("update", f"reservationname={name}", f"nodes={','.join(nodes)}")
    else:
        scontrol("create", "reservation", f"reservationname={name}", f"nodes={','.join(nodes)}", "users=root",
                 "starttime=now", "duration=infinite", "flags=flex,ignore_jobs")  # fmt: skip
    return {"done": True, "nodes": nodes}


def release(name):
    """Delete the reservation; {"done": false} while Slurm refuses (a job that asked for it is still
    completing), so the caller can wait and ask again."""
    result = scontrol("delete", f"reservationname={name}", check=False)
    gone = ("Invalid reservation name", "Requested reservation is invalid")
    if result.returncode == 0 or any(text in result.stderr for text in gone):
        return {"done": True}
    return {"done": False, "error": result.stderr.strip()[-300:]}


def op_slurm(home, body):
    action = body.get("action")
    if action == "drain":
        scontrol("update", f"nodename={node_arg(body)}", "state=drain", f"reason={reason_arg(body)}")
    elif action == "down":
        scontrol("update", f"nodename={node_arg(body)}", "state=down", f"reason={reason_arg(body)}")
    elif action == "resume":
        result = scontrol("update", f"nodename={node_arg(body)}", "state=resume", check=False)
        if result.returncode != 0 and "Invalid node state" not in result.stderr:  # not drained: nothing to do
            raise Refused(HTTPStatus.BAD_GATEWAY, f"scontrol update: {result.stderr.strip()[-300:]}")
    elif action == "reconfigure":
        scontrol("reconfigure")
    elif action in ("hold", "release"):
        name = body.get("name")
        if not isinstance(name, str) or not RESERVATION.match(name):
            raise bad("name must be a reservation name")
        if action == "release":
            return release(name)
        nodes = body.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and NODE.match(n) for n in nodes):
            raise bad("nodes must be a list of Slurm node names")
        return hold(name, nodes)
    else:
        raise bad("action must be drain, down, resume, reconfigure, hold or release")
    return {"done": True}


PATH_PREFIX = re.compile(r"/clusters/[a-z0-9][a-z0-9-]{0,62}/[a-z0-9][a-z0-9-]{0,62}/tensorboard\Z")


def unprivileged(home):
    """Popen's arguments to run a reader of users' files as nobody, in the home's group (which lets it
    read the project's runs and nothing else): TensorBoard parses event files users' jobs wrote, and a
    parser bug must not be root's. Nothing to drop when this agent is not root."""
    if os.geteuid() != 0:
        return {}
    gid = os.stat(home.root).st_gid
    return {"user": pwd.getpwnam("nobody").pw_uid, "group": gid, "extra_groups": [gid]}


# TensorBoard on a Unix socket: tensorboard.main only binds TCP, where anything on the host (on local, other
# projects' jobs) could read the runs or take the port while it is free and have the console serve its pages.
# Its Werkzeug server binds "unix://PATH" as it is; only the printed URL and the notebook info file need a port.
TENSORBOARD_LAUNCHER = """# tcc-tensorboard: TensorBoard on a Unix socket (clusters/agent/server.py)
from absl import app
from tensorboard import default, main_lib, program


class UnixSocketServer(program.WerkzeugServer):
    def get_url(self):
        return f"unix:{self.server_address}"


class Board(program.TensorBoard):
    def _register_info(self, server):
        pass  # the info file for notebooks' %tensorboard wants a TCP port


main_lib.global_init()
board = Board(plugins=default.get_plugins(), server_class=UnixSocketServer)
app.run(board.main, flags_parser=board.configure)
"""
PROXY_SKIPS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TensorBoard:
    """At most one TensorBoard for the home's runs folder, started on demand, as nobody, on a Unix socket in
    a folder only nobody (and root) enters; the agent alone reaches it, and relays the console's requests."""

    def __init__(self, python, socket_dir):
        self.python, self.socket_dir, self.process, self.prefix = python, socket_dir, None, None
        self.socket = os.path.join(socket_dir, "tb.sock")
        self.lock = threading.Lock()

    def answers(self):
        try:
            with contextlib.closing(UnixHTTPConnection(self.socket, timeout=0.5)) as connection:
                connection.connect()
            return True
        except OSError:
            return False

    def start(self, home, prefix, timeout=30):
        with self.lock:
            if self.process is not None and self.process.poll() is None and self.prefix == prefix:
                return
            self.stop_locked()
            logdir = os.path.join(home.root, "runs")
            os.makedirs(logdir, exist_ok=True)
            user = unprivileged(home)
            os.makedirs(self.socket_dir, mode=0o700, exist_ok=True)
            if user:
                os.chown(self.socket_dir, user["user"], 0)
            os.chmod(self.socket_dir, 0o700)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)
            log = open(os.path.join(os.path.dirname(home.root), "tensorboard.log"), "ab")  # noqa: SIM115
            self.process = subprocess.Popen(
                [self.python, "-c", TENSORBOARD_LAUNCHER, "--logdir", logdir, "--host", f"unix://{self.socket}",
                 "--port", "0", "--path_prefix", prefix, "--reload_interval", "5"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HOME": "/nonexistent"}, **user,
            )  # fmt: skip
            log.close()
            self.prefix = prefix
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.answers():
                    return
                if self.process.poll() is not None:
                    break
                time.sleep(0.2)
            self.stop_locked()
            raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "TensorBoard did not start; see tensorboard.log")

    def request(self, method, path, body, content_type):
        """(status, headers, body) of TensorBoard's answer to one of the console's requests, under its prefix."""
        headers = {"Content-Type": content_type} if body is not None and content_type else {}
        with contextlib.closing(UnixHTTPConnection(self.socket, timeout=60)) as connection:
            connection.request(method, f"{self.prefix}/{path}", body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
            return answer.status, [(k, v) for k, v in answer.getheaders() if k.lower() not in PROXY_SKIPS], data

    def stop(self):
        with self.lock:
            self.stop_locked()

    def stop_locked(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process, self.prefix = None, None


def op_tensorboard(home, body, tensorboard):
    action, prefix = body.get("action"), body.get("path_prefix")
    if action not in ("start", "stop") or (
        action == "start" and (not isinstance(prefix, str) or not PATH_PREFIX.match(prefix))
    ):
        raise bad("action must be start or stop; path_prefix /clusters/<project>/<cluster>/tensorboard")
    if tensorboard is None:
        raise Refused(HTTPStatus.CONFLICT, "TensorBoard is not installed on this cluster's agent")
    if action == "stop":
        tensorboard.stop()
        return {"stopped": True}
    tensorboard.start(home, prefix)
    return {"started": True}


OPERATIONS = {"stat": op_stat, "read": op_read, "tail": op_tail, "list": op_list, "write": op_write,
              "own": op_own, "slurm": op_slurm, "account": op_account, "leave": op_leave, "prune": op_prune,
              "move": op_move, "upload": op_upload}  # fmt: skip


def handler_for(home, key, tensorboard=None, certificate=None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "tcc-agent/1"

        def log_message(self, format, *args):
            sys.stderr.write(f"{self.address_string()} {format % args}\n")  # no headers, no bodies

        def answer(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if status >= 400:
                self.send_header("X-Agent-Error", "1")  # the agent's own refusal, not a relayed answer
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path.startswith("/tensorboard/"):
                return self.guarded(self.relay_tensorboard)
            self.answer(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "use POST /v1/<operation>"})

        do_HEAD = do_GET

        def do_POST(self):
            if self.path.startswith("/tensorboard/"):
                return self.guarded(self.relay_tensorboard)
            self.guarded(lambda: self.answer(HTTPStatus.OK, self.handle_post()))

        def guarded(self, work):
            try:
                work()
            except Refused as exc:
                self.answer(exc.status, {"error": str(exc)})
            except OSError as exc:
                self.answer(HTTPStatus.CONFLICT, {"error": f"{type(exc).__name__}: {exc.strerror or exc}"})
            except http.client.HTTPException as exc:  # TensorBoard answered something that is not HTTP
                self.answer(HTTPStatus.BAD_GATEWAY, {"error": f"TensorBoard: {type(exc).__name__}"})

        def read_body(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large")
            return self.rfile.read(length)

        def check_key(self):
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), b"Bearer " + key):
                raise Refused(HTTPStatus.UNAUTHORIZED, "a valid agent key is required")

        def relay_tensorboard(self):
            """GET|HEAD|POST /tensorboard/<path> with X-TensorBoard-Prefix: TensorBoard's answer (started first
            if need be, with that prefix); the agent's own refusals carry X-Agent-Error."""
            self.check_key()
            if tensorboard is None:
                raise Refused(HTTPStatus.CONFLICT, "TensorBoard is not installed on this cluster's agent")
            prefix = self.headers.get("X-TensorBoard-Prefix", "")
            if not PATH_PREFIX.match(prefix):
                raise bad("X-TensorBoard-Prefix must be /clusters/<project>/<cluster>/tensorboard")
            body = self.read_body() if self.command == "POST" else None
            tensorboard.start(home, prefix)
            status, headers, data = tensorboard.request(
                self.command, self.path.removeprefix("/tensorboard/"), body, self.headers.get("Content-Type")
            )
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def handle_post(self):
            self.check_key()
            name = self.path.removeprefix("/v1/")
            if not self.path.startswith("/v1/") or (name not in OPERATIONS and name not in ("tensorboard", "tls")):
                raise Refused(HTTPStatus.NOT_FOUND, "unknown operation")
            try:
                body = json.loads(self.read_body() or b"{}")
            except ValueError:
                raise bad("the body must be JSON") from None
            if not isinstance(body, dict):
                raise bad("the body must be a JSON object")
            if name == "tensorboard":
                return op_tensorboard(home, body, tensorboard)
            if name == "tls":
                return op_tls(body, certificate)
            return OPERATIONS[name](home, body)

    return Handler


HANDSHAKE_SECONDS = 10  # a client that has not finished its TLS handshake by then is dropped
IDLE_SECONDS = 300  # a connection with nothing to say for this long is closed


def server_context(bundle):
    """TLS 1.2+ with the controller's key and certificate (the cluster's CA after it, in one PEM file)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(bundle)
    return context


class Certificate:
    """The controller's TLS bundle (a root-only file) and the context that serves it. `install` replaces both
    at once, so a rotation (the console's `tls` call) switches new connections to the new certificate while
    the ones already open go on; the file is what a restarted agent serves."""

    def __init__(self, path):
        self.path = path
        self.context = server_context(path)

    def install(self, pem):
        partial = f"{self.path}.partial"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "w") as handle:
            handle.write(pem)
        try:
            context = server_context(partial)  # a key that does not match its certificate fails here
        except (ssl.SSLError, OSError) as exc:
            os.unlink(partial)
            raise bad(f"not a controller bundle (a key, its certificate, the CA's): {exc}") from None
        os.replace(partial, self.path)
        self.context = context


def op_tls(body, certificate):
    """{"bundle": PEM}: serve this key and certificate from now on (the file and the live context)."""
    if certificate is None:
        raise Refused(HTTPStatus.CONFLICT, "this agent serves no TLS")
    pem = body.get("bundle")
    if not isinstance(pem, str) or "PRIVATE KEY-----" not in pem:
        raise bad("bundle must be the controller's PEM bundle")
    certificate.install(pem)
    return {"installed": True}


class AgentServer(ThreadingHTTPServer):
    """The agent's HTTP server, over TLS when given a context: each connection's handshake runs in its own
    thread, with a time limit, so a client that stalls holds up no other."""

    daemon_threads = True
    # Connections a burst may leave waiting for accept() (a worker's parallel part uploads, TensorBoard's
    # page fetching dozens of files through the console, the sync's reads): Python's default of 5 had the
    # kernel drop the SYNs beyond it, each retried 1 s later, then 3, 7, ... s, failing after 127 s.
    request_queue_size = 1024

    def __init__(self, address, handler, certificate=None):
        self.certificate = certificate
        super().__init__(address, handler)

    def get_request(self):
        connection, address = self.socket.accept()
        if self.certificate is None:
            return connection, address
        connection.settimeout(HANDSHAKE_SECONDS)
        context = self.certificate.context
        return context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request, client_address):
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except (OSError, ssl.SSLError) as exc:  # not our client (no trust in our CA), or a port scan
                sys.stderr.write(f"{client_address[0]} TLS handshake failed: {exc}\n")
                return
            request.settimeout(IDLE_SECONDS)
        super().finish_request(request, client_address)


class SlurmrestdRelay:
    """TLS on `listen` (HOST:PORT), each connection relayed byte for byte to slurmrestd's Unix socket: slurmrestd
    22.05 has no TLS, and on its socket (in its own account's 0700 folder) only the relay reaches it. One thread per
    connection reads and writes both sides (an SSL socket is never used by two threads at once)."""

    def __init__(self, listen, target, certificate):
        host, _, port = listen.rpartition(":")
        self.target, self.certificate = target, certificate
        self.socket = socket.create_server((host, int(port)), reuse_port=False)

    def serve_forever(self):
        while True:
            connection, address = self.socket.accept()
            threading.Thread(target=self.relay, args=(connection, address), daemon=True).start()

    def relay(self, connection, address):
        connection.settimeout(HANDSHAKE_SECONDS)
        try:
            client = self.certificate.context.wrap_socket(connection, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            sys.stderr.write(f"{address[0]} TLS handshake failed (slurmrestd relay): {exc}\n")
            connection.close()
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.settimeout(IDLE_SECONDS)
            upstream.settimeout(IDLE_SECONDS)
            upstream.connect(self.target)
            pump(client, upstream)
        except OSError as exc:
            sys.stderr.write(f"{address[0]} slurmrestd relay: {exc}\n")
        finally:
            upstream.close()
            client.close()


def pump(client, upstream):
    """Copy bytes both ways until either side closes or stays silent for IDLE_SECONDS."""
    peers = {client: upstream, upstream: client}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        while True:
            # Bytes TLS has already decrypted wait in the SSL object, not in the socket: no select for those.
            ready = [client] if client.pending() else [key.fileobj for key, _ in selector.select(IDLE_SECONDS)]
            if not ready:
                return
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                peers[sock].sendall(data)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--listen", default="127.0.0.1:6821")
    parser.add_argument("--slurm-conf", help="the cluster's slurm.conf, when not /etc/slurm/slurm.conf")
    parser.add_argument(
        "--tensorboard-python", help="a Python with tensorboard installed (enables the tensorboard operation)"
    )
    parser.add_argument(
        "--tensorboard-socket-dir",
        default="/run/tcc-tensorboard",
        help="the folder of TensorBoard's Unix socket (made, nobody's, 0700); the agent relays the console to it",
    )
    parser.add_argument("--account-prefix", default=ACCOUNTS["prefix"], help="the console's POSIX account prefix")
    parser.add_argument(
        "--port-file", help="write the port it listens on here once it does (with --listen HOST:0, a free one)"
    )
    parser.add_argument(
        "--tls-bundle",
        help="serve TLS with this PEM file (the controller's key, its certificate, the cluster's CA; clusters/tls.py)",
    )
    parser.add_argument(
        "--slurmrestd-relay",
        metavar="HOST:PORT=SOCKET",
        help="also serve TLS on HOST:PORT, relayed to slurmrestd's Unix socket SOCKET (needs --tls-bundle)",
    )
    args = parser.parse_args(argv)
    if args.slurm_conf:
        os.environ["SLURM_CONF"] = args.slurm_conf
    with open(args.key_file, "rb") as handle:
        key = binascii.hexlify(handle.read())  # the file holds random bytes; clients send their hex
    host, _, port = args.listen.rpartition(":")
    ACCOUNTS["prefix"] = args.account_prefix
    tensorboard = TensorBoard(args.tensorboard_python, args.tensorboard_socket_dir) if args.tensorboard_python else None
    certificate = Certificate(args.tls_bundle) if args.tls_bundle else None
    if args.slurmrestd_relay:
        if certificate is None:
            parser.error("--slurmrestd-relay needs --tls-bundle")
        listen, _, target = args.slurmrestd_relay.partition("=")
        relay = SlurmrestdRelay(listen, target, certificate)
        threading.Thread(target=relay.serve_forever, daemon=True).start()
    handler = handler_for(Home(args.home), key, tensorboard, certificate)
    server = AgentServer((host, int(port)), handler, certificate)
    if args.port_file:
        partial = f"{args.port_file}.partial"
        with open(partial, "w") as handle:
            handle.write(str(server.server_address[1]))
        os.replace(partial, args.port_file)
    # A stop (SIGTERM) ends the serving loop, so that TensorBoard (in a session of its own) stops with the agent.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        if tensorboard is not None:
            tensorboard.stop()


if __name__ == "__main__":
    main()
