#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the sweep tests (docs/sweeps.md):
# installs Debian's slurm-wlm and munge packages (apt-get update first), writes a
# slurm.conf with one node, this machine, with its own CPUs and memory as `slurmd -C`
# reports them, one partition `debug`, no cgroups (proctrack/linuxproc, so it runs in a
# container too), no accounting; starts munged, slurmctld and slurmd, and waits until
# `sinfo` shows the node idle. Idempotent: a cluster already answering with the node idle
# is left as it is; the packages are installed once. Needs root (apt-get, the daemons).
# Prints `slurm: ready (...)` on its last line, or one `slurm: ...` error line and exits 1.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
LOG_DIR=/var/log/slurm
WAIT_S="${KWK_SLURM_WAIT_S:-60}"

say() { echo "slurm: $*"; }
die() { echo "slurm: $*" >&2; exit 1; }

node_state() { sinfo -h -N -o '%t' 2>/dev/null | head -n 1; }

if command -v sinfo >/dev/null 2>&1 && [ "$(node_state)" = "idle" ]; then
    say "ready (already running: $(sinfo -h -N -o '%N %c CPUs %m MB' | head -n 1))"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root to install packages and start the daemons (run with sudo)"

if ! dpkg -s slurm-wlm munge >/dev/null 2>&1; then
    say "installing slurm-wlm and munge from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
fi

# munge: a key (the package's post-install makes one; make one if it did not), its
# folders, the daemon.
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile=/etc/munge/munge.key
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    if command -v runuser >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
    else
        /usr/sbin/munged --force
    fi
    for _ in $(seq 1 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.5
    done
    munge -n | unmunge >/dev/null 2>&1 || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# slurm.conf: this machine as the one node, as slurmd itself sees it.
HOST="$(hostname -s)"
NODE_LINE="$(slurmd -C 2>/dev/null | grep '^NodeName=' | head -n 1)"
[ -n "$NODE_LINE" ] || die "slurmd -C printed no NodeName line"
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd
chown slurm:slurm /var/spool/slurmctld "$LOG_DIR" 2>/dev/null || true
NEW_CONF="$(cat <<EOF
# Written by kwk's scripts/setup-slurm.sh: a single-node cluster on this machine.
ClusterName=kwk
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
${NODE_LINE} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
EOF
)"
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
    printf '%s\n' "$NEW_CONF" > "$CONF"
    say "wrote $CONF (${NODE_LINE})"
fi
# Debian's cgroup.conf is not used (no cgroup plugins) but slurmd reads one if present.
[ -f "$CONF_DIR/cgroup.conf" ] || echo "CgroupPlugin=autodetect" > "$CONF_DIR/cgroup.conf"

if ! pgrep -x slurmctld >/dev/null; then
    say "starting slurmctld"
    slurmctld || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
fi
if ! pgrep -x slurmd >/dev/null; then
    say "starting slurmd"
    slurmd || die "slurmd did not start (see $LOG_DIR/slurmd.log)"
fi

deadline=$((SECONDS + WAIT_S))
while [ $SECONDS -lt $deadline ]; do
    state="$(node_state)"
    case "$state" in
        idle) say "ready ($(sinfo -h -N -o '%N %c CPUs %m MB' | head -n 1))"; exit 0 ;;
        drain*|down*|fail*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
die "the node is '$(node_state)' after ${WAIT_S} s, not idle (see $LOG_DIR/slurmctld.log and slurmd.log)"
