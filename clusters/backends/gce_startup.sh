#!/bin/bash
# Startup script the gce backend puts in each instance's metadata. Values in @...@ are filled in by
# clusters/backends/gce.py. It installs Slurm, joins the cluster's controller, and mounts /home,
# Managed Lustre and GCS FUSE buckets. It runs at every boot and is idempotent.
set -euo pipefail
ROLE='@ROLE@'
CLUSTER='@CLUSTER@'
CONTROLLER='@CONTROLLER@'
HOME_SHARE='@HOME_SHARE@'
LUSTRE='@LUSTRE@'
LUSTRE_MOUNT='@LUSTRE_MOUNT@'
GCS_MOUNTS='@GCS_MOUNTS@'

export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmd >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq munge slurm-client slurmd slurmctld nfs-common >/dev/null
fi

# The munge key is read from Secret Manager (${CLUSTER}-munge-key), never from instance metadata.
# Creating that secret is not automated by the console yet (docs/backends.md, "gce: not yet").
if command -v gcloud >/dev/null; then
  gcloud secrets versions access latest --secret="${CLUSTER}-munge-key" > /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  systemctl restart munge
fi

if [ -n "$HOME_SHARE" ] && ! mountpoint -q /home; then
  mount -t nfs -o vers=3,hard,timeo=600 "$HOME_SHARE" /home || true
fi
if [ -n "$LUSTRE" ] && ! mountpoint -q "$LUSTRE_MOUNT"; then
  mkdir -p "$LUSTRE_MOUNT"
  mount -t lustre "$LUSTRE@tcp:/lustrefs" "$LUSTRE_MOUNT" || true
fi
IFS=';' read -ra mounts <<< "$GCS_MOUNTS"
for entry in "${mounts[@]}"; do
  [ -n "$entry" ] || continue
  read -r bucket point options <<< "$entry"
  mkdir -p "$point"
  mountpoint -q "$point" || gcsfuse ${options:+-o "$options"} "$bucket" "$point" || true
done

case "$ROLE" in
  controller) systemctl enable --now slurmctld ;;
  compute) systemctl enable --now slurmd ;;
  login) echo "SLURM_CONF=/etc/slurm/slurm.conf" >> /etc/environment ;;
esac

# The pool's own startup_script from the spec runs last.
cat > /tmp/tcc-user-startup.sh <<'USER_SCRIPT'
@USER_SCRIPT@
USER_SCRIPT
bash /tmp/tcc-user-startup.sh
