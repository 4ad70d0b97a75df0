#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/corpus/<target>/seed-*) from the tests, the docs and the
record shapes of crates/corral-cluster/src/keys.rs; run from the repository root. The files it
writes are committed; cargo fuzz adds its finds beside them (`make fuzz` keeps them out of git
unless `fuzz/corpus` is minimized and committed by hand)."""
import hashlib, json, os, re, tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")

def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def raw_strings(path):
    return re.findall(r'r#"(.*?)"#', read(path), re.S)

def toml_blocks(path):
    return re.findall(r"```toml\n(.*?)```", read(path), re.S)

# ---- CNI: configurations from the plugin's tests and docs, each also with an environment.
cni = []
for path in ["crates/corral-cni/tests/protocol.rs", "crates/corral-cni/src/config.rs",
             "crates/corral-cni/src/lib.rs", "crates/corral-cni/tests/binary.rs",
             "crates/corral-cni/tests/agent_mode.rs", "crates/corral-cni/tests/node_pool.rs"]:
    for text in raw_strings(path):
        try:
            if "cniVersion" in text and isinstance(json.loads(text), dict):
                cni.append(text)
        except ValueError:
            pass
for text in re.findall(r"```json\n(.*?)```", read("docs/cni-plugin.md"), re.S):
    try:
        if "cniVersion" in text and isinstance(json.loads(text), dict):
            cni.append(text)
    except ValueError:
        pass
cni = sorted(set(cni))[:60]
envs = [
    "CNI_COMMAND=ADD\nCNI_CONTAINERID=c1\nCNI_NETNS=/run/netns/c1\nCNI_IFNAME=eth0\nCNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IP=10.1.0.7\n",
    "CNI_COMMAND=DEL\nCNI_CONTAINERID=c1\nCNI_IFNAME=eth0\n",
    "CNI_COMMAND=CHECK\nCNI_CONTAINERID=c1\nCNI_NETNS=/run/netns/c1\nCNI_IFNAME=eth0\n",
    "CNI_COMMAND=GC\nCNI_PATH=/opt/cni/bin\n",
    "CNI_COMMAND=STATUS\n",
    "CNI_COMMAND=VERSION\n",
]
for i, text in enumerate(cni):
    put("cni_config", text)
    put("cni_invocation", envs[i % len(envs)] + "\n" + text)
for env in envs:
    put("cni_invocation", env + "\n" + cni[0])

# ---- corral-client: answers as the client's tests send them.
body = json.dumps({"summary": ["node: 1 allocated"], "scopes": []})
for response in [
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 37\r\n\r\n{\"allocations\":[],\"ok\":true,\"x\":1234}",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"ok\"\r\n6;ext=1\r\n:true}\r\n0\r\nTrailer: x\r\n\r\n",
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 13\r\n\r\nupstream died",
    "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: 61\r\n\r\n{\"error\":{\"code\":\"conflict\",\"message\":\"address 10.0.0.1 held\"}}",
    "HTTP/1.0 200 OK\r\n\r\n" + body,
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"allocations\"",
]:
    for piece in [b"\x00", b"\x03"]:
        put("client_response", piece + response.encode())

# ---- agent configuration: the module doc's example and the tests' files.
agent_toml = re.findall(r"^//! ```toml\n(.*?)^//! ```", read("crates/corral-agent/src/config.rs"), re.S | re.M)
for block in agent_toml:
    put("agent_config", re.sub(r"^//! ?", "", block, flags=re.M))
for text in [
    "history_max_events = 5000\nhistory_max_age = \"12h\"\n",
    "[connections]\nmax_tcp = 16\nheader_timeout_ms = 1500\n",
    "[[pools]]\nname = \"a\"\nexclusions = [{ network = \"10.1.0.5\", reason = \"vip\" }]\n",
    "[[pools]]\nname = \"blue\"\nranges = [\"10.1.0.0/24\", \"10.1.1.10-10.1.1.20\"]\ncooldown_ms = 0\nlowest_free = true\n",
    "tcp = \"127.0.0.1:9876\"\n[log]\nformat = \"json\"\nlevel = \"debug\"\n",
]:
    put("agent_config", text)
for block in toml_blocks("docs/agent.md"):
    put("agent_config", block)

# ---- agent API bodies: the OpenAPI document's examples, each under its route byte.
routes = {"AllocateRequest": 0, "ReleaseRequest": 1, "CniAddRequest": 2, "CniKeyRequest": 3,
          "CniStatusRequest": 5, "CniGcRequest": 6, "GcRequest": 7, "LeaseStopRequest": 8,
          "RangeRequest": 9, "ExclusionRequest": 10, "InterfaceRequest": 12,
          "IpamdImportRequest": 13, "LeaseStartRequest": 14, "ReserveLocalRoutesRequest": 15}
openapi = json.loads(read("openapi.json"))
for name, schema in openapi.get("components", {}).get("schemas", {}).items():
    if name not in routes:
        continue
    for example in schema.get("examples", []) + ([schema["example"]] if "example" in schema else []):
        put("agent_api", bytes([routes[name]]) + json.dumps(example).encode())
        if name == "CniKeyRequest":
            put("agent_api", bytes([4]) + json.dumps(example).encode())
        if name == "ExclusionRequest":
            put("agent_api", bytes([11]) + json.dumps(example).encode())
# A checkpoint `corral export` wrote (an agent with API allocations, a lease, and a CNI network
# through corral-ipam in agent mode), kept as fuzz/corpus/checkpoint_import/exported.json.
with open(os.path.join(OUT, "checkpoint_import", "exported.json"), "rb") as f:
    checkpoint = f.read()
put("agent_api", b"\x0f" + checkpoint)
put("agent_api", b"\x00[\"pod-a\"]")
put("agent_api", b"\x02\"a string\"")

# ---- history queries.
for q in ["address=10.88.0.5&at=2026-11-27T14:02:00Z", "pod=default/web-0&limit=10",
          "key=c1/eth0&since=1700000000000&until=2026-11-27T14:02:00.123%2B01:00",
          "at=2026-02-29T00:00", "limit=0", "address=10.88.0.5&at=1700000000000&unknown=1"]:
    put("agent_history_query", q)
for q in ["address=10.244.1.0/24", "address=10.244.1.7&at=2026-11-27T14:02:00.5-05:30",
          "node=node-a&limit=10000", "at=2026-11-27t14:02", "address=a&node=b", "limit=abc"]:
    put("operator_history_query", q)

# ---- operator configuration: the shipped file (as shipped, every setting uncommented, and
# those with a default only), the module doc's example and the tests' files.
shipped = read("packaging/operator.toml")
put("operator_config", shipped)
put("operator_config", re.sub(r"^#([a-z\[])", r"\1", shipped, flags=re.M))
put("operator_config", re.sub(r"^#(?!(replica|api_tcp|token_file|state_dir|endpoints|etcd_[a-z_]*|fake_cloud|endpoint|name = \"aws\") )([a-z\[])",
                              r"\2", shipped, flags=re.M))
for block in re.findall(r"^//! ```toml\n(.*?)^//! ```", read("crates/corral-operator/src/config.rs"), re.S | re.M):
    put("operator_config", re.sub(r"^//! ?", "", block, flags=re.M))
for text in [
    "workers = 4\nlease_ttl_secs = 3\n[cluster]\nendpoints = [\"http://a:1\"]\nname = \"blue\"\netcd_user = \"u\"\n[log]\nlevel = \"debug\"\n",
    "[cluster]\nendpoints = [\"http://127.0.0.1:2379\", \"https://10.0.0.2:2379\"]\nname = \"t\"\n",
    "api_tcp = \"127.0.0.1:9877\"\ntoken_file = \"/etc/corral/operator-token\"\nsettle_secs = 0\n",
    "lease_ttl_secs = 9000000000\nworkers = 1\n[cloud]\nname = \"fake\"\nfake_cloud = \"seed.json\"\n",
    "api_tcp = \"[::1]:9877\"\nreplica = \"op-b\"\n[log]\nformat = \"json\"\nlevel = \"TRACE\"\n",
]:
    put("operator_config", text)

# ---- ipamd checkpoints (the tests' shapes).
entry = {"networkName": "aws-cni", "containerID": "c1", "ifName": "eth0", "ipv4": "10.0.0.5",
         "allocationTimestamp": 1700000000000000000,
         "metadata": {"k8sPodNamespace": "default", "k8sPodName": "pod-c1"}}
nested = {"ipamKey": {"networkName": "aws-cni", "containerID": "c2", "ifName": "eth0"},
          "ipv6": "2600:1f14::5", "someFutureField": True}
backfill = {"networkName": "_migrated-from-cri", "containerID": "c3", "ifName": "unknown",
            "ipv4": "10.0.0.6"}
for doc in [{"version": "vpc-cni-ipam/1", "allocations": [entry, nested, backfill]},
            {"version": "vpc-cni-ipam/1", "allocations": None},
            {"version": "vpc-cni-ipam/2", "allocations": []}]:
    put("ipamd_checkpoint", json.dumps(doc))

# ---- cluster configurations: the tests' files and the docs' examples.
for d in ["crates/corral-cluster/tests/configs", "crates/corral-cli/tests/configs"]:
    for name in sorted(os.listdir(os.path.join(ROOT, d))):
        put("cluster_config", read(os.path.join(d, name)))
for doc in ["docs/cluster.md", "docs/cloud.md"]:
    for block in toml_blocks(doc):
        put("cluster_config", block)
for text in raw_strings("crates/corral-cluster/src/config/raw.rs"):
    put("cluster_config", text)

# ---- etcd keys and records (crates/corral-cluster/src/keys.rs's layout).
rec = lambda **fields: json.dumps({"schema": 1, **fields})
records_config = json.dumps({"schema": 1, "config_revision": 1, "config": {
    "quarantine_secs": 60, "pools": [{"name": "default", "ipv4": {"cidrs": ["10.244.0.0/16"], "node_prefix_len": 24}}]}})
node_keys = [
    ("nodes/n1", rec(uid="u1", addresses=["192.168.1.10"], registered_ms=1, max_pods=110)),
    ("nodes/n2", rec(uid="u2", instance_id="i-1")),
    ("live/n1", rec(pid=7, version="0.1.0", started_ms=1, host="h", ttl_ms=20000)),
    ("grants/default/ipv4/10.244.1.0-24", rec(node="n1", uid="u1", node_revision=2, granted_ms=5)),
    ("owned/n1/default/ipv4/10.244.1.0-24", rec(node_revision=2)),
    ("grants/pods/ipv4/10.64.0.0-26", rec(node="n1", uid="u1", node_revision=2)),
    ("owned/n1/pods/ipv4/10.64.0.0-26", rec(node_revision=2)),
    ("grants/pods/ipv6/fd00:64::-122", rec(node="n2", uid="u2", node_revision=3)),
    ("owned/n2/pods/ipv6/fd00:64::-122", rec(node_revision=3)),
    ("nodeids/id/1", rec(node="n1", uid="u1", node_revision=2)),
    ("nodeids/node/n1", rec(id=1)),
    ("quarantine/default/ipv4/10.244.9.0-24", rec(from_node="n9", reason="removed", since_ms=1)),
    ("quarantine-ids/9", rec(from_node="n9", reason="removed", since_ms=1)),
    ("removals/n2", rec(node_revision=3, requested_ms=9, mode="drain", phase="draining")),
    ("silence/n2", rec(since_ms=9)),
    ("holdings/n1", rec(uid="u1", ranges=[{"pool": "default", "cidr": "10.244.1.0/24", "allocations": 3}], node_id=1, written_ms=4)),
    ("demand/n1/pods", rec(ipv4={"used": 60, "free": 4, "pending": 2, "blocks": 1, "empty": ["10.64.0.64/26"]}, at_ms=3)),
    ("release/n1/pods/ipv4/10.64.0.0-26", rec(state="marked", grant_revision=4, marked_ms=5)),
    ("release/n2/pods/ipv6/fd00:64::-122", rec(state="ready", grant_revision=3, answered_ms=6, reason="empty")),
    ("owned/n1/waiting", rec(since_ms=1, waits=[{"pool": "pods", "family": "ipv4", "unit": "block", "cause": "exhausted", "why": "no free block"}])),
    ("interfaces/n1/eni-0a1b", rec(pool="pods", instance_id="i-1", device_index=1, subnet_id="subnet-1", subnets=["10.0.0.0/16"], mac="02:00:00:00:00:01", addresses=["10.0.0.5/32", "10.0.0.16/28"], attachment="attached", managed=True)),
    ("reassert", rec(requested_ms=1, replica="op-a", reason="etcd went back")),
    ("meta/schema", rec(version=1)),
    ("config-applied", records_config),
    ("election/694d77aa9e38260f", rec(replica="op-a")),
    ("history/at/0000001700000000/default/ipv4/10.244.2.0-24", rec(pool="default", cidr="10.244.2.0/24", node="n3", from_ms=1, to_ms=2, why="released")),
]
for target in ["cluster_records", "agent_records"]:
    put(target, b"\x00".join(f"{k}\n{v}".encode() for k, v in node_keys))
    put(target, b"\x00".join(f"{k}\n{v}".encode() for k, v in node_keys[:8]) + b"\x00-owned/n1/default/ipv4/10.244.1.0-24")
    for k, v in node_keys:
        put(target, f"{k}\n{v}")
for k, _ in node_keys:
    put("cluster_keys", k)
put("cluster_keys", "/corral/other/v1/config")
put("cluster_keys", "config")
for text in ['{"highest":{"cluster_id":14841639068965178418,"revision":42}}',
             '{"highest":{"cluster_id":1,"revision":9},"unsettled":{"remembered":{"cluster_id":1,"revision":9},"found":{"cluster_id":2,"revision":3}}}',
             "{}"]:
    put("epoch_file", text)

# ---- the store's imports: a checkpoint an agent exported, host-local directories, a pending DEL.
put("checkpoint_import", json.dumps({"format": "corral-checkpoint/1", "scopes": []}))
for files in [
    [("10.1.0.2", "c1\r\neth0"), ("10.1.0.3", "c2"), ("last_reserved_ip.0", "10.1.0.3"), ("lock", "")],
    [("fd01::2", "c1\r\neth1\r\n"), ("10.1.0.2", "c1\r\neth0"), ("10.1.0.9", "\x01"), ("last_reserved_ip.x", "1")],
    [("10.1.0.2", ""), ("10.1.0.4", "c1\r\neth0"), ("10.1.0.5", "c1\r\neth0"), ("last_reserved_ip.1", "junk")],
]:
    put("host_local", b"".join(n.encode() + b"\x00" + c.encode() + b"\x00" for n, c in files))
# pending_del's seed, fuzz/corpus/pending_del/recorded.del, is a record corral-ipam wrote for a
# DEL while its agent was stopped.
