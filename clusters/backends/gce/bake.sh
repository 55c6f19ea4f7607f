#!/bin/bash
# The node image's bake (clusters/backends/gce/image.py): run once, as the startup script of a builder
# VM with an external address, on Debian 12 (CPU nodes) or Ubuntu's accelerator image (GPU nodes: the
# NVIDIA driver is there already). It installs what startup.sh would otherwise fetch at every boot, so
# nodes without a route to the internet boot: munge, Slurm's daemons and clients with the JWT plugin,
# the NFS client, gcsfuse, and the node runtime (Python with numpy and torch) in /opt/tcc/venv. It ends
# with `tcc-startup: done`, or `tcc-startup: FAILED: <what>`, on the serial console.
set -uo pipefail

GPU="@GPU@"
FAMILY="@FAMILY@"
STAMP="@STAMP@"
# The GPU networks' NCCL plugins and TCPXO's daemon (clusters/data/nccl.json).
GIB_INSTALLER="@GIB_INSTALLER@"
TCPXO_INSTALLER="@TCPXO_INSTALLER@"
TCPXO_DAEMON="@TCPXO_DAEMON@"

fail() { echo "tcc-startup: FAILED: $*" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive

apt-get update -qq || fail "apt-get update"
apt-get install -y -qq --no-install-recommends \
  munge slurm-client slurmctld slurmd slurmrestd slurm-wlm-jwt-plugin \
  nfs-common curl iptables ca-certificates gnupg lsb-release python3 python3-venv python3-numpy >/dev/null \
  || fail "installing Slurm, munge and the NFS client"

# Cloud Storage FUSE from Google's apt repository (https://cloud.google.com/storage/docs/cloud-storage-fuse/install).
curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
  || fail "fetching Google's apt key"
echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main" \
  > /etc/apt/sources.list.d/gcsfuse.list
apt-get update -qq && apt-get install -y -qq gcsfuse >/dev/null || fail "installing gcsfuse"

if [ -n "$GPU" ]; then
  command -v nvidia-smi >/dev/null || fail "the base image has no NVIDIA driver (use an Ubuntu accelerator image)"
  # DCGM for the health checks' dcgmi diag, from NVIDIA's CUDA repository for this Ubuntu release.
  # (Arm64 images, for A4X's Grace CPUs: NVIDIA's "sbsa" repository, as Cluster Toolkit's A4X blueprint uses.)
  release=$(. /etc/os-release && echo "ubuntu${VERSION_ID//./}")
  arch=$(dpkg --print-architecture)
  repo_arch=x86_64
  [ "$arch" = arm64 ] && repo_arch=sbsa
  curl -fsSL -o /tmp/cuda-keyring.deb \
    "https://developer.download.nvidia.com/compute/cuda/repos/$release/$repo_arch/cuda-keyring_1.1-1_all.deb" \
    && dpkg -i /tmp/cuda-keyring.deb >/dev/null && apt-get update -qq \
    && apt-get install -y -qq datacenter-gpu-manager >/dev/null || fail "installing DCGM"
  # The GPU networks' NCCL plugins, from Google's installer images as Cluster Toolkit's Slurm images
  # install them (clusters/data/nccl.json: how a job's script then points NCCL at them): gIB for RDMA
  # (A3 Ultra, A4) into /usr/local/gib, GPUDirect-TCPXO (A3 Mega) into /var/lib/tcpxo, and TCPXO's
  # receive-datapath manager, which startup.sh runs on A3 Mega nodes (docker with NVIDIA's runtime).
  apt-get install -y -qq docker.io nvidia-container-toolkit >/dev/null || fail "installing docker and NVIDIA's container runtime"
  nvidia-ctk runtime configure --runtime=docker >/dev/null && systemctl restart docker || fail "configuring docker for GPUs"
  ! command -v gcloud >/dev/null || gcloud -q auth configure-docker us-docker.pkg.dev >/dev/null 2>&1 || true
  mkdir -p /usr/local/gib
  docker run --rm --volume /usr/local/gib:/var/lib/gib "$GIB_INSTALLER" install --install-nccl \
    || fail "installing the gIB NCCL plugin"
  chmod -R a+rX /usr/local/gib
  if [ "$arch" = amd64 ]; then  # GPUDirect-TCPXO is A3 Mega's (x86) alone
    docker run --rm --network=host --volume /var/lib:/var/lib "$TCPXO_INSTALLER" install --install-nccl \
      || fail "installing the GPUDirect-TCPXO NCCL plugin"
    chmod -R a+rX /var/lib/tcpxo
    docker pull -q "$TCPXO_DAEMON" >/dev/null || fail "pulling GPUDirect-TCPXO's receive-datapath manager"
  fi
fi

# The node runtime: the health checks and recipes run with it (GCE_NODE_PYTHON=/opt/tcc/venv/bin/python).
python3 -m venv --system-site-packages /opt/tcc/venv || fail "making /opt/tcc/venv"
if [ -n "$GPU" ]; then
  /opt/tcc/venv/bin/pip install -q torch || fail "installing torch"
else
  /opt/tcc/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu torch || fail "installing torch"
fi

# The daemons start from startup.sh with each cluster's own keys and configuration: none at boot here.
systemctl disable --now slurmctld slurmd slurmrestd munge >/dev/null 2>&1 || true
rm -f /etc/munge/munge.key  # every cluster's key comes from its Secret Manager at boot
mkdir -p /etc/tcc && printf 'family=%s\nbaked=%s\n' "$FAMILY" "$STAMP" > /etc/tcc/image
apt-get clean
echo "tcc-startup: done"
