"""Virtual machines for the fake Compute API (tests/fake_compute.py): each instance it creates boots.

A VM here is a process tree on this machine with namespaces of its own, so the instance's real
startup script runs as it would on Compute Engine:

- a network namespace with one NIC (`eth0`) on a bridge that stands for the VPC; the fake API and its
  metadata server answer on the bridge's gateway address, and the console reaches the controller's
  slurmrestd and agent at the instance's internal address, as it would from inside the VPC;
- a UTS namespace (the host name is the instance name) and a PID namespace (resetting the VM kills
  everything in it at once, as a reset does);
- a mount namespace in which the VM's own folder is bound over the paths a VM keeps to itself
  (/etc, copied from this machine's at first boot: its accounts are the VM's own; /var/spool, /var/log,
  /var/lib/munge, a fresh /run),
  /etc/hosts is the VPC's DNS (every instance of the fake by name), and /home is the cluster's
  Filestore share, a folder of the fake's, bound as its NFS mount would be. The rest (programs,
  libraries, accounts, and /tmp, where a checkout and its virtualenv may live) is this machine's: the
  image.

What the VM prints goes to its serial console (instances.getSerialPortOutput). The startup script is
fetched from the metadata server, like Google's guest agent does, and runs with GCE_METADATA_HOST
pointing at the fake and TCC_SIMULATED_VM=1, the script's one switch (package installs, cloud mounts,
cgroup process tracking). Needs root (namespaces, a bridge, veth pairs): CI and this machine run as root.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path

HOME_SHARE = re.compile(r"^HOME_SHARE='([^']*)'", re.MULTILINE)
# Each VPC's owner: a test run killed before it stopped its fake leaves VMs running; the next VPC reaps them.
OWNERS = Path("/run/tcc-fake-vpcs")
VM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# PID 1 of the VM: the mounts, the host name, then the startup script from the metadata server, then
# reap orphans for ever (the daemons the script started live on under it).
INIT = r"""
set -u
R=$1 NAME=$2 SHARE=$3 HOSTS=$4 META=$5 RESOLV=$6
for path in etc var/spool var/log var/lib/munge; do
  mount --bind "$R/$path" "/$path"
done
mount --bind "$HOSTS" /etc/hosts
mount --bind "$RESOLV" /etc/resolv.conf
mount --bind "$SHARE" /home
mount -t tmpfs -o mode=0755 tmpfs /run
hostname "$NAME"
echo "tcc-vm: $NAME booting"
curl -sf --retry 6 --retry-delay 1 --retry-connrefused -H Metadata-Flavor:Google \
  "http://$META/computeMetadata/v1/instance/attributes/startup-script" \
  > /run/startup-script || echo "tcc-vm: no startup-script in the metadata"
if [ -s /run/startup-script ]; then
  GCE_METADATA_HOST=$META TCC_SIMULATED_VM=1 HOME=/root LANG=C.UTF-8 bash /run/startup-script 2>&1 \
    | sed -u 's/^/google_metadata_script_runner: startup-script: /'
fi
trap : CHLD
while :; do sleep 3600 & wait $! 2>/dev/null; done
"""


def image_etc_skips(folder, names):
    """What a VM's copy of this machine's /etc leaves out: Slurm's and munge's files (the VM makes its own)
    and anything that is not a file, a folder or a link."""
    if folder in ("/etc/slurm", "/etc/munge"):
        return names
    return [
        n for n in names if not (os.path.islink(p := os.path.join(folder, n)) or os.path.isfile(p) or os.path.isdir(p))
    ]


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class VPC:
    """One bridge (the VPC), its gateway address and the VMs on it, by instance name."""

    def __init__(self, root):
        reap_stale()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.id = uuid.uuid4().hex[:6]
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.id).write_text(str(os.getpid()))
        self.bridge = f"tccb{self.id}"
        self.subnet = self._free_subnet()
        self.gateway = f"{self.subnet}.1"
        self.vms = {}
        self.made = 0  # VMs made so far: each one's netns and veth names
        self.next_host = 2
        self.next_external = 254
        self.lock = threading.RLock()
        self.hosts = self.root / "hosts"
        self.shares = self.root / "shares"
        self.hosts.write_text("127.0.0.1 localhost\n")
        # No DNS server in the fake VPC: /etc/hosts answers, and any other name fails at once (this
        # machine's resolver is out of the VMs' reach, and each lookup of it waited 5 s twice).
        self.resolv = self.root / "resolv.conf"
        self.resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    @staticmethod
    def _free_subnet():
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        for third in range(10, 250):
            if f" 10.251.{third}." not in used:
                return f"10.251.{third}"
        raise RuntimeError("no free 10.251.x.0/24 subnet for the fake VPC")

    def external_address(self):
        """An external address for an access config: from the top of the VPC's range (internal ones come
        from the bottom), so the console reaches it on the bridge."""
        with self.lock:
            if self.next_external < self.next_host:
                raise RuntimeError("the fake VPC has no address left")
            address = f"{self.subnet}.{self.next_external}"
            self.next_external -= 1
            return address

    def address(self):
        with self.lock:
            if self.next_host > self.next_external:
                raise RuntimeError("the fake VPC has no address left")
            address = f"{self.subnet}.{self.next_host}"
            self.next_host += 1
            return address

    def share(self, home_share):
        """The folder that stands for a Filestore share (e.g. 10.90.1.2:/home)."""
        folder = self.shares / re.sub(r"[^A-Za-z0-9_.-]", "_", home_share)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def write_hosts(self):
        """The VPC's DNS: every VM by name. Rewritten in place (VMs bind this very file)."""
        lines = ["127.0.0.1 localhost", f"{self.gateway} metadata.google.internal",
                 *(f"{vm.address} {name}" for name, vm in sorted(self.vms.items()))]  # fmt: skip
        text = "\n".join(lines) + "\n"
        with open(self.hosts, "r+") as handle:
            old = len(handle.read())
            handle.seek(0)
            handle.write(text + "#" * max(0, old - len(text) - 1) + ("\n" if old > len(text) else ""))
            handle.truncate()

    def boot(self, name, address, metadata_host, script, external=None):
        with self.lock:
            vm = self.vms.get(name)
            if vm is None:
                self.made += 1
                vm = self.vms[name] = VM(self, name, address, self.made, external)
                self.write_hosts()
            vm.boot(metadata_host, script)
            return vm

    def firewall(self, name, ports, external=None):
        """Admit the console's new TCP connections (from the gateway: this machine) to the VM at `ports`
        ([(low, high)]) and drop every other, as Google's implied deny-ingress rule does to what no firewall
        rule allows (https://cloud.google.com/firewall/docs/firewalls#default_firewall_rules); with
        `external` (the VM's external address, when the console has no route to its network) only the
        connections made to that address. Only connection starts are judged (--syn): answers to the VM's
        own requests (the metadata server's) pass."""
        with self.lock:
            vm = self.vms.get(name)
            if vm is None:
                return
            ns = ["ip", "netns", "exec", vm.netns, "iptables"]
            subprocess.run([*ns, "-N", "TCC-FIREWALL"], capture_output=True)  # exists after the first time
            subprocess.run([*ns, "-F", "TCC-FIREWALL"], check=True, capture_output=True)
            jump = ["INPUT", "-s", self.gateway, "-p", "tcp", "--syn", "-j", "TCC-FIREWALL"]
            if subprocess.run([*ns, "-C", *jump], capture_output=True).returncode != 0:
                subprocess.run([*ns, "-I", *jump], check=True, capture_output=True)
            if external:  # the NAT below made it the internal address: judge where the connection was made to
                subprocess.run([*ns, "-A", "TCC-FIREWALL", "-m", "conntrack", "!", "--ctorigdst", external, "-j",
                                "DROP"], check=True, capture_output=True)  # fmt: skip
            for low, high in ports:
                subprocess.run([*ns, "-A", "TCC-FIREWALL", "-p", "tcp", "--dport", f"{low}:{high}", "-j", "ACCEPT"],
                               check=True, capture_output=True)  # fmt: skip
            subprocess.run([*ns, "-A", "TCC-FIREWALL", "-j", "DROP"], check=True, capture_output=True)

    def halt(self, name):
        with self.lock:
            if name in self.vms:
                self.vms[name].halt()

    def destroy(self, name):
        with self.lock:
            vm = self.vms.pop(name, None)
            if vm is not None:
                vm.destroy()
                self.write_hosts()

    def serial(self, name):
        vm = self.vms.get(name)
        return vm.serial.read_text(errors="replace") if vm is not None and vm.serial.exists() else None

    def close(self):
        with self.lock:
            for name in list(self.vms):
                self.destroy(name)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        (OWNERS / self.id).unlink(missing_ok=True)


def reap_stale():
    """Power off and remove the VMs, network namespaces and bridge of every VPC whose test process is gone."""
    for owner in OWNERS.glob("*") if OWNERS.exists() else ():
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its test run is alive
        except (ProcessLookupError, ValueError):
            pass
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for name in [n for n in namespaces if n.startswith(f"tccv{owner.name}-")]:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", f"tccb{owner.name}"], capture_output=True)
        owner.unlink(missing_ok=True)


class VM:
    def __init__(self, vpc, name, address, number, external=None):
        self.vpc, self.name, self.address = vpc, name, address
        self.folder = vpc.root / "vms" / name
        self.serial = self.folder / "serial.log"
        self.netns = f"tccv{vpc.id}-{number}"
        self.veth = f"tv{vpc.id}-{number}"
        self.process = None
        ip("netns", "add", self.netns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("link", "set", self.veth, "master", vpc.bridge, "up")
        ip("-n", self.netns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "route", "add", "default", "via", vpc.gateway)
        if external:
            # Google's one-to-one NAT: the VM never holds its external address, connections to it arrive at
            # its internal one. Here the NIC answers for it and rewrites it to the internal address.
            ip("-n", self.netns, "addr", "add", f"{external}/32", "dev", "eth0")
            nat = ["ip", "netns", "exec", self.netns, "iptables", "-t", "nat"]
            subprocess.run([*nat, "-A", "PREROUTING", "-d", external, "-j", "DNAT", "--to-destination", address],
                           check=True, capture_output=True)  # fmt: skip

    def disk(self):
        """The VM's own folders (its boot disk), made on first boot and kept across resets."""
        if not (self.folder / "etc").exists():
            # The image's /etc, the VM's own from then on: its accounts (passwd, group, shadow) above all,
            # which the console's agent changes on the controller alone; Slurm's and munge's start empty.
            shutil.copytree("/etc", self.folder / "etc", symlinks=True, ignore=image_etc_skips)
        for path in ("etc/slurm", "etc/munge", "var/spool", "var/log", "var/lib/munge", "home"):
            (self.folder / path).mkdir(parents=True, exist_ok=True)

    def boot(self, metadata_host, script):
        if self.running:
            return
        self.disk()
        found = HOME_SHARE.search(script or "")
        share = self.vpc.share(found.group(1)) if found and found.group(1) else self.folder / "home"
        with open(self.serial, "ab") as serial:
            self.process = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--uts", "--pid", "--fork",
                 "--kill-child", "--mount-proc", "--propagation", "private",
                 "bash", "-c", INIT, "tcc-vm-init", str(self.folder), self.name, str(share), str(self.vpc.hosts),
                 metadata_host, str(self.vpc.resolv)],
                stdin=subprocess.DEVNULL, stdout=serial, stderr=serial, start_new_session=True,
                env={"PATH": VM_PATH}, cwd=self.folder,  # a daemon's core file stays on the VM's own disk
            )  # fmt: skip

    @property
    def running(self):
        return self.process is not None and self.process.poll() is None

    def halt(self):
        """Power off: everything in the VM's PID namespace dies with its init (unshare --kill-child)."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def destroy(self):
        self.halt()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)
