"""The cluster's files, for pages, recipes and health: through the cluster agent, never a folder the
console opens itself. Paths are relative to the cluster's shared home (e.g. "runs/<id>/metrics.jsonl");
the agent refuses anything that leads outside it. Failures are ConsoleErrors: Unavailable (503) when
the agent does not answer, Conflict when it refuses (no such file, a path outside the home)."""

import secrets

from console.errors import Conflict, Unavailable

from ..backends import get_backend
from ..work import BackendError, heartbeat


def agent_call(cluster, operation, *args, **kwargs):
    try:
        return getattr(get_backend(cluster.backend).agent(cluster), operation)(*args, **kwargs)
    except BackendError as exc:
        raise failure(exc) from None


def failure(exc):
    """The ConsoleError for a backend's error: Unavailable when trying again may do, Conflict otherwise."""
    return (Unavailable if exc.retryable else Conflict)(str(exc))


def file_exists(cluster, path):
    return agent_call(cluster, "stat", path)["exists"]


def read_file(cluster, path, offset=0, limit=1 << 20):
    """Up to `limit` bytes of the file from `offset` (b"" past its end)."""
    return agent_call(cluster, "read", path, offset=offset, limit=limit)


def tail_file(cluster, path, lines=40):
    return agent_call(cluster, "tail", path, lines=lines)


def list_files(cluster, path, pattern="*"):
    """Names in the folder matching `pattern` (sorted); [] when the folder does not exist."""
    if not file_exists(cluster, path):
        return []
    return agent_call(cluster, "list", path, pattern)


def file_sizes(cluster, path, pattern="*"):
    """{name: bytes} of the files (not folders) in the folder matching `pattern`; {} when it does not exist."""
    sizes = {}
    for name in list_files(cluster, path, pattern):
        found = agent_call(cluster, "stat", f"{path}/{name}")
        if found["exists"] and not found["is_dir"]:
            sizes[name] = found["size"]
    return sizes


def tensorboard_request(cluster, path_prefix, method, path, body=None, content_type=""):
    """(status, headers, body): the cluster's TensorBoard's answer, relayed by the agent (TensorBoard listens
    on a Unix socket on the controller that only the agent reaches); the console serves it behind its login."""
    return agent_call(cluster, "relay_tensorboard", path_prefix, method, path, body, content_type)


def stop_tensorboard(cluster):
    return agent_call(cluster, "stop_tensorboard")


def write_file(cluster, path, data, mode=0o640):
    """Write the file atomically (its folders made as needed)."""
    if isinstance(data, str):
        data = data.encode()
    return agent_call(cluster, "write", path, data, mode=mode)


def prune_files(cluster, path, older_than):
    """Remove the folder's entries last changed before `older_than` (Unix time); how many went."""
    return agent_call(cluster, "prune", path, older_than)


def upload_parts(cluster, path, parts, at_once=1):
    """The cluster's agent sends, for each of `parts` ((key, url, offset, length, headers)), the file's
    bytes [offset, offset + length) to `url`, a URL signed for one part of a multipart upload into the
    registry's artifact store: the bytes go from the cluster to the store, not through the console.
    `at_once` parts are in flight at a time; yields (key, the part's {"etag", "bytes"}) as each ends. The
    first failure is raised (Conflict when the file is gone or shorter, or the store refused the part):
    parts not yet begun are dropped, those under way end on their own (the caller aborts the upload, so
    the store keeps none of them)."""
    try:
        yield from get_backend(cluster.backend).agent(cluster).uploads(path, parts, at_once)
    except BackendError as exc:
        raise failure(exc) from None


PART = 4 << 20  # the agent's largest read and write


def download_folder(cluster, path, target, files=None):
    """Copy the files of the cluster's folder `path` (not its subfolders) into the local folder
    `target`, in parts; returns the bytes copied. `files`: what file_sizes() already found there."""
    target.mkdir(parents=True, exist_ok=True)
    total = 0
    for name in file_sizes(cluster, path) if files is None else files:
        with (target / name).open("wb") as handle:
            offset = 0
            while chunk := read_file(cluster, f"{path}/{name}", offset=offset, limit=PART):
                handle.write(chunk)
                offset += len(chunk)
                heartbeat(f"{(total + offset) >> 20} MiB copied")  # in an operation
        total += offset
    return total


def upload_folder(cluster, source, path, mode=0o644):
    """Copy the local folder `source`'s files to the cluster's folder `path`, which appears whole or not
    at all (written beside it, then moved); a folder already there is kept (the same content, staged by
    someone else first). Returns whether this call put it there."""

    if file_exists(cluster, path):
        return False
    staging = f"{path}.partial-{secrets.token_hex(4)}"
    files = sorted(p for p in source.iterdir() if p.is_file())
    total, done = sum(f.stat().st_size for f in files), 0
    for file in files:
        with file.open("rb") as handle:
            chunk, offset = handle.read(PART), 0
            while True:  # the first part even when it is empty: an empty file is still written
                agent_call(cluster, "write", f"{staging}/{file.name}", chunk, mode=mode, offset=offset)
                offset += len(chunk)
                done += len(chunk)
                heartbeat(f"{100 * done // max(total, 1)}% of {total >> 20} MiB copied")  # in an operation
                chunk = handle.read(PART)
                if not chunk:
                    break
    try:
        agent_call(cluster, "move", staging, path)
    except Conflict:
        if not file_exists(cluster, path):
            raise
        return False
    return True
