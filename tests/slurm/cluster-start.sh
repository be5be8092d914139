#!/usr/bin/env bash
# Starts a real Slurm cluster on this one machine for dlaunch's Slurm tests: munge, slurmctld and
# DLS_NODES slurmd daemons, each node with its own host name (UTS namespace), its own /etc/hosts
# (mount namespace) and, where the kernel lets us, its own network namespace and address on a
# private bridge. The nodes share the host's file system, so a build tree under the repository
# checkout is visible at the same path on every node.
#
#   sudo tests/slurm/cluster-start.sh          # prints the SLURM_CONF line to export
#   export SLURM_CONF=/run/dlaunch-slurm/slurm.conf
#   srun -N2 hostname                          # dln01, dln02
#   sudo tests/slurm/cluster-stop.sh
#
# Settings (environment):
#   DLS_NODES    nodes, 2..16 (default 3): named dln01, dln02, ... so the node list is dln[01-03]
#   DLS_CPUS     CPUs each node advertises (default 2; may exceed the real cores)
#   DLS_MODE     auto (default) | netns | loopback
#                  netns:    per-node network namespace, 10.78.0.11, .12, ... on bridge dlsbr0
#                  loopback: no network namespaces (containers that forbid them); nodes at
#                            127.0.78.1, .2, ... share one port space, slurmd on ports 16901+
#   DLS_SUBNET   first three octets of the private subnet in netns mode (default 10.78.0)
#   DLS_TIMEOUT  seconds to wait for the nodes to come up (default 60)
#   DLS_GPUS     fake GPUs per node, 0..4 (default 0): GRES gpu of type "fake", backed by
#                /dev/null-like character devices, so that --gpus-per-node and the SLURM_GPUS_*
#                variables behave as on a GPU cluster (CUDA_VISIBLE_DEVICES included)
#
# Idempotent: a running cluster with the same settings is left alone; anything else (half started,
# other settings) is stopped first. Needs root. Installs slurm-wlm and munge if they are missing.
# Everything it creates lives in /run/dlaunch-slurm, in namespaces and links named dls*, and in
# /etc/slurm/slurm.conf only when that file did not exist (a symlink, removed again on stop).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nodes=${DLS_NODES:-3}
cpus=${DLS_CPUS:-2}
mode=${DLS_MODE:-auto}
subnet=${DLS_SUBNET:-10.78.0}
timeout_s=${DLS_TIMEOUT:-60}
gpus=${DLS_GPUS:-0}

root=/run/dlaunch-slurm
conf=$root/slurm.conf
ctld_port=6917 # not Slurm's 6817, so a system Slurm on this machine is never disturbed
bridge=dlsbr0

t0=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - t0) / 1000000))
    printf '[cluster-start %d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"
}
die() {
    say "error: $*" >&2
    exit 1
}

node_name() { printf 'dln%02d' "$1"; }

# A pid counts as ours only if it is alive and runs the program we expect.
alive_as() {
    [ -n "$1" ] && [ -r "/proc/$1/comm" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
pid_of() { [ -s "$1" ] && tr -cd '0-9' <"$1" || true; }

[ "$(id -u)" = 0 ] || die "needs root (namespaces, bridge, slurmd as root)"
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] && [ "$nodes" -le 16 ] ||
    die "DLS_NODES=$nodes: expected 2..16"
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "DLS_CPUS=$cpus: expected a positive number"
[[ $subnet =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "DLS_SUBNET=$subnet: expected 10.X.Y"
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "DLS_TIMEOUT=$timeout_s: expected seconds"
[[ $gpus =~ ^[0-4]$ ]] || die "DLS_GPUS=$gpus: expected 0..4"
case $mode in
auto | netns | loopback) ;;
*) die "DLS_MODE=$mode: expected auto, netns or loopback" ;;
esac

export SLURM_CONF=$conf

# ------------------------------------------------------------------ packages
missing=0
for prog in slurmctld slurmd srun sbatch sinfo scontrol munged munge unmunge; do
    command -v "$prog" >/dev/null 2>&1 || missing=1
done
if [ $missing = 1 ]; then
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt_log=$(mktemp /tmp/dls-apt.XXXXXX)
    if ! apt-get -o DPkg::Lock::Timeout=600 install -y slurm-wlm munge >"$apt_log" 2>&1; then
        apt-get -o DPkg::Lock::Timeout=600 update >>"$apt_log" 2>&1 || true
        apt-get -o DPkg::Lock::Timeout=600 install -y slurm-wlm munge >>"$apt_log" 2>&1 ||
            die "apt-get install slurm-wlm munge failed, see $apt_log"
    fi
    rm -f "$apt_log"
fi
for prog in ip nsenter unshare runuser stat; do
    command -v "$prog" >/dev/null || die "$prog is missing (iproute2, util-linux, coreutils)"
done

if [ "$mode" = auto ]; then
    mode=loopback
    if unshare --net --uts --mount true 2>/dev/null && ip link add dlsprobe0 type bridge 2>/dev/null; then
        ip link del dlsprobe0
        mode=netns
    fi
fi
unshare --uts --mount true 2>/dev/null ||
    die "cannot create UTS/mount namespaces here; every node would share one host name"

# ------------------------------------------------------------------ already running?
settings="nodes=$nodes cpus=$cpus gpus=$gpus mode=$mode subnet=$subnet"
if [ -f "$root/up" ] && [ "$(cat "$root/settings" 2>/dev/null)" = "$settings" ]; then
    healthy=1
    alive_as "$(pid_of "$root/slurmctld.pid")" slurmctld || healthy=0
    for i in $(seq 1 "$nodes"); do
        alive_as "$(pid_of "$root/slurmd-$(node_name "$i").pid")" slurmd || healthy=0
    done
    if [ $healthy = 1 ] && [ -z "$(timeout 10 sinfo -h -N -o '%t' 2>/dev/null | grep -vE '^(idle|alloc|mix)$')" ]; then
        say "already running: $settings"
        echo "export SLURM_CONF=$conf"
        exit 0
    fi
fi
if [ -e "$root" ]; then
    say "stopping a previous cluster (half started or other settings)"
    "$here/cluster-stop.sh"
fi

# From here on a failure tears down whatever was started, after showing the logs.
on_exit() {
    local rc=$?
    [ $rc = 0 ] && return
    say "failed (exit $rc) at line ${BASH_LINENO[0]}"
    for log in "$root"/log/*.log; do
        [ -s "$log" ] && { echo "--- tail of $log"; tail -n 15 "$log"; }
    done
    "$here/cluster-stop.sh" >/dev/null 2>&1 || true
}
trap on_exit EXIT

mkdir -p "$root/log" "$root/ns" "$root/spool"
echo "$settings" >"$root/settings"
echo "$mode" >"$root/mode"

# ------------------------------------------------------------------ addresses
declare -a addr port
for i in $(seq 1 "$nodes"); do
    if [ "$mode" = netns ]; then
        addr[i]=$subnet.$((10 + i))
        port[i]=6918
    else
        addr[i]=127.0.78.$i
        port[i]=$((16900 + i))
    fi
done
ctl_addr=127.0.0.1
if [ "$mode" = netns ]; then
    ctl_addr=$subnet.1
    # Refuse a subnet that is already routed somewhere other than the default route.
    if ip -4 route show match "$ctl_addr" | grep -v '^default' | grep -q .; then
        die "subnet $subnet.0/24 is already in use here; pick another with DLS_SUBNET"
    fi
fi

{
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    echo "$ctl_addr dlsctl"
    for i in $(seq 1 "$nodes"); do echo "${addr[i]} $(node_name "$i")"; done
} >"$root/hosts"

# ------------------------------------------------------------------ munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "using the munged already running"
else
    install -d -o munge -g munge -m 0700 /etc/munge
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    # A pid file or socket left by a dead munged makes a new one refuse to start.
    stale=$(pid_of /run/munge/munged.pid)
    if [ -n "$stale" ] && ! alive_as "$stale" munged; then
        rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    fi
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
    pid_of /run/munge/munged.pid >"$root/munged.pid"
    say "munged started"
fi

# ------------------------------------------------------------------ network namespaces
if [ "$mode" = netns ]; then
    ip link add "$bridge" type bridge
    echo "$bridge" >"$root/bridge"
    ip addr add "$ctl_addr/24" dev "$bridge"
    ip link set "$bridge" up
    for i in $(seq 1 "$nodes"); do
        n=$(node_name "$i")
        ip netns add "dls-$n"
        echo "dls-$n" >>"$root/netns"
        ip link add "dlsv$i" type veth peer name "dlsp$i"
        ip link set "dlsv$i" master "$bridge" up
        ip link set "dlsp$i" netns "dls-$n"
        ip -n "dls-$n" link set lo up
        ip -n "dls-$n" link set "dlsp$i" name eth0
        ip -n "dls-$n" addr add "${addr[i]}/24" dev eth0
        ip -n "dls-$n" link set eth0 up
    done
    say "bridge $bridge and $nodes network namespaces up"
fi

# ------------------------------------------------------------------ slurm.conf
{
    cat <<EOF
# Written by dlaunch tests/slurm/cluster-start.sh ($settings); removed by cluster-stop.sh.
ClusterName=dlstest
SlurmctldHost=localhost($ctl_addr)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups: tasks are tracked by process tree, and nothing needs /sys/fs/cgroup.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
SlurmctldPidFile=$root/slurmctld.pid
SlurmctldLogFile=$root/log/slurmctld.log
StateSaveLocation=$root/spool/ctld
SlurmdPidFile=$root/slurmd-%n.pid
SlurmdSpoolDir=$root/spool/%n
SlurmdLogFile=$root/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
KillWait=3
MinJobAge=30
Waittime=0
EOF
    gres=
    if [ "$gpus" -gt 0 ]; then
        echo "GresTypes=gpu"
        gres="Gres=gpu:fake:$gpus"
    fi
    for i in $(seq 1 "$nodes"); do
        n=$(node_name "$i")
        echo "NodeName=$n NodeHostname=$n NodeAddr=${addr[i]} Port=${port[i]} CPUs=$cpus RealMemory=1000 $gres State=UNKNOWN"
    done
    printf 'PartitionName=debug Nodes=dln[01-%02d] Default=YES MaxTime=INFINITE State=UP\n' "$nodes"
} >"$conf"
chmod 0644 "$conf"
# Fake GPUs: Slurm only needs a character device per GPU to hand out; nothing opens them.
if [ "$gpus" -gt 0 ]; then
    devs=(/dev/null /dev/zero /dev/full /dev/urandom)
    for g in $(seq 0 $((gpus - 1))); do
        echo "Name=gpu Type=fake File=${devs[g]}"
    done >"$root/gres.conf"
fi
# Plain `srun` without SLURM_CONF works too, unless the machine has a slurm.conf of its own.
# A link to our config left by a run that died before its stop counts as ours.
if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$conf" ]; then
    echo /etc/slurm/slurm.conf >"$root/etc-link"
elif [ ! -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ]; then
    mkdir -p /etc/slurm
    ln -s "$conf" /etc/slurm/slurm.conf
    echo /etc/slurm/slurm.conf >"$root/etc-link"
fi

# ------------------------------------------------------------------ slurmctld
mkdir -p "$root/spool/ctld"
/usr/sbin/slurmctld -f "$conf"
for _ in $(seq 100); do
    [ -s "$root/slurmctld.pid" ] && break
    sleep 0.05
done
alive_as "$(pid_of "$root/slurmctld.pid")" slurmctld || die "slurmctld did not start"
for _ in $(seq 100); do
    timeout 10 scontrol ping 2>/dev/null | grep -q 'UP' && break
    sleep 0.1
done
say "slurmctld up on port $ctld_port"

# ------------------------------------------------------------------ one slurmd per node
# nsenter, not `ip netns exec`: the latter mounts a fresh /sys, which hides /sys/fs/cgroup, and
# slurmd 22.05 refuses to start without it even when no cgroup plugin is configured.
for i in $(seq 1 "$nodes"); do
    n=$(node_name "$i")
    mkdir -p "$root/spool/$n"
    netns=()
    [ "$mode" = netns ] && netns=(nsenter "--net=/run/netns/dls-$n" --)
    "${netns[@]}" unshare --uts --mount --propagation private -- /bin/sh -c \
        "mount --bind '$root/hosts' /etc/hosts && hostname '$n' &&
         exec /usr/sbin/slurmd -f '$conf' -N '$n'" ||
        die "slurmd for $n did not start"
done
for i in $(seq 1 "$nodes"); do
    n=$(node_name "$i")
    for _ in $(seq 100); do
        [ -s "$root/slurmd-$n.pid" ] && break
        sleep 0.05
    done
    pid=$(pid_of "$root/slurmd-$n.pid")
    alive_as "$pid" slurmd || die "slurmd for $n died"
    # Pin the node's own namespaces with a bind mount: their inode numbers then stay ours until
    # cluster-stop.sh unmounts them, so it can recognise leftover processes by namespace without
    # ever mistaking a later, unrelated namespace for one of ours. Only namespaces this script
    # created qualify: in loopback mode the node shares the host's network namespace, and pinning
    # that would make cluster-stop.sh signal every process on the machine.
    kinds=(uts)
    [ "$mode" = netns ] && kinds+=(net)
    for kind in "${kinds[@]}"; do
        [ "$(stat -L -c %i "/proc/$pid/ns/$kind")" != "$(stat -L -c %i "/proc/$$/ns/$kind")" ] ||
            die "slurmd for $n is in this shell's $kind namespace; refusing to pin it"
        touch "$root/ns/$kind-$n"
        mount --bind "/proc/$pid/ns/$kind" "$root/ns/$kind-$n"
    done
done
touch "$root/up"

# ------------------------------------------------------------------ wait until every node is idle
deadline=$(($(date +%s) + timeout_s))
until [ "$(timeout 10 sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle$')" = "$nodes" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        timeout 10 sinfo -N -l || true
        die "nodes not idle after ${timeout_s}s"
    fi
    sleep 0.2
done
trap - EXIT
say "$nodes nodes idle ($mode mode): $(timeout 10 sinfo -h -o '%N')"
echo "export SLURM_CONF=$conf"
