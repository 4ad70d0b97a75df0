#!/bin/sh
# A corral cluster on one machine, step by step (docs/cluster.md, "A cluster on one machine"):
# etcd, two operator replicas, two agents; a pod's addresses, a check, a node removed. Each
# step waits for what it needs first, so it works pasted or run as it is:
#   cargo build --release -p corral-cli && scripts/cluster-demo.sh
# Settings (environment): CORRAL (default target/release/corral), DEMO_DIR (default a new
# directory under /tmp), ETCD_PORT (default 2379; the peer port is the next one), ETCD and
# ETCDCTL (default etcd and etcdctl on PATH; `make deps` installs Debian's). Everything it
# started is stopped when it ends; tests/cluster_demo.rs runs it as written.
set -eu
B=$(realpath "${CORRAL:-target/release/corral}")
PORT=${ETCD_PORT:-2379}
E=http://127.0.0.1:$PORT
PEER=http://127.0.0.1:$((PORT + 1))
DIR=${DEMO_DIR:-$(mktemp -d /tmp/corral-demo.XXXXXX)}
mkdir -p "$DIR" && cd "$DIR"
pids=""
trap 'for pid in $pids; do kill "$pid" 2>/dev/null || true; done; wait' EXIT INT TERM

# Runs the command in $2... until it succeeds, every 0.2 s, for at most 60 s (saying $1).
wait_for() {
    what=$1; shift
    tries=0
    until "$@" >/dev/null 2>&1; do
        tries=$((tries + 1))
        if [ "$tries" -ge 300 ]; then echo "demo: gave up waiting for $what" >&2; exit 1; fi
        sleep 0.2
    done
    echo "# ready: $what"
}
# The step's command, printed before it runs.
step() { echo "\$ corral $*"; "$B" "$@"; }

# 1. etcd, and wait until it answers (`cluster status` exits 3 while etcd is unreachable, 1
#    while the cluster has no configuration).
"${ETCD:-etcd}" --data-dir etcd --name demo --listen-client-urls $E --advertise-client-urls $E \
    --listen-peer-urls $PEER --initial-advertise-peer-urls $PEER \
    --initial-cluster demo=$PEER >etcd.log 2>&1 &
pids="$pids $!"
etcd_answers() { "$B" cluster status --etcd $E >/dev/null 2>&1 || [ $? -ne 3 ]; }
wait_for "etcd answers" etcd_answers

# 2. The cluster's configuration: node CIDRs, IPv4 /24s and IPv6 /64s.
cat > cluster.toml <<'TOML'
quarantine_secs = 300            # a removed node's CIDRs wait this long after it gave them up
[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.244.0.0/16"]
node_prefix_len = 24
reserved = ["10.244.0.0/24"]     # never granted (a service CIDR, say)
[pools.ipv6]
cidrs = ["fd00:10:244::/56"]
node_prefix_len = 64
TOML
step cluster init --etcd $E --config cluster.toml

# 3. Two operator replicas (one leads, the other stands by); wait until one leads.
for op in a b; do
    "$B" operator --etcd $E --api-socket op-$op.sock >op-$op.log 2>&1 &
    pids="$pids $!"
done
leads() { "$B" cluster status --etcd $E -o json | grep -q '"leader": "'; }
wait_for "an operator leads" leads

# 4. Two agents, node-a and node-b; wait until each serves both of its CIDRs (its status
#    lists pool default's ipv4 and ipv6).
for n in a b; do
    mkdir -p $n
    printf 'data_dir = "%s/state"\nsocket = "%s/agent.sock"\ncni_data_dirs = []\n' $n $n > $n.toml
    "$B" agent --config $n.toml --etcd $E --node node-$n >agent-$n.log 2>&1 &
    pids="$pids $!"
done
serves() { [ "$("$B" --socket "$1"/agent.sock status | grep -c ' default  *ipv[46] ')" = 2 ]; }
wait_for "node-a serves its CIDRs" serves a
wait_for "node-b serves its CIDRs" serves b
step node list --etcd $E

# 5. A pod's addresses, from node-a's CIDRs; the cluster checked against both agents.
step --socket a/agent.sock alloc --owner pod-1 --family dual
step cluster check --etcd $E --agent a/agent.sock --agent b/agent.sock

# 6. Removing node-a: node-a's agent reports its pod to etcd (its holdings record, within
#    about 5 s); until then a plain removal would not know the node holds one.
counted() {
    "${ETCDCTL:-etcdctl}" --endpoints $E get --print-value-only /corral/default/v1/holdings/node-a |
        grep -q '"allocations":[1-9]'
}
wait_for "node-a's holdings count pod-1" counted
if step node remove node-a --etcd $E; then
    echo "demo: removing a live node with a pod was not refused" >&2; exit 1
else
    echo "# refused (exit $?): node-a is live and has pod-1"
fi
step node remove node-a --etcd $E --drain       # node-a takes no new pods; its CIDRs wait for pod-1
removed() { ! "$B" node list --etcd $E | grep -q '^node-a '; }
wait_for "the leader removed node-a" removed
step node show node-a --etcd $E
step --socket a/agent.sock release --owner pod-1   # node-a gives its CIDRs up: quarantine
given_up() { "$B" node show node-a --etcd $E -o json | grep -q '"state": "quarantined"'; }
wait_for "node-a's CIDRs are in quarantine" given_up
step node show node-a --etcd $E
step cluster status --etcd $E
echo "# done: everything the demo started stops now"
