#!/bin/bash
# Startup script the gce backend puts in each instance's metadata. Values in @...@ are filled in by
# clusters/backends/gce/slurm_conf.py. It installs Slurm, joins the cluster's controller, and mounts /home,
# Managed Lustre and GCS FUSE buckets. It runs at every boot and is idempotent.
set -euo pipefail
ROLE='@ROLE@'
CLUSTER='@CLUSTER@'
CONTROLLER='@CONTROLLER@'
HOME_SHARE='@HOME_SHARE@'
LUSTRE='@LUSTRE@'
LUSTRE_MOUNT='@LUSTRE_MOUNT@'
GCS_MOUNTS='@GCS_MOUNTS@'
GPUS='@GPUS@'
fail() { echo "tcc-startup: FAILED: $*" >&2; exit 1; }  # the console shows this line from the serial console

export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmd >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq munge slurm-client slurmd slurmctld nfs-common curl gnupg lsb-release >/dev/null
fi
if [ -n "$GCS_MOUNTS" ] && ! command -v gcsfuse >/dev/null; then
  # Cloud Storage FUSE from Google's apt repository (https://cloud.google.com/storage/docs/cloud-storage-fuse/install).
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg
  echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main" \
    > /etc/apt/sources.list.d/gcsfuse.list
  apt-get update -qq && apt-get install -y -qq gcsfuse >/dev/null || fail "installing gcsfuse"
fi
if [ -n "$LUSTRE" ] && ! command -v mount.lustre >/dev/null; then
  fail "the image has no Lustre client (mount.lustre); use an image with Managed Lustre's client (GCE_IMAGE / GCE_GPU_IMAGE)"
fi
if [ "$ROLE" = compute ] && [ "$GPUS" -gt 0 ]; then
  command -v nvidia-smi >/dev/null || fail "the image has no NVIDIA driver; set GCE_GPU_IMAGE to a GPU-ready image"
  found=$(nvidia-smi --list-gpus | wc -l)
  [ "$found" -eq "$GPUS" ] || fail "nvidia-smi lists $found GPUs, the machine type has $GPUS"
fi

META=http://metadata.google.internal/computeMetadata/v1/instance/attributes
# The munge key lives in Secret Manager (${CLUSTER}-munge-key), never in instance metadata.
gcloud secrets versions access latest --secret="${CLUSTER}-munge-key" --out-file=/etc/munge/munge.key \
  || fail "reading the munge key from Secret Manager (does the VM's service account have secretmanager.versions.access?)"
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
systemctl restart munge

if [ -n "$HOME_SHARE" ] && ! mountpoint -q /home; then
  # Filestore by its IP and share, e.g. 10.0.0.2:/home.
  mount -t nfs -o vers=3,hard,timeo=600 "$HOME_SHARE" /home || fail "mounting /home from $HOME_SHARE"
fi
if [ -n "$LUSTRE" ] && ! mountpoint -q "$LUSTRE_MOUNT"; then
  # Managed Lustre by its mount point, e.g. 10.0.0.3@tcp:/lustrefs.
  mkdir -p "$LUSTRE_MOUNT"
  mount -t lustre "$LUSTRE" "$LUSTRE_MOUNT" || fail "mounting $LUSTRE on $LUSTRE_MOUNT"
fi
IFS=';' read -ra mounts <<< "$GCS_MOUNTS"
for entry in "${mounts[@]}"; do
  [ -n "$entry" ] || continue
  read -r bucket point options <<< "$entry"
  mkdir -p "$point"
  mountpoint -q "$point" || gcsfuse ${options:+-o "$options"} "$bucket" "$point" || fail "mounting gs://$bucket on $point"
done

write_conf() {
  # The controller and login nodes get slurm.conf, prolog and epilog from their metadata.
  mkdir -p /etc/slurm
  curl -sf -H Metadata-Flavor:Google "$META/slurm-conf" > /etc/slurm/slurm.conf.new && mv /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf
  # Configless slurmds fetch gres.conf from the controller with slurm.conf.
  curl -sf -H Metadata-Flavor:Google "$META/slurm-gres-conf" > /etc/slurm/gres.conf.new && mv /etc/slurm/gres.conf.new /etc/slurm/gres.conf || true
  for hook in prolog epilog; do
    curl -sf -H Metadata-Flavor:Google "$META/slurm-$hook" > "/etc/slurm/$hook.sh" || true
    chmod 0755 "/etc/slurm/$hook.sh"
  done
}

case "$ROLE" in
  controller)
    write_conf
    mkdir -p /var/spool/slurmctld && chown slurm: /var/spool/slurmctld
    systemctl enable --now slurmctld
    # Reload when the console changes the node list (a resize sets new metadata).
    nohup bash -c "while curl -sf -H Metadata-Flavor:Google '$META/slurm-conf?wait_for_change=true' >/dev/null; do
      $(declare -f write_conf); META=$META write_conf; systemctl restart slurmctld; done" >/var/log/tcc-conf-agent.log 2>&1 &
    # Drain / resume asked by the console's repairs: tcc-node-states is {node: {state, reason}}.
    cat > /usr/local/bin/tcc-node-states <<'AGENT'
#!/usr/bin/env python3
# Apply only the entries that changed since the last run: re-applying an old RESUME would undo a
# drain Slurm made since (HealthCheckProgram).
import json, pathlib, subprocess, sys
seen = pathlib.Path("/var/lib/tcc/node-states.json")
before = json.loads(seen.read_text()) if seen.exists() else {}
wanted = json.load(sys.stdin)
for node, want in sorted(wanted.items()):
    if before.get(node) == want:
        continue
    args = ["scontrol", "update", f"nodename={node}", f"state={want['state']}"]
    if want.get("reason"):
        args.append(f"reason={want['reason']}")
    subprocess.run(args, check=False)  # resuming an idle node is refused by Slurm: harmless
seen.parent.mkdir(parents=True, exist_ok=True)
seen.write_text(json.dumps(wanted))
AGENT
    chmod 0755 /usr/local/bin/tcc-node-states
    nohup bash -c "while true; do
      if states=\$(curl -sf -H Metadata-Flavor:Google '$META/tcc-node-states?wait_for_change=true'); then
        echo \"\$states\" | /usr/local/bin/tcc-node-states
      else
        sleep 10  # no key yet (no repair so far) or the metadata server is busy
      fi
    done" >/var/log/tcc-node-states.log 2>&1 &
    ;;
  compute)
    # Configless: slurmd fetches slurm.conf from the controller; the node name is the host name less the prefix.
    echo "SLURMD_OPTIONS=\"--conf-server $CONTROLLER -N ${HOSTNAME#"$CLUSTER"-}\"" > /etc/default/slurmd
    systemctl enable --now slurmd
    ;;
  login)
    write_conf
    nohup bash -c "while curl -sf -H Metadata-Flavor:Google '$META/slurm-conf?wait_for_change=true' >/dev/null; do
      $(declare -f write_conf); META=$META write_conf; done" >/var/log/tcc-conf-agent.log 2>&1 &
    ;;
esac

# The pool's own startup_script from the spec runs last.
cat > /tmp/tcc-user-startup.sh <<'USER_SCRIPT'
@USER_SCRIPT@
USER_SCRIPT
bash /tmp/tcc-user-startup.sh || fail "the node pool's own startup_script"
echo "tcc-startup: done"  # the console waits for this line on the serial console
