// A real Prometheus (Debian's prometheus package) on loopback scrapes kvroute and two simulated vLLM workers
// while they serve traffic, with the chart's own alert rules (helm template of helm/kvroute). Through
// Prometheus' HTTP API it then checks what an operator relies on:
//   1. promtool finds nothing to say about kvroute's /metrics;
//   2. every query of the shipped Grafana dashboard returns data;
//   3. every rule evaluates without error, and every series a rule reads exists;
//   4. alerts that need a condition are driven into it and go pending: KvrouteShedding (a saturated fleet
//      refuses sheddable requests), KvrouteNoHealthyWorkers and KvrouteWorkerUnhealthy (the workers die),
//      KvrouteNoWorkers (they are removed), KvrouteReplicaDown and KvrouteDown (kvroute dies).
//
// usage: node prometheus_check.mjs   (ctest: prometheus_e2e; KVROUTE_BIN_DIR and KVROUTE_SOURCE_DIR say where
//        the binaries and the chart are; HELM a helm binary, else PATH, else the helm-check.sh cache)
// Exit status: 0 passed, 1 failed, 77 skipped (no prometheus, or no helm).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const SKIP = 77;
const root = process.env.KVROUTE_SOURCE_DIR ?? path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const binDir = process.env.KVROUTE_BIN_DIR ?? path.join(root, 'build/bin');
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'kvroute-prometheus-'));
const children = [];
let failures = 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pass = (what) => console.log(`ok    ${what}`);
const fail = (what) => { console.error(`FAIL  ${what}`); failures += 1; };

function cleanup() {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  fs.rmSync(work, { recursive: true, force: true });
}
process.on('exit', cleanup);

function which(name) {
  const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

function findHelm() {
  if (process.env.HELM) return process.env.HELM;
  const onPath = which('helm');
  if (onPath) return onPath;
  const cache = process.env.KVROUTE_TOOLS_DIR ?? path.join(process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), '.cache'), 'kvroute-tools');
  const cached = path.join(cache, 'helm', 'helm');
  return fs.existsSync(cached) ? cached : null;
}

// A block of `n` consecutive loopback ports, each free when probed. The workers use neighbouring ports (a
// second worker on port + 1, its events on events + 1, replays on events + 2 and + 3), so single ports from
// the kernel's ephemeral range would let one of those land on another's. The block is drawn below that range.
function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

async function freePorts(n) {
  for (;;) {
    const base = 20000 + Math.floor(Math.random() * 12000);
    let ok = true;
    for (let p = base; p < base + n && ok; ++p) ok = await portFree(p);
    if (ok) return base;
  }
}

function start(name, cmd, args) {
  const log = fs.openSync(path.join(work, `${name}.log`), 'w');
  const child = spawn(cmd, args, { stdio: ['ignore', log, log] });
  children.push(child);
  return child;
}

async function waitFor(what, check, ms = 20000) {
  const until = Date.now() + ms;
  for (;;) {
    try { if (await check()) return true; } catch { /* not yet */ }
    if (Date.now() > until) { fail(`${what} (waited ${ms / 1000} s)`); return false; }
    await sleep(200);
  }
}

// The chart's PrometheusRule, as a Prometheus rule file: its spec is one.
function renderRules(helm) {
  const r = spawnSync(helm, ['template', 'kvr', path.join(root, 'helm/kvroute'), '--namespace', 'router',
    '--set', 'metrics.prometheusRule.enabled=true', '--show-only', 'templates/prometheusrule.yaml'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`helm template: ${r.stderr}`);
  const lines = r.stdout.split('\n');
  const spec = lines.findIndex((l) => l === 'spec:');
  const body = lines.slice(spec + 1).map((l) => l.replace(/^ {2}/, '')).join('\n');
  fs.writeFileSync(path.join(work, 'rules.yml'), body);
  const check = spawnSync('promtool', ['check', 'rules', path.join(work, 'rules.yml')], { encoding: 'utf8' });
  if (check.status !== 0) throw new Error(`promtool check rules: ${check.stdout}${check.stderr}`);
}

// The dashboard's queries with Grafana's variables filled in: this namespace, a rate window of a few scrapes.
function dashboardQueries() {
  const d = JSON.parse(fs.readFileSync(path.join(root, 'helm/kvroute/dashboards/kvroute.json'), 'utf8'));
  const out = [];
  for (const p of d.panels ?? []) {
    for (const t of p.targets ?? []) {
      out.push({ title: p.title, expr: t.expr.replaceAll('$namespace', 'router').replaceAll('$__rate_interval', '15s') });
    }
  }
  return out;
}

async function query(prom, expr) {
  const r = await fetch(`http://127.0.0.1:${prom}/api/v1/query?query=${encodeURIComponent(expr)}`);
  const body = await r.json();
  if (body.status !== 'success') throw new Error(`${expr}: ${body.error}`);
  return body.data.result;
}

async function alertState(prom, name) {
  const r = await (await fetch(`http://127.0.0.1:${prom}/api/v1/alerts`)).json();
  return r.data.alerts.filter((a) => a.labels.alertname === name).map((a) => a.state);
}

// Chat requests sharing a system prompt (cache hits), half streamed with usage, until `stop()` says so.
async function load(api, stop, { maxTokens = 8 } = {}) {
  const system = 'You are a helpful assistant for the operations team. '.repeat(40);
  for (let i = 0; !stop(); i++) {
    const stream = i % 2 === 0;
    const body = {
      model: 'qwen3-8b', max_tokens: maxTokens, stream,
      messages: [{ role: 'system', content: system }, { role: 'user', content: `question ${i % 17}: ${'why '.repeat(i % 5 + 1)}` }],
      ...(stream ? { stream_options: { include_usage: true } } : {}),
    };
    try {
      const r = await fetch(`http://127.0.0.1:${api}/v1/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
      });
      await r.text();
    } catch { await sleep(50); }
  }
}

async function main() {
  const prometheus = which('prometheus');
  if (!prometheus || !which('promtool')) { console.log('SKIP: prometheus/promtool not installed (Debian: prometheus)'); return SKIP; }
  const helm = findHelm();
  if (!helm) { console.log('SKIP: helm not found (scripts/helm-check.sh fetches it)'); return SKIP; }
  renderRules(helm);
  pass('helm template: the PrometheusRule passes promtool check rules');

  const base = await freePorts(9);
  const [sim, kvEvents, api, admin, prom] = [base, base + 2, base + 6, base + 7, base + 8];
  // Two workers on sim and sim + 1; two at most running each (kvroute is told so), so a few long requests
  // saturate them.
  const simPort2 = sim + 1;
  const sims = start('sim', path.join(binDir, 'kvroute-sim'), ['--port', String(sim), '--workers', '2', '--speed', '5',
    '--max-num-seqs', '2', '--kv-events-port', String(kvEvents), '--kv-events-replay-port', String(kvEvents + 2)]);
  const worker = (p, k) => `http://127.0.0.1:${p},kv_events=tcp://127.0.0.1:${k},replay=tcp://127.0.0.1:${k + 2}`;
  const kvroute = start('kvroute', path.join(binDir, 'kvroute'), ['--listen', `127.0.0.1:${api}`, '--admin-listen', `127.0.0.1:${admin}`,
    '--worker', worker(sim, kvEvents), '--worker', worker(simPort2, kvEvents + 1), '--metrics-interval', '0.2',
    '--health-interval', '0.5', '--health-timeout', '0.3', '--threads', '2', '--worker-max-seqs', '2']);
  fs.writeFileSync(path.join(work, 'prometheus.yml'), `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [${path.join(work, 'rules.yml')}]
scrape_configs:
  - job_name: kvr-kvroute-admin
    static_configs: [{targets: ['127.0.0.1:${admin}'], labels: {namespace: router}}]
  - job_name: vllm
    static_configs: [{targets: ['127.0.0.1:${sim}', '127.0.0.1:${simPort2}'], labels: {namespace: router}}]
`);
  start('prometheus', prometheus, [`--config.file=${path.join(work, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(work, 'tsdb')}`,
    `--web.listen-address=127.0.0.1:${prom}`, '--log.level=warn']);
  if (!await waitFor('kvroute, the workers and Prometheus come up', async () =>
    (await fetch(`http://127.0.0.1:${api}/ready`)).ok && (await fetch(`http://127.0.0.1:${prom}/-/ready`)).ok)) return 1;

  // 1. promtool on kvroute's own exposition.
  const metrics = await (await fetch(`http://127.0.0.1:${admin}/metrics`)).text();
  const lint = spawnSync('promtool', ['check', 'metrics'], { input: metrics, encoding: 'utf8' });
  if (lint.status === 0) pass('promtool check metrics: kvroute /metrics is clean'); else fail(`promtool check metrics: ${lint.stdout}${lint.stderr}`);

  // Traffic for the rest of the checks.
  let loading = true;
  const traffic = Promise.all([1, 2, 3, 4].map(() => load(api, () => !loading)));
  await waitFor('all targets scraped', async () => (await query(prom, 'up == 1')).length === 3);
  await waitFor('the workers switch to precise mode', async () => (await query(prom, 'kvroute_worker_precise_mode == 1')).length === 2);

  // 2. Every dashboard query returns data.
  for (const q of dashboardQueries()) {
    if (await waitFor(`dashboard "${q.title}": ${q.expr}`, async () => (await query(prom, q.expr)).length > 0, 30000)) {
      pass(`dashboard "${q.title}": ${q.expr.slice(0, 90)}`);
    }
  }

  // 3. Every rule evaluates, on series that exist.
  const rules = (await (await fetch(`http://127.0.0.1:${prom}/api/v1/rules`)).json()).data.groups.flatMap((g) => g.rules);
  for (const r of rules) {
    await waitFor(`rule ${r.name} evaluated`, async () => {
      const now = (await (await fetch(`http://127.0.0.1:${prom}/api/v1/rules`)).json()).data.groups.flatMap((g) => g.rules).find((x) => x.name === r.name);
      return now.health === 'ok';
    });
    await query(prom, r.query);
    for (const series of new Set(r.query.match(/\bkvroute_[a-z_]+\b/g) ?? [])) {
      if ((await query(prom, `count(${series}{namespace="router"})`)).length === 0) fail(`rule ${r.name}: no series ${series}`);
    }
    pass(`rule ${r.name}: evaluates, its series exist`);
  }
  loading = false;
  await traffic;

  // 4a. Shedding: long requests fill both workers' queues, then sheddable requests are refused.
  let longRunning = true;
  // 24 clients on 2 workers running 2 each: every worker has far more than --shed-queue-depth (5) waiting.
  const long = Promise.all(Array.from({ length: 24 }, () => load(api, () => !longRunning, { maxTokens: 2000 })));
  let refused = 0;
  await waitFor('sheddable requests are refused while the fleet is saturated', async () => {
    const r = await fetch(`http://127.0.0.1:${api}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-kvroute-priority': 'sheddable' },
      body: JSON.stringify({ model: 'qwen3-8b', prompt: 'shed me', max_tokens: 1 }),
    });
    await r.text();
    if (r.status === 429) refused += 1;
    return refused >= 3;
  }, 60000);
  if (await waitFor('KvrouteShedding goes pending', async () => (await alertState(prom, 'KvrouteShedding')).length > 0)) {
    pass(`KvrouteShedding: ${refused} sheddable requests refused, alert ${(await alertState(prom, 'KvrouteShedding'))[0]}`);
  }
  longRunning = false;

  // 4b. The workers die: none healthy.
  sims.kill('SIGKILL');
  for (const name of ['KvrouteNoHealthyWorkers', 'KvrouteWorkerUnhealthy']) {
    if (await waitFor(`${name} goes pending`, async () => (await alertState(prom, name)).length > 0)) pass(`${name}: workers killed, alert pending`);
  }
  await long;

  // 4c. The workers are removed: none at all.
  for (const p of [sim, simPort2]) await fetch(`http://127.0.0.1:${admin}/admin/workers/127.0.0.1:${p}`, { method: 'DELETE' });
  if (await waitFor('KvrouteNoWorkers goes pending', async () => (await alertState(prom, 'KvrouteNoWorkers')).length > 0)) {
    pass('KvrouteNoWorkers: workers removed, alert pending');
  }

  // 4d. kvroute dies.
  kvroute.kill('SIGKILL');
  for (const name of ['KvrouteReplicaDown', 'KvrouteDown']) {
    if (await waitFor(`${name} goes pending`, async () => (await alertState(prom, name)).length > 0)) pass(`${name}: kvroute killed, alert pending`);
  }
  return failures ? 1 : 0;
}

main().then((code) => {
  if (code === 1) {
    for (const f of ['kvroute.log', 'sim.log', 'prometheus.log']) {
      const p = path.join(work, f);
      if (fs.existsSync(p)) console.error(`--- ${f} (tail)\n${fs.readFileSync(p, 'utf8').split('\n').slice(-30).join('\n')}`);
    }
  }
  console.log(code === 0 ? 'all checks passed' : code === SKIP ? 'skipped' : `${failures} check(s) failed`);
  process.exit(code);
}, (e) => { console.error(e); process.exit(1); });
