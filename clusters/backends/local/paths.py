"""Where a local cluster lives: one folder per cluster under LOCAL_CLUSTERS_DIR, and its secrets."""

import contextlib
import grp
import os
import pwd
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from ... import tls
from ...work import PermanentBackendError
from . import preflight


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @property
    def conf(self):
        return self.root / "slurm.conf"

    @property
    def secrets(self):
        return self.root / "secrets"

    @property
    def munge_key(self):
        return self.secrets / "munge.key"

    @property
    def jwt_key(self):
        return self.secrets / "jwt_hs256.key"

    @property
    def agent_key(self):
        return self.secrets / "agent.key"

    @property
    def tls_bundle(self):
        """The controller's TLS key and certificate, with the cluster's CA (clusters/tls.py)."""
        return self.secrets / "tls.pem"

    @property
    def run(self):
        """slurmrestd's own folder (SLURMRESTD_USER's, 0700): its socket, which only the agent's TLS relay
        (root) reaches besides slurmrestd; no member's process can take its place there."""
        return self.root / "run"

    @property
    def slurmrestd_socket(self):
        return self.run / "slurmrestd.sock"

    @property
    def tensorboard(self):
        """TensorBoard's socket folder (nobody's, 0700; the agent makes it): only the agent relays to it."""
        return self.root / "tensorboard"

    @property
    def munge_dir(self):
        return self.root / "munge"

    @property
    def munge_socket(self):
        return self.munge_dir / "munge.socket"

    @property
    def state(self):
        return self.root / "state"

    @property
    def spool(self):
        return self.root / "spool"

    @property
    def logs(self):
        return self.root / "log"

    @property
    def jobs(self):
        """Where job output goes by default: the cluster's shared 'home'."""
        return self.root / "home"

    @property
    def health_check(self):
        return self.root / "healthcheck.sh"

    def hook(self, kind):
        """The Prolog or Epilog script (clusters/slurm/hooks.py)."""
        return self.root / f"{kind}.sh"

    @property
    def faults(self):
        """Fault files of rehearsals (clusters/health/faults.py writes them through the agent)."""
        return self.jobs / ".tcc" / "faults"


def paths_for(cluster):
    return ClusterPaths(Path(settings.LOCAL_CLUSTERS_DIR) / f"c{cluster.pk}")


def write_secret(path, size=None, make=None):
    """A key file (`size` random bytes, or what make() returns), readable by root alone, written once (tmp +
    rename, so never half a key)."""
    if not path.exists():
        replace_secret(path, make() if make else secrets.token_bytes(size))


def replace_secret(path, data):
    """The key file `path` holds `data` from now on (root's alone; tmp + rename, never half a key)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def prepare(paths, group):
    """Check this machine's Slurm, then make the cluster's folders and keys (idempotent). Every project's
    jobs run on this one machine, so the cluster's munge socket (whoever reaches it can have munged
    vouch for them to this cluster's slurmctld) is in a folder only the project's group enters."""
    missing = preflight.problem()
    if missing:
        raise PermanentBackendError(missing)
    for folder in (paths.root, paths.munge_dir, paths.state, paths.spool, paths.logs, paths.jobs):
        folder.mkdir(parents=True, exist_ok=True)
    gid = ensure_group(group)
    os.chown(paths.munge_dir, 0, gid)
    paths.munge_dir.chmod(0o750)
    paths.secrets.mkdir(mode=0o700, exist_ok=True)
    write_secret(paths.munge_key, 128)
    write_secret(paths.jwt_key, 32)
    write_secret(paths.agent_key, 32)
    write_secret(paths.tls_bundle, make=lambda: tls.controller_bundle(paths.root.name))
    paths.run.mkdir(mode=0o700, exist_ok=True)
    account = ensure_service_account(SLURMRESTD_USER)
    os.chown(paths.run, account.pw_uid, account.pw_gid)
    paths.run.chmod(0o700)
    blocked = [str(p) for p in paths.root.parents if p.stat().st_mode & 0o001 == 0]
    if blocked:
        # slurmrestd runs as nobody and must reach slurm.conf.
        raise PermanentBackendError(
            f"LOCAL_CLUSTERS_DIR must be reachable by every user; {blocked[0]} is not (chmod o+x)"
        )
    if max(len(str(p)) for p in (paths.munge_socket, paths.slurmrestd_socket, paths.tensorboard / "tb.sock")) > 100:
        raise PermanentBackendError(
            f"LOCAL_CLUSTERS_DIR is too deep for munge's socket ({paths.munge_socket}); choose a shorter path"
        )


# slurmrestd's account. slurmrestd(8) for -u: "a unique user with no write access or special permissions. Do
# not set this user to SlurmUser or root" (https://slurm.schedmd.com/slurmrestd.html); and it creates its
# Unix socket as that user. nobody would share the socket's folder with TensorBoard, which runs as nobody.
SLURMRESTD_USER = "tcc-slurmrestd"


def ensure_service_account(name):
    """A system account with no home and no shell (made if missing); its passwd entry."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise PermanentBackendError(f"useradd {name}: {done.stderr.strip()}") from None
        return pwd.getpwnam(name)


def ensure_group(group):
    """The project's POSIX group on this machine (made if missing); its gid."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        done = subprocess.run(["groupadd", "--system", group], capture_output=True, text=True, timeout=30)
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise PermanentBackendError(f"groupadd {group}: {done.stderr.strip()}") from None
        return grp.getgrnam(group).gr_gid
