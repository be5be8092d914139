#!/usr/bin/env bash
# Stops the cluster that cluster-start.sh started and removes everything it created. It signals
# only processes that are provably ours: the daemons whose pids it recorded (checked against their
# program name), and processes living in the node namespaces it created and pinned (job steps and
# anything they left behind). It never matches processes by name.
set -uo pipefail

root=/run/dlaunch-slurm
export SLURM_CONF=$root/slurm.conf
t0=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - t0) / 1000000))
    printf '[cluster-stop %d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"
}

[ "$(id -u)" = 0 ] || { echo "cluster-stop.sh: needs root" >&2; exit 1; }
if [ ! -d "$root" ]; then
    say "nothing to stop"
    exit 0
fi

alive_as() {
    [ -n "$1" ] && [ -r "/proc/$1/comm" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
pid_of() { [ -s "$1" ] && tr -cd '0-9' <"$1" || true; }

# TERM, up to 5 s of grace, then KILL. Zombies count as gone: their parent reaps them.
terminate() {
    [ $# -gt 0 ] || return 0
    local p state left
    kill -TERM "$@" 2>/dev/null
    for _ in $(seq 50); do
        left=()
        for p in "$@"; do
            state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
            [ "$state" != Z ] && left+=("$p")
        done
        [ ${#left[@]} = 0 ] && return 0
        sleep 0.1
    done
    say "still alive after 5 s, killing: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null
}

ctld=$(pid_of "$root/slurmctld.pid")

# Cancel jobs first so that slurmd ends their steps in order.
if alive_as "$ctld" slurmctld; then
    jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        say "cancelling jobs $jobs"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null
        for _ in $(seq 30); do
            [ -z "$(timeout 10 squeue -h -o '%A' 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
fi

daemons=()
for f in "$root"/slurmd-*.pid; do
    [ -e "$f" ] || continue
    p=$(pid_of "$f")
    alive_as "$p" slurmd && daemons+=("$p")
done
[ ${#daemons[@]} -gt 0 ] && say "stopping slurmd ${daemons[*]}"
terminate "${daemons[@]}"

# Whatever still runs inside a node's namespaces (escaped tasks, slurmstepd): one stat over /proc
# gives every process's namespace inode; ours are pinned under $root/ns, so they cannot have been
# recycled for somebody else's namespace. A namespace this script itself lives in (the host's)
# is never ours, whatever the pins say: that guard is what keeps a wrong pin from signalling every
# process on the machine. PID 1 and this script's own ancestors are never signalled either.
ours=()
for f in "$root"/ns/uts-* "$root"/ns/net-*; do
    [ -e "$f" ] && mountpoint -q "$f" 2>/dev/null || continue
    kind=$(basename "$f")
    kind=${kind%%-*}
    ino=$(stat -L -c %i "$f")
    if [ "$ino" = "$(stat -L -c %i "/proc/$$/ns/$kind")" ]; then
        say "ignoring pin $f: it is the host's own $kind namespace"
        continue
    fi
    ours+=("$kind:$ino")
done
keep=" 1 "
p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
    keep+="$p "
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 0)
done
if [ ${#ours[@]} -gt 0 ]; then
    mapfile -t strays < <(
        for kind in uts net; do
            stat -L -c "$kind:%i %n" /proc/[0-9]*/ns/$kind 2>/dev/null
        done | awk -v ids="${ours[*]}" -v keep="$keep" '
                BEGIN { n = split(ids, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 }
                ($1 in want) { split($2, d, "/"); if (index(keep, " " d[3] " ") == 0) print d[3] }' |
            sort -un)
    if [ ${#strays[@]} -gt 0 ]; then
        say "stopping processes left in the node namespaces: ${strays[*]}"
        terminate "${strays[@]}"
    fi
fi

if alive_as "$ctld" slurmctld; then
    say "stopping slurmctld $ctld"
    terminate "$ctld"
fi

munged=$(pid_of "$root/munged.pid")
if alive_as "$munged" munged; then
    say "stopping munged $munged (we started it)"
    terminate "$munged"
fi

for f in "$root"/ns/*; do
    [ -e "$f" ] && umount "$f" 2>/dev/null
done
if [ -s "$root/netns" ]; then
    while read -r ns; do
        i=${ns#dls-dln}
        ip link del "dlsv$((10#$i))" 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done <"$root/netns"
fi
if [ -s "$root/bridge" ]; then
    ip link del "$(cat "$root/bridge")" 2>/dev/null
fi
if [ -s "$root/etc-link" ]; then
    link=$(cat "$root/etc-link")
    [ "$(readlink "$link" 2>/dev/null)" = "$root/slurm.conf" ] && rm -f "$link"
fi
rm -rf "$root"
say "stopped"
