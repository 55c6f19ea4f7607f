"""Users' POSIX accounts on this machine (the local cluster's every node), and the project group that
owns a cluster's shared home. Made with the shadow-utils every Debian has; idempotent."""

import grp
import os
import pwd
import subprocess

from ...work import PermanentBackendError, TransientBackendError


def run(*command):
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise TransientBackendError(f"{command[0]} did not finish within 30 s") from None
    if result.returncode != 0:
        raise PermanentBackendError(f"{command[0]} failed: {(result.stderr or result.stdout).strip()[-300:]}")


def exists(lookup, name):
    try:
        lookup(name)
    except KeyError:
        return False
    return True


def ensure(account, home):
    """The account (no login shell, no home of its own) in its project group, which owns `home`."""
    if not exists(grp.getgrnam, account.group):
        run("groupadd", "--system", account.group)
    if not exists(pwd.getpwnam, account.name):
        run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", account.group,
            "--home-dir", str(home), account.name)  # fmt: skip
    elif account.group not in {g.gr_name for g in grp.getgrall() if account.name in g.gr_mem} and (
        pwd.getpwnam(account.name).pw_gid != grp.getgrnam(account.group).gr_gid
    ):
        run("usermod", "--append", "--groups", account.group, account.name)
    gid = grp.getgrnam(account.group).gr_gid
    if home.stat().st_gid != gid:
        os.chown(home, 0, gid)
    home.chmod(0o2770)  # the project's members write here; nobody else reads


def remove(prefix):
    """Every account and group whose name starts with `prefix` (the tests' clean-up)."""
    for user in pwd.getpwall():
        if user.pw_name.startswith(prefix):
            subprocess.run(["userdel", user.pw_name], capture_output=True, check=False)
    for group in grp.getgrall():
        if group.gr_name.startswith(prefix):
            subprocess.run(["groupdel", group.gr_name], capture_output=True, check=False)
