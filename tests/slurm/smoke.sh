#!/usr/bin/env bash
# Checks that the cluster from cluster-start.sh behaves like a real multi-node Slurm cluster, in the
# ways dlaunch relies on. Prints one PASS/FAIL line a check and "N passed, N failed" at the end;
# exits 0 only when nothing failed.
#
#   sudo tests/slurm/cluster-start.sh && tests/slurm/smoke.sh; sudo tests/slurm/cluster-stop.sh
set -uo pipefail

export SLURM_CONF=${SLURM_CONF:-/run/dlaunch-slurm/slurm.conf}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
passed=0
failed=0
pass() {
    echo "PASS: $*"
    passed=$((passed + 1))
}
fail() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}
# Every Slurm command gets a deadline: a hung step must fail the check, not the whole run.
run() { timeout 60 "$@" 2>&1; }

# Without a controller every Slurm command retries for minutes: give up at once instead.
if [ ! -r "$SLURM_CONF" ] || ! timeout 10 scontrol ping 2>/dev/null | grep -q UP; then
    fail "no cluster answers at $SLURM_CONF (start one with tests/slurm/cluster-start.sh)"
    echo "$passed passed, $failed failed"
    exit 1
fi

work=$(mktemp -d /tmp/dls-smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# 1. every node is up
mapfile -t nodes < <(run scontrol show hostnames "$(timeout 30 sinfo -h -o '%N' 2>/dev/null)")
idle=$(timeout 30 sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle$')
if [ ${#nodes[@]} -ge 2 ] && [ "$idle" = ${#nodes[@]} ]; then
    pass "${#nodes[@]} nodes idle: ${nodes[*]}"
else
    fail "nodes not all idle: $(timeout 30 sinfo -h -N -o '%N=%t' 2>&1 | tr '\n' ' ')"
fi

# 2. two nodes, two host names, and they are the nodes' names
out=$(run srun -N2 --ntasks-per-node=1 hostname)
names=$(sort -u <<<"$out" | tr '\n' ' ')
if [ "$(sort -u <<<"$out" | grep -c .)" = 2 ] && grep -qx "${nodes[0]}" <<<"$out"; then
    pass "srun -N2 hostname: $names"
else
    fail "srun -N2 hostname printed: $out"
fi

# 3. each task sees its own node: hostname, SLURMD_NODENAME and SLURM_NODEID agree with the list
out=$(run srun -N2 --ntasks-per-node=1 bash -c \
    'h=($(scontrol show hostnames "$SLURM_STEP_NODELIST"));
     echo "$SLURM_NODEID $(hostname) $SLURMD_NODENAME ${h[$SLURM_NODEID]}"')
if [ "$(grep -c .  <<<"$out")" = 2 ] && awk 'NF != 4 || $2 != $3 || $3 != $4 { bad = 1 }
        { ids[$1] = 1 } END { exit bad || !(0 in ids) || !(1 in ids) }' <<<"$out"; then
    pass "SLURM_NODEID, hostname and the step's node list agree"
else
    fail "node identity: $out"
fi

# 4. one file system: the checkout is visible on every node, and a file one node writes the other
#    reads (dlaunch and its tests run from the checkout on all nodes)
out=$(run srun -N2 --ntasks-per-node=1 test -r "$here/smoke.sh" && echo ok)
run srun -N1 -w "${nodes[1]}" bash -c "hostname > '$work/written-by'" >/dev/null
back=$(run srun -N1 -w "${nodes[0]}" cat "$work/written-by")
if [ "$out" = ok ] && [ "$back" = "${nodes[1]}" ]; then
    pass "shared files: $here visible on the nodes; ${nodes[1]} wrote, ${nodes[0]} read"
else
    fail "shared files: checkout '$out', read back '$back'"
fi

# 5. TCP from the second node to a server on the first, by the first node's name (what a
#    rendezvous does)
if command -v python3 >/dev/null; then
    cat >"$work/tcp.py" <<'EOF'
import os, socket, subprocess, sys, time
hosts = subprocess.check_output(["scontrol", "show", "hostnames",
                                 os.environ["SLURM_STEP_NODELIST"]], text=True).split()
port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 12000
if os.environ["SLURM_NODEID"] == "0":
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    conn, peer = srv.accept()
    conn.sendall(("hello from " + socket.gethostname()).encode())
    conn.close()
else:
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((hosts[0], port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    print(socket.gethostname(), "got:", conn.recv(100).decode())
EOF
    out=$(run srun -N2 --ntasks-per-node=1 python3 "$work/tcp.py")
    if grep -q "^${nodes[1]} got: hello from ${nodes[0]}$" <<<"$out"; then
        pass "TCP ${nodes[1]} -> ${nodes[0]} by name"
    else
        fail "TCP: $out"
    fi
else
    echo "SKIP: TCP check needs python3"
fi

# 6. sbatch --wait: the batch script runs on the first node and its srun spans both
cat >"$work/job.sh" <<'EOF'
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH -t 2
echo "batch on $(hostname) nodelist=$SLURM_JOB_NODELIST"
srun -N2 --ntasks-per-node=1 bash -c 'echo "step $SLURM_NODEID on $(hostname)"'
EOF
out=$(run sbatch --wait -o "$work/job-%j.out" "$work/job.sh")
rc=$?
log=$(cat "$work"/job-*.out 2>/dev/null)
if [ $rc = 0 ] && grep -q "^batch on ${nodes[0]} " <<<"$log" &&
    [ "$(grep '^step ' <<<"$log" | awk '{print $4}' | sort -u | grep -c .)" = 2 ]; then
    pass "sbatch -N2 --wait with srun -N2 inside"
else
    fail "sbatch (rc $rc): $out / $log"
fi

# 7. fake GPUs, when the cluster has them (DLS_GPUS)
if scontrol show node "${nodes[0]}" 2>/dev/null | grep -q 'Gres=gpu'; then
    out=$(run srun -N2 --gpus-per-node=1 bash -c 'echo "$SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES"')
    if [ "$(grep -c '^1 0$' <<<"$out")" = 2 ]; then
        pass "--gpus-per-node=1: SLURM_GPUS_ON_NODE=1, CUDA_VISIBLE_DEVICES=0 on both nodes"
    else
        fail "GPUs: $out"
    fi
fi

echo "$passed passed, $failed failed"
[ $failed = 0 ]
