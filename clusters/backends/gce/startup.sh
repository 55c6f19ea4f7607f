#!/bin/bash
# Startup script the gce backend puts in each instance's metadata. Values in @...@ are filled in by
# clusters/backends/gce/slurm_conf.py. It runs at every boot and is idempotent:
#   every node:  packages the image lacks, the munge key from Secret Manager, munged, /home, Lustre and
#                GCS FUSE mounts;
#   controller:  slurm.conf from metadata, the JWT key, slurmctld, slurmrestd (JWT) and the cluster agent
#                (the console's only ways in), and a watcher that reloads slurm.conf when a resize changes it;
#   compute:     a configless slurmd (slurm.conf and gres.conf come from the controller);
#   login:       slurm.conf for the users' Slurm clients, kept current by the same watcher.
# Each step that fails stops the script with one line, `tcc-startup: FAILED: <what>`, and the last line
# is `tcc-startup: done`: the console reads them from the serial console.
#
# TCC_SIMULATED_VM (set only by the tests' fake Compute API, tests/fake_vms.py, which boots each
# instance as a process tree on one machine) skips what such a VM cannot do: package installs, cloud
# mounts (the fake binds the cluster's Filestore folder on /home itself), and cgroup process tracking
# (a container gives no cgroup hierarchy of its own: measured, slurmd stops at "cgroup namespace
# 'freezer' not mounted"), which becomes proctrack/linuxproc there.
set -euo pipefail
ROLE='@ROLE@'
CLUSTER='@CLUSTER@'
CONTROLLER='@CONTROLLER@'
HOME_SHARE='@HOME_SHARE@'
LUSTRE='@LUSTRE@'
LUSTRE_MOUNT='@LUSTRE_MOUNT@'
# File systems the spec names that exist already (home_directory_storage, a pool's filestores and lustres):
# "nfs|lustre SOURCE MOUNT_POINT;..."
EXISTING_MOUNTS='@EXISTING_MOUNTS@'
GCS_MOUNTS='@GCS_MOUNTS@'
GPUS='@GPUS@'
FABRIC='@FABRIC@'  # the machine type's GPU network (clusters/data/machine_types.json): rdma, tcpxo, tcpx or ''
TCPXO_DAEMON='@TCPXO_DAEMON@'
SECRETS='@SECRETS@'
SHARED='@SHARED@'
SLURMRESTD_PORT='@SLURMRESTD_PORT@'
AGENT_PORT='@AGENT_PORT@'
NODE_PYTHON='@NODE_PYTHON@'
ACCOUNT_PREFIX='@ACCOUNT_PREFIX@'
SIMULATED=${TCC_SIMULATED_VM:-}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive
fail() { echo "tcc-startup: FAILED: $*" >&2; exit 1; }  # the console shows this line from the serial console

META="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
# The metadata server can be out of reach for a moment while a VM starts (google-auth-library-java#109:
# "VM metadata server being unavailable during VM launch"; Google's clients retry its 500 and 503,
# google-auth-library-python#984). `meta` retries what is transient (refused, timed out, 408, 429, 5xx)
# and answers an attribute the instance lacks (404) at once; `meta_required`, for what every instance
# has (its name, project, address, token, the agent), retries any failure, for up to 2 minutes. A slow
# answer is waited for (no --max-time): a CI run under load failed every node of a create when each
# request had 20 s (curl exit 28), though the server answered.
METADATA_RETRY=(--retry 8 --retry-delay 2 --retry-max-time 120 --connect-timeout 10)
meta() { curl -sf "${METADATA_RETRY[@]}" --retry-connrefused -H Metadata-Flavor:Google "$META/$1"; }
meta_required() { curl -sf "${METADATA_RETRY[@]}" --retry-all-errors -H Metadata-Flavor:Google "$META/$1"; }
mkdir -p /run/tcc && chmod 0700 /run/tcc

# -- the metadata server is root's alone, before anything that runs users' work starts (below) --------
# It hands out the node's service-account token, with which a job could read the cluster's keys (munge,
# JWT) from Secret Manager and its buckets. Every uid but root is refused it (an owner match in OUTPUT;
# FORWARD for containers on a bridge); this script, run as root, still reads the keys. OS Login's NSS
# module then answers users from its cache (refreshed by root), not from the metadata server.
close_metadata() {
  local address=169.254.169.254 port=()
  if [ -n "${GCE_METADATA_HOST:-}" ]; then  # the tests' fake: an address and a port of its own
    address=${GCE_METADATA_HOST%:*}
    [ "$address" = "$GCE_METADATA_HOST" ] || port=(-p tcp --dport "${GCE_METADATA_HOST##*:}")
  fi
  command -v iptables >/dev/null || fail "the image has no iptables: the metadata server cannot be closed to users' jobs"
  local own=(OUTPUT -d "$address" "${port[@]}" -m owner ! --uid-owner 0 -j REJECT)
  iptables -C "${own[@]}" 2>/dev/null || iptables -I "${own[@]}" || fail "closing the metadata server to every uid but root"
  local forwarded=(FORWARD -d "$address" "${port[@]}" -j REJECT)
  iptables -C "${forwarded[@]}" 2>/dev/null || iptables -I "${forwarded[@]}" || fail "closing the metadata server to containers"
  if [ -z "${GCE_METADATA_HOST:-}" ] && command -v ip6tables >/dev/null; then  # its IPv6 address, on IPv6 VMs
    own=(OUTPUT -d fd20:ce::254 -m owner ! --uid-owner 0 -j REJECT)
    ip6tables -C "${own[@]}" 2>/dev/null || ip6tables -I "${own[@]}" || true
  fi
}
# The watcher below runs this script again with `watch-conf`; the runner's copy may be gone by then.
[ "$0" = /run/tcc/startup.sh ] || cp "$0" /run/tcc/startup.sh

systemd_booted() { [ -d /run/systemd/system ]; }

daemon() {  # daemon NAME COMMAND...: a service run in the foreground and started again whenever it ends
  local name=$1; shift
  local properties=()
  if [ "$name" = tcc-slurmd ]; then
    # As Slurm's own slurmd.service: slurmd manages its jobs' cgroups itself (Delegate), and jobs may pin
    # memory (RDMA, NCCL) and use deep stacks without the unit's limits.
    properties=(--property=Delegate=yes --property=LimitMEMLOCK=infinity --property=LimitSTACK=infinity
                --property=LimitNOFILE=131072 --property=TasksMax=infinity)
  fi
  if systemd_booted; then
    systemctl stop "$name" 2>/dev/null || true
    systemctl reset-failed "$name" 2>/dev/null || true
    systemd-run --quiet --unit="$name" --property=Restart=always --property=RestartSec=2 "${properties[@]}" "$@"
  else
    setsid bash -c 'while :; do "$@"; sleep 2; done' "$name" "$@" >>"/var/log/$name.log" 2>&1 </dev/null &
  fi
}

restart() {  # restart NAME PROGRAM: end the service's program; it starts again (daemon above)
  if systemd_booted; then
    systemctl restart "$1"
  else
    pkill -x "$2" || true
  fi
}

listening() {  # listening ADDRESS PORT: wait up to 60 s until something accepts connections there
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

resolvable() {  # wait up to 2 minutes until every node's host name in slurm.conf resolves
  # slurmctld resolves them all when it starts, and one the VPC's DNS does not know yet (its instance is
  # still being made) costs it 5 attempts of 11 s each (measured): waiting here is shorter.
  local names expression
  # NodeHostname= is a hostlist expression (one line per pool): scontrol expands it (slurm-client).
  for expression in $(sed -n 's/.*NodeHostname=\([^ ]*\).*/\1/p' /etc/slurm/slurm.conf); do
    names+=" $(SLURM_CONF=/etc/slurm/slurm.conf scontrol show hostnames "$expression" | tr '\n' ' ')"
  done
  for _ in $(seq 120); do
    local missing=""
    for name in $names; do getent hosts "$name" >/dev/null || missing=$name; done
    [ -z "$missing" ] && return 0
    sleep 1
  done
  echo "tcc-startup: $missing does not resolve yet; starting slurmctld all the same"
}

user_startup() {  # the node pool's own startup_script from the spec
  cat > /run/tcc/user-startup.sh <<'USER_SCRIPT'
@USER_SCRIPT@
USER_SCRIPT
  bash /run/tcc/user-startup.sh || fail "the node pool's own startup_script"
}

write_hooks() {  # the Prolog and Epilog from the metadata (configless slurmds are not sent them)
  mkdir -p /etc/slurm
  meta instance/attributes/slurm-epilog > /etc/slurm/epilog.sh || true
  meta instance/attributes/slurm-prolog > /etc/slurm/prolog-spec.sh || true
  # The Prolog (always in slurm.conf): this node takes the console's new accounts first, so a job of an
  # account made a moment ago finds it here; then the spec's own prolog, whose exit status is the Prolog's.
  {
    echo '#!/bin/bash'
    echo 'bash /run/tcc/startup.sh sync-accounts >/dev/null 2>&1 || true'
    if [ -s /etc/slurm/prolog-spec.sh ]; then echo 'exec /etc/slurm/prolog-spec.sh'; fi
  } > /etc/slurm/prolog.sh
  chmod 0755 /etc/slurm/prolog.sh /etc/slurm/prolog-spec.sh /etc/slurm/epilog.sh
}

ACCOUNTS_FILE="$SHARED/.tcc/accounts"
sync_accounts() {  # the console's accounts as the controller's agent made them: same names, uids and gids
  local kind name id extra
  [ "$ROLE" != controller ] || return 0  # made there by the agent
  # The agent's own file (root's, in its root-owned .tcc/), never a link a member planted.
  [ -f "$ACCOUNTS_FILE" ] && [ ! -L "$ACCOUNTS_FILE" ] && [ "$(stat -c %u "$ACCOUNTS_FILE")" = 0 ] || return 0
  while read -r kind name id extra; do
    [[ "$name" == "$ACCOUNT_PREFIX"* ]] || continue
    case "$kind" in
      group)
        [[ "$id" =~ ^[0-9]+$ ]] && [ "$id" -ge 100 ] || continue
        getent group "$name" >/dev/null || groupadd --system --gid "$id" "$name" ;;
      user)
        [[ "$id" =~ ^[0-9]+$ && "$extra" =~ ^[0-9]+$ ]] && [ "$id" -ge 100 ] || continue
        if getent passwd "$name" >/dev/null; then  # a member who left (or came back): the group it has now
          [ "$(id -g "$name")" = "$extra" ] || usermod --gid "$extra" "$name"
        else
          useradd --system --no-create-home --shell /usr/sbin/nologin --uid "$id" --gid "$extra" \
            --home-dir "$SHARED" "$name"
        fi ;;
      member)
        [[ "$id" == "$ACCOUNT_PREFIX"* ]] || continue
        id -nG "$name" 2>/dev/null | tr ' ' '\n' | grep -qx "$id" || usermod --append --groups "$id" "$name" ;;
    esac
  done < "$ACCOUNTS_FILE"
  # Members the file no longer lists (who left the project) leave the group here too.
  local group member
  for group in $(getent group | cut -d: -f1 | grep "^$ACCOUNT_PREFIX"); do
    for member in $(getent group "$group" | cut -d: -f4 | tr ',' ' '); do
      [[ "$member" == "$ACCOUNT_PREFIX"* ]] || continue
      grep -qx "member $member $group" "$ACCOUNTS_FILE" || gpasswd --delete "$member" "$group" >/dev/null
    done
  done
}
if [ "${1:-}" = sync-accounts ]; then
  sync_accounts
  exit 0
fi
if [ "${1:-}" = watch-accounts ]; then  # and every few seconds, for logins and what runs outside jobs
  while true; do sync_accounts || true; sleep 3; done
fi

write_conf() {  # slurm.conf (and gres.conf) from the metadata; true when it changed
  mkdir -p /etc/slurm
  meta instance/attributes/slurm-conf > /etc/slurm/slurm.conf.new || { rm -f /etc/slurm/slurm.conf.new; return 1; }
  if [ -n "$SIMULATED" ]; then
    sed -i 's#^ProctrackType=.*#ProctrackType=proctrack/linuxproc#; s#^TaskPlugin=.*#TaskPlugin=task/none#' \
      /etc/slurm/slurm.conf.new
  fi
  meta instance/attributes/slurm-gres-conf > /etc/slurm/gres.conf || true
  if [ -z "$SIMULATED" ]; then  # a simulated VM tracks processes without cgroups (see above)
    meta instance/attributes/slurm-cgroup-conf > /etc/slurm/cgroup.conf || true
  fi
  write_hooks
  if cmp -s /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf; then
    rm /etc/slurm/slurm.conf.new
    return 1
  fi
  mv /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf
}

if [ "${1:-}" = watch-conf ]; then
  # Wait for the console to change slurm-conf (a resize) and reload; the ETag makes each wait start
  # where the last one ended, so no change is missed between two waits.
  etag=NONE
  while true; do
    headers=$(curl -sf -D - -o /dev/null -H Metadata-Flavor:Google \
      "$META/instance/attributes/slurm-conf?wait_for_change=true&last_etag=$etag&timeout_sec=60") || { sleep 5; continue; }
    etag=$(printf '%s\n' "$headers" | tr -d '\r' | awk 'tolower($1) == "etag:" {print $2}')
    if write_conf && [ "$ROLE" = controller ]; then
      resolvable
      restart tcc-slurmctld slurmctld  # Slurm 22.05 adds or removes nodes only on a restart
      echo "$(date -Is) slurm.conf changed: slurmctld restarted"
    fi
  done
fi

# secret NAME FILE: the latest version of a Secret Manager secret, with the VM's service account. What is
# transient is retried as for the metadata server (refused, timed out, 429, 5xx: Google's APIs ask for
# retries with backoff, https://cloud.google.com/apis/design/errors#error_retries); a refusal (403: no
# grant) fails at once. Without a connect timeout, one unanswered connection held the boot for 127 s (the
# kernel's SYN retries) and then failed it.
secret() {
  local token
  token=$(meta_required instance/service-accounts/default/token | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])') \
    || return 1
  (umask 077; curl -sf "${METADATA_RETRY[@]}" --retry-connrefused -H "Authorization: Bearer $token" \
    "$SECRETS/v1/projects/$PROJECT/secrets/$1/versions/latest:access" \
    | python3 -c 'import base64,json,sys; sys.stdout.buffer.write(base64.b64decode(json.load(sys.stdin)["payload"]["data"]))' \
    > "$2.new") || { rm -f "$2.new"; return 1; }
  mv "$2.new" "$2"
}

NAME=$(meta_required instance/name) || fail "reading the instance name from the metadata server (curl exit $?)"
PROJECT=$(meta_required project/project-id) || fail "reading the project id from the metadata server (curl exit $?)"
NODE=${NAME#"$CLUSTER"-}

# -- packages the image lacks (none on an image baked by `manage.py gce_image build`) ---------------
packages=(munge slurm-client curl python3 iptables)
case "$ROLE" in
  controller) packages+=(slurmctld slurmrestd slurm-wlm-jwt-plugin) ;;
  compute) packages+=(slurmd) ;;
esac
{ [ -n "$HOME_SHARE" ] || [[ "$EXISTING_MOUNTS" == *nfs* ]]; } && packages+=(nfs-common)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ -z "$SIMULATED" ] && [ ${#missing[@]} -gt 0 ]; then
  # Nodes have no external address: this works only with Cloud NAT (console.network.cloud_nat). A baked
  # image (manage.py gce_image build) has them all and never gets here.
  timeout 600 apt-get update -qq && timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || fail "installing ${missing[*]}: the image lacks them and the node reaches no package mirror; bake an image (manage.py gce_image build) or set console.network.cloud_nat"
fi
if [ -z "$SIMULATED" ] && [ -n "$GCS_MOUNTS" ] && ! command -v gcsfuse >/dev/null; then
  # Cloud Storage FUSE from Google's apt repository (https://cloud.google.com/storage/docs/cloud-storage-fuse/install).
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg
  echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main" \
    > /etc/apt/sources.list.d/gcsfuse.list
  apt-get update -qq && apt-get install -y -qq gcsfuse >/dev/null || fail "installing gcsfuse"
fi
if [ -z "$SIMULATED" ] && { [ -n "$LUSTRE" ] || [[ "$EXISTING_MOUNTS" == lustre* || "$EXISTING_MOUNTS" == *\;lustre* ]]; } \
    && ! command -v mount.lustre >/dev/null; then
  fail "the image has no Lustre client (mount.lustre); use an image with Managed Lustre's client (GCE_IMAGE / GCE_GPU_IMAGE)"
fi
if [ "$ROLE" = compute ] && [ "$GPUS" -gt 0 ]; then
  command -v nvidia-smi >/dev/null || fail "the image has no NVIDIA driver; set GCE_GPU_IMAGE to a GPU-ready image"
  found=$(nvidia-smi --list-gpus | wc -l)
  [ "$found" -eq "$GPUS" ] || fail "nvidia-smi lists $found GPUs, the machine type has $GPUS"
fi

close_metadata  # before munged and slurmd: no job runs here until it is closed

# -- GPUDirect-TCPXO (A3 Mega): its receive-datapath manager runs before any job's NCCL starts -------
if [ "$ROLE" = compute ] && [ "$FABRIC" = tcpxo ] && [ -z "$SIMULATED" ]; then
  modprobe import-helper || fail "loading GPUDirect-TCPXO's import-helper module (is this the console's GPU image?)"
  docker inspect receive-datapath-manager >/dev/null 2>&1 || docker run --name receive-datapath-manager --detach \
    --restart=always --pull=never --cap-add=NET_ADMIN --network=host --privileged --gpus all \
    --volume /usr/lib32:/usr/local/nvidia/lib64 --volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper \
    --env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu "$TCPXO_DAEMON" --num_hops=2 --num_nics=8 --uid= --alsologtostderr \
    >/dev/null || fail "starting GPUDirect-TCPXO's receive-datapath manager"
fi

if systemd_booted; then  # Debian's own units start with its defaults; ours (below) run instead
  systemctl disable --now slurmctld slurmd slurmrestd 2>/dev/null || true
fi

# -- munge: the key lives in Secret Manager (${CLUSTER}-munge-key), never in instance metadata --------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
secret "$CLUSTER-munge-key" /etc/munge/munge.key \
  || fail "reading the munge key from Secret Manager (does the VM's service account have secretmanager.versions.access?)"
chown munge:munge /etc/munge /etc/munge/munge.key /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
if systemd_booted; then
  systemctl restart munge
else
  pkill -x munged || true
  runuser -u munge -- /usr/sbin/munged || fail "starting munged"
fi

# -- shared storage ---------------------------------------------------------------------------------
if [ -z "$SIMULATED" ]; then
  if [ -n "$HOME_SHARE" ] && ! mountpoint -q /home; then
    # Filestore by its IP and share, e.g. 10.0.0.2:/home.
    mount -t nfs -o vers=3,hard,timeo=600 "$HOME_SHARE" /home || fail "mounting /home from $HOME_SHARE"
  fi
  if [ -n "$LUSTRE" ] && ! mountpoint -q "$LUSTRE_MOUNT"; then
    # Managed Lustre by its mount point, e.g. 10.0.0.3@tcp:/lustrefs.
    mkdir -p "$LUSTRE_MOUNT"
    mount -t lustre "$LUSTRE" "$LUSTRE_MOUNT" || fail "mounting $LUSTRE on $LUSTRE_MOUNT"
  fi
  IFS=';' read -ra existing <<< "$EXISTING_MOUNTS"
  for entry in "${existing[@]}"; do
    [ -n "$entry" ] || continue
    read -r kind source point <<< "$entry"
    mkdir -p "$point"
    mountpoint -q "$point" && continue
    if [ "$kind" = nfs ]; then
      mount -t nfs -o vers=3,hard,timeo=600 "$source" "$point" || fail "mounting $point from $source"
    else
      mount -t lustre "$source" "$point" || fail "mounting $source on $point"
    fi
  done
  IFS=';' read -ra mounts <<< "$GCS_MOUNTS"
  for entry in "${mounts[@]}"; do
    [ -n "$entry" ] || continue
    read -r bucket point options <<< "$entry"
    mkdir -p "$point"
    # $options: gcsfuse's flags and -o FUSE options, as the console wrote them (slurm_conf.gcsfuse_flags)
    # shellcheck disable=SC2086
    mountpoint -q "$point" || gcsfuse $options "$bucket" "$point" || fail "mounting gs://$bucket on $point"
  done
fi

# -- Slurm ------------------------------------------------------------------------------------------
mkdir -p /var/log/slurm
case "$ROLE" in
  controller)
    mkdir -p /var/spool/slurmctld "$SHARED"
    # slurmrestd's clients (the console) sign their JWTs with this key; slurmctld checks them.
    secret "$CLUSTER-jwt-key" /var/spool/slurmctld/jwt_hs256.key || fail "reading the JWT key from Secret Manager"
    write_conf || [ -s /etc/slurm/slurm.conf ] || fail "reading slurm.conf from the metadata"
    resolvable
    daemon tcc-slurmctld slurmctld -D
    # Both of the console's doors listen on the controller's internal address alone (not loopback, not a
    # container bridge), where the cluster's firewall admits the console's range only.
    ip=$(meta_required instance/network-interfaces/0/ip) || fail "reading the controller's address from the metadata (curl exit $?)"
    # slurmrestd has no TLS (22.05): it listens on a Unix socket in a folder of its own account's (0700;
    # slurmrestd(8): -u "a unique user with no write access or special permissions"), and the agent serves
    # TLS on its port and relays to that socket. No other account can take the socket's place.
    id -u tcc-slurmrestd >/dev/null 2>&1 \
      || useradd --system --no-create-home --shell /usr/sbin/nologin --user-group tcc-slurmrestd \
      || fail "making slurmrestd's account"
    install -d -m 0700 -o tcc-slurmrestd -g tcc-slurmrestd /run/tcc-slurmrestd
    rm -f /run/tcc-slurmrestd/slurmrestd.sock
    daemon tcc-slurmrestd env SLURM_JWT=daemon slurmrestd -a rest_auth/jwt -s openapi/v0.0.38 -u tcc-slurmrestd \
      unix:/run/tcc-slurmrestd/slurmrestd.sock
    # The cluster agent (the console's clusters/agent/server.py, standard library only): files under the
    # shared home, the Slurm actions slurmrestd lacks, TensorBoard. Its key is in Secret Manager too, with
    # the controller's TLS key and certificate, signed by the cluster's own CA, which the console pins.
    meta_required instance/attributes/tcc-agent > /run/tcc/agent.py || fail "reading the cluster agent from the metadata (curl exit $?)"
    secret "$CLUSTER-agent-key" /run/tcc/agent.key || fail "reading the agent key from Secret Manager"
    secret "$CLUSTER-tls-key" /run/tcc/tls.pem || fail "reading the controller's TLS certificate from Secret Manager"
    daemon tcc-agent python3 /run/tcc/agent.py --home "$SHARED" --key-file /run/tcc/agent.key \
      --listen "$ip:$AGENT_PORT" --slurm-conf /etc/slurm/slurm.conf \
      --tls-bundle /run/tcc/tls.pem --slurmrestd-relay "$ip:$SLURMRESTD_PORT=/run/tcc-slurmrestd/slurmrestd.sock" \
      --tensorboard-python "$NODE_PYTHON" --account-prefix "$ACCOUNT_PREFIX"
    daemon tcc-conf-watch bash /run/tcc/startup.sh watch-conf
    # "done" means the console can reach the controller: both of its doors answer.
    listening "$ip" "$SLURMRESTD_PORT" || fail "slurmrestd is not listening on $SLURMRESTD_PORT (see /var/log/tcc-slurmrestd.log)"
    listening "$ip" "$AGENT_PORT" || fail "the cluster agent is not listening on $AGENT_PORT (see /var/log/tcc-agent.log)"
    ;;
  compute)
    mkdir -p /var/spool/slurmd
    # Slurm's HealthCheckProgram (slurm.conf): slurmd runs it as root every HealthCheckInterval with only
    # SLURMD_NODENAME set, so every path is whole. It drains a node whose spool disk is nearly full (or
    # that a rehearsal's fault file says is); the console then repairs it.
    cat > /etc/slurm/healthcheck.sh <<HEALTH
#!/bin/bash
export SLURM_CONF=/var/spool/slurmd/conf-cache/slurm.conf
used=\$(/usr/bin/df --output=pcent /var/spool/slurmd | /usr/bin/tail -1 | /usr/bin/tr -dc 0-9)
if /usr/bin/grep -qs disk_full "$SHARED/.tcc/faults/\$SLURMD_NODENAME.json"; then used=100; fi
if [ "\${used:-0}" -ge 95 ]; then
  /usr/bin/scontrol update nodename=\$SLURMD_NODENAME state=drain reason="tcc disk: spool \$used% used"
fi
exit 0
HEALTH
    chmod 0755 /etc/slurm/healthcheck.sh
    write_hooks  # slurm.conf names /etc/slurm/prolog.sh (and epilog.sh when the spec has one)
    sync_accounts
    daemon tcc-accounts bash /run/tcc/startup.sh watch-accounts
    # The pool's own script runs before slurmd: a node whose setup failed never takes a job, and the
    # console reads the failure from the serial console instead of waiting for a node that never comes.
    user_startup
    # Configless: slurmd fetches slurm.conf from the controller (started again until the controller
    # knows this node); the node name is the instance name less the cluster's prefix.
    daemon tcc-slurmd slurmd -D --conf-server "$CONTROLLER" -N "$NODE"
    ;;
  login)
    write_conf || [ -s /etc/slurm/slurm.conf ] || fail "reading slurm.conf from the metadata"
    daemon tcc-conf-watch bash /run/tcc/startup.sh watch-conf
    sync_accounts
    daemon tcc-accounts bash /run/tcc/startup.sh watch-accounts
    ;;
esac

if [ "$ROLE" != compute ]; then
  user_startup  # the controller's and login nodes' own script runs with Slurm up
fi
echo "tcc-startup: done"  # the console waits for this line on the serial console
