// Checks the deployment files (docs/DEPLOY.md) with tools we did not write, and against the real server.
//   node check_deploy.cjs k8s DIR            every manifest in DIR against the Kubernetes schemas (kubernetes-models'
//                                            validate()) and the API's TypeScript types (tsc: unknown fields), plus
//                                            the references between them (labels, names, ports, metric)
//   node check_deploy.cjs dockerfile FILE    dockerfile-utils' linter, plus what the image must have
//   node check_deploy.cjs packages FILE build|runtime   prints the packages the stage installs with apt-get
//   node check_deploy.cjs context ROOT DOCKERIGNORE OUT   copies the files of ROOT that `docker build` would send
//                                            (the .dockerignore rules, as @balena/dockerignore reads them) to OUT
//   node check_deploy.cjs live CLEF MODEL K8S_DIR DOCKERFILE UNIT
//        runs `clef serve` with the Deployment's arguments (MODEL instead of the weights, loopback, any port) and
//        checks the probes, the HPA's metric, the API key from the Secret, the image's HEALTHCHECK command and the
//        flags of the Dockerfile's CMD and the systemd unit's ExecStart and CLEF_SERVE_ARGS against
//        `clef serve --help`.
// Exit 1 with one line per problem. Modules come from NODE_PATH (tests/deploy/check.sh installs them).
"use strict";
const fs = require("fs");
const path = require("path");
const { spawn, spawnSync } = require("child_process");
const YAML = require("yaml");

const problems = [];
const fail = (msg) => problems.push(msg);
function finish() {
  for (const p of problems) console.error(p);
  process.exit(problems.length ? 1 : 0);
}

// ---- Kubernetes ----

function readDocs(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  for (const d of docs) for (const e of d.errors) fail(`${file}: YAML: ${e.message}`);
  return docs.map((d) => d.toJS()).filter((d) => d !== null);
}

// kubernetes-models' module of a resource: kubernetes-models/<group>/<version>/<Kind> (core: v1/<Kind>).
const modelPath = (doc) => `kubernetes-models/${doc.apiVersion}/${doc.kind}`;

function schemaCheck(file, doc) {
  let Model;
  try {
    Model = require(modelPath(doc))[doc.kind];
  } catch {
    return fail(`${file}: unknown apiVersion/kind ${doc.apiVersion}/${doc.kind}`);
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    fail(`${file}: ${doc.kind} ${doc.metadata && doc.metadata.name}: ${e.message}`);
  }
}

// The schemas let unknown fields pass (the API server drops them, at most with a warning); the TypeScript types
// do not: each document becomes a typed object literal, and tsc's excess-property check names a misspelt field.
function typeCheck(entries) {
  const ts = require("typescript");
  const root = path.dirname(path.dirname(path.dirname(require.resolve("kubernetes-models/package.json"))));
  const dir = fs.mkdtempSync(path.join(root, "deploy-check-"));
  const files = entries.map(({ file, doc }, i) => {
    const f = path.join(dir, `${path.basename(file, ".yaml")}-${i}.ts`);
    const type = `import type { I${doc.kind} as T } from "${modelPath(doc)}";\n`;
    fs.writeFileSync(f, `${type}export const doc: T = ${JSON.stringify(doc, null, 2)};\n`);
    return f;
  });
  const options = { noEmit: true, strict: true, skipLibCheck: true, types: [],
                    module: ts.ModuleKind.Node16, moduleResolution: ts.ModuleResolutionKind.Node16 };
  const program = ts.createProgram(files, options);
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const i = files.indexOf(d.file ? d.file.fileName : "");
    const where = i >= 0 ? `${entries[i].file}: ${entries[i].doc.kind}` : "tsc";
    fail(`${where}: ${ts.flattenDiagnosticMessageText(d.messageText, " ")}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
}

const byKind = (entries, kind) => entries.filter((e) => e.doc.kind === kind).map((e) => e.doc);
const subset = (a, b) => Object.entries(a || {}).every(([k, v]) => b && b[k] === v);

function kustomizationCheck(dir, entries) {
  const kfile = path.join(dir, "kustomization.yaml");
  const [k] = readDocs(kfile);
  if (!k || k.kind !== "Kustomization" || k.apiVersion !== "kustomize.config.k8s.io/v1beta1")
    return fail(`${kfile}: not a kustomize.config.k8s.io/v1beta1 Kustomization`);
  const known = ["apiVersion", "kind", "namespace", "labels", "resources", "images", "secretGenerator",
                 "configMapGenerator", "generatorOptions", "patches"];
  for (const key of Object.keys(k)) if (!known.includes(key)) fail(`${kfile}: unknown field ${key}`);
  const listed = new Set(k.resources || []);
  for (const r of listed) if (!fs.existsSync(path.join(dir, r))) fail(`${kfile}: resource ${r} does not exist`);
  for (const { file } of entries) {
    const base = path.basename(file);
    if (!base.includes(".example.") && !listed.has(base)) fail(`${kfile}: ${base} is not in resources`);
  }
  const images = byKind(entries, "Deployment").flatMap((d) => d.spec.template.spec.containers)
                                              .map((c) => c.image.split(":")[0]);
  for (const img of k.images || []) if (!images.includes(img.name)) fail(`${kfile}: image ${img.name} is unused`);
}

// What a schema cannot see: the labels, ports and names the objects refer to each other by.
function podReferenceCheck(entries, dep) {
  const pod = dep.spec.template;
  if (!subset(dep.spec.selector.matchLabels, pod.metadata.labels)) fail("Deployment: selector misses the pod labels");
  const c = pod.spec.containers[0];
  const ports = (c.ports || []).map((p) => p.name);
  for (const svc of byKind(entries, "Service")) {
    if (!subset(svc.spec.selector, pod.metadata.labels)) fail(`Service ${svc.metadata.name}: selects no pod`);
    for (const p of svc.spec.ports) if (!ports.includes(p.targetPort)) fail(`Service: no port ${p.targetPort}`);
  }
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const g = c[probe] && c[probe].httpGet;
    if (!g) fail(`Deployment: no ${probe}.httpGet`);
    else if (!ports.includes(g.port)) fail(`Deployment: ${probe} port ${g.port} is not a container port`);
  }
}

function objectReferenceCheck(entries, dep, adapterFile) {
  const named = (kind, name) => byKind(entries, kind).filter((o) => o.metadata.name === name);
  for (const v of dep.spec.template.spec.volumes || []) {
    const claim = v.persistentVolumeClaim && v.persistentVolumeClaim.claimName;
    if (claim && !named("PersistentVolumeClaim", claim).length) fail(`Deployment: no PersistentVolumeClaim ${claim}`);
  }
  for (const e of dep.spec.template.spec.containers[0].env || []) {
    const ref = e.valueFrom && e.valueFrom.secretKeyRef;
    if (ref && !named("Secret", ref.name).some((s) => ref.key in (s.stringData || s.data || {})))
      fail(`Deployment: env ${e.name}: no Secret ${ref.name} with key ${ref.key}`);
  }
  for (const h of byKind(entries, "HorizontalPodAutoscaler"))
    if (h.spec.scaleTargetRef.name !== dep.metadata.name) fail(`HPA ${h.metadata.name}: targets no Deployment`);
  const [adapter] = readDocs(adapterFile);
  const served = adapter.rules.custom.map((r) => r.name.as);
  for (const m of hpaMetrics(entries)) if (!served.includes(m)) fail(`${adapterFile}: serves no ${m}`);
}

const hpaMetrics = (entries) => byKind(entries, "HorizontalPodAutoscaler")
  .flatMap((h) => h.spec.metrics.filter((m) => m.type === "Pods").map((m) => m.pods.metric.name));

function loadManifests(dir) {
  const files = fs.readdirSync(dir).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml").sort();
  return files.flatMap((f) => readDocs(path.join(dir, f)).map((doc) => ({ file: path.join(dir, f), doc })));
}

function checkK8s(dir) {
  const entries = loadManifests(dir);
  if (entries.length === 0) fail(`${dir}: no manifests`);
  for (const { file, doc } of entries) schemaCheck(file, doc);
  if (problems.length === 0) typeCheck(entries);
  if (problems.length) return;
  kustomizationCheck(dir, entries);
  const [dep] = byKind(entries, "Deployment");
  if (!dep) return fail(`${dir}: no Deployment`);
  podReferenceCheck(entries, dep);
  objectReferenceCheck(entries, dep, path.join(dir, "prometheus-adapter", "values.yaml"));
}

// ---- Dockerfile ----

// The instructions of one stage (default: the last, the runtime image), by keyword.
function parseDockerfile(file, stage = -1) {
  const { DockerfileParser } = require("dockerfile-ast");
  const text = fs.readFileSync(file, "utf8");
  const df = DockerfileParser.parse(text);
  const froms = df.getFROMs();
  const from = froms.at(stage);
  const next = froms[froms.indexOf(from) + 1];
  const line = (i) => i.getRange().start.line;
  const own = df.getInstructions().filter((i) => from && line(i) >= line(from) && (!next || line(i) < line(next)));
  const get = (kw) => own.filter((i) => i.getKeyword() === kw).map((i) => i.getArgumentsContent() || "");
  return { text, froms, get };
}

// The JSON (exec) form of CMD / ENTRYPOINT / HEALTHCHECK CMD, or null.
function execForm(content) {
  try {
    const v = JSON.parse(content.replace(/^CMD\s+/, ""));
    return Array.isArray(v) ? v : null;
  } catch {
    return null;
  }
}

function checkDockerfile(file) {
  const { text, froms, get } = parseDockerfile(file);
  for (const d of require("dockerfile-utils").validate(text))
    fail(`${file}:${d.range.start.line + 1}: ${d.message}`);
  if (froms.length < 2) fail(`${file}: not a multi-stage build`);
  if (froms.length && froms[froms.length - 1].getImage() !== "debian:bookworm-slim")
    fail(`${file}: the runtime stage is not debian:bookworm-slim`);
  const user = get("USER").pop();
  if (!user || /^(root|0)(:|$)/.test(user)) fail(`${file}: the runtime stage runs as root`);
  if (!get("EXPOSE").some((e) => e.split(/\s+/).includes("8080"))) fail(`${file}: no EXPOSE 8080`);
  if (JSON.stringify(execForm(get("ENTRYPOINT").pop() || "")) !== '["clef"]')
    fail(`${file}: ENTRYPOINT is not ["clef"]`);
  if (!get("VOLUME").some((v) => v.includes("/models"))) fail(`${file}: no VOLUME /models`);
  const cmd = (execForm(get("CMD").pop() || "") || []).join(" ");
  if (!/^serve .*--host 0\.0\.0\.0 .*--model \/models\//.test(cmd))
    fail(`${file}: CMD is not serve --host 0.0.0.0 ... --model /models/...`);
  const hc = get("HEALTHCHECK").pop();
  if (!hc || !execForm(hc.slice(hc.indexOf("CMD"))) || !hc.includes("/ready"))
    fail(`${file}: no HEALTHCHECK CMD [...] on /ready`);
}

// The packages a stage's `apt-get install` lines name.
function stagePackages(file, stage) {
  const words = parseDockerfile(file, stage === "build" ? 0 : -1).get("RUN").join(" ").split(/\s+/);
  const pkgs = [];
  words.forEach((w, i) => {
    if (w !== "install" || words[i - 1] !== "apt-get") return;
    for (let j = i + 1; j < words.length && words[j] !== "&&"; j++) if (!words[j].startsWith("-")) pkgs.push(words[j]);
  });
  console.log(pkgs.join(" "));
}

// The build context: every file under ROOT but .git that the .dockerignore rules keep.
function copyContext(root, dockerignore, out) {
  const ig = require("@balena/dockerignore")().add(fs.readFileSync(dockerignore, "utf8"));
  const walk = (rel) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory() && r !== ".git") walk(r);
      else if (e.isFile() && !ig.ignores(r)) {
        fs.mkdirSync(path.join(out, path.dirname(r)), { recursive: true });
        fs.copyFileSync(path.join(root, r), path.join(out, r));
      }
    }
  };
  walk("");
}

// ---- against the real server ----

// The --flags of an argument list that `clef serve --help` does not list.
function unknownFlags(args, help) {
  return args.filter((a) => a.startsWith("--")).filter((f) => !new RegExp(`(^|[\\s,])${f}[\\s=]`, "m").test(help));
}

function startServer(clef, args, env) {
  const child = spawn(clef, args, { env: { ...process.env, ...env }, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const port = new Promise((resolve, reject) => {
    child.stderr.on("data", (d) => {
      log += d;
      const m = /on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) resolve(Number(m[1]));
    });
    child.on("exit", (code) => reject(new Error(`clef serve exited with ${code}: ${log}`)));
  });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve(signal || code)));
  return { child, port, exited };
}

// Polls /ready until 200 (false when the server exits first or takes over two minutes).
async function waitReady(base, child) {
  for (let i = 0; i < 1200 && child.exitCode === null && child.signalCode === null; i++) {
    const r = await fetch(`${base}/ready`).catch(() => null);
    if (r && r.status === 200) return true;
    await new Promise((res) => setTimeout(res, 100));
  }
  return false;
}

// The Deployment's arguments with the test model, on loopback and any free port, one kernel thread.
function localArgs(args, model) {
  const replace = { "--model": model, "--host": "127.0.0.1", "--port": "0", "--threads": "1" };
  return args.map((a, i) => (i > 0 && replace[args[i - 1]] !== undefined ? replace[args[i - 1]] : a));
}

function healthcheck(dockerfile, port) {
  const hc = parseDockerfile(dockerfile).get("HEALTHCHECK").pop();
  const cmd = execForm(hc.slice(hc.indexOf("CMD")));
  const env = { ...process.env, CLEF_HEALTH_PORT: String(port) };
  return spawnSync(cmd[0], cmd.slice(1), { env, timeout: 10000 }).status;
}

function execStartArgs(unit) {
  const line = fs.readFileSync(unit, "utf8").split("\n").find((l) => l.startsWith("ExecStart="));
  return line ? line.slice("ExecStart=".length).split(/\s+/) : [];
}

// The flags CLEF_SERVE_ARGS passes: in the unit's Environment= lines and its example EnvironmentFile
// (clef.env.example beside it, commented-out examples included).
function unitServeArgs(unit) {
  const example = path.join(path.dirname(unit), "clef.env.example");
  const text = fs.readFileSync(unit, "utf8") + (fs.existsSync(example) ? fs.readFileSync(example, "utf8") : "");
  return [...text.matchAll(/^(?:Environment="|#?)CLEF_SERVE_ARGS=([^"\n]*)/gm)].flatMap((m) => m[1].split(/\s+/));
}

// Every --flag the deployment files pass to `clef serve` is one it has.
function checkFlags(clef, container, dockerfile, unit) {
  const help = spawnSync(clef, ["serve", "--help"], { encoding: "utf8" }).stdout;
  const cmd = execForm(parseDockerfile(dockerfile).get("CMD").pop() || "") || [];
  const sources = [["Deployment args", container.args], ["Dockerfile CMD", cmd], [unit, execStartArgs(unit)],
                   [`${unit}'s CLEF_SERVE_ARGS`, unitServeArgs(unit)]];
  for (const [what, args] of sources)
    for (const f of unknownFlags(args, help)) fail(`${what}: clef serve has no ${f}`);
}

// A ready server answers the Deployment's probes, has the HPA's metric and the scrape path, wants the Secret's
// key, and passes the image's HEALTHCHECK.
async function askServer(base, port, entries, dockerfile) {
  const [dep] = byKind(entries, "Deployment");
  const c = dep.spec.template.spec.containers[0];
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const r = await fetch(base + c[probe].httpGet.path);
    if (r.status !== 200) fail(`${probe} ${c[probe].httpGet.path}: ${r.status}`);
  }
  const annotations = dep.spec.template.metadata.annotations || {};
  const metrics = await (await fetch(base + annotations["prometheus.io/path"])).text();
  for (const m of hpaMetrics(entries))
    if (!new RegExp(`^# TYPE ${m} gauge$`, "m").test(metrics)) fail(`/metrics has no gauge ${m} (the HPA's)`);
  const key = byKind(entries, "Secret")[0].stringData.CLEF_API_KEYS.split(",")[0];
  const models = (headers) => fetch(`${base}/v1/models`, { headers }).then((r) => r.status);
  if ((await models({})) !== 403) fail("the server answered without the Secret's API key");
  if ((await models({ authorization: `Bearer ${key}` })) !== 200) fail("the server refused the Secret's API key");
  if (healthcheck(dockerfile, port) !== 0) fail("the Dockerfile's HEALTHCHECK fails against a ready server");
}

async function checkLive(clef, model, k8sDir, dockerfile, unit) {
  const entries = loadManifests(k8sDir);
  const c = byKind(entries, "Deployment")[0].spec.template.spec.containers[0];
  checkFlags(clef, c, dockerfile, unit);
  const keys = byKind(entries, "Secret")[0].stringData.CLEF_API_KEYS;
  const server = startServer(clef, localArgs(c.args, model), { CLEF_API_KEYS: keys });
  try {
    const port = await server.port;
    const base = `http://127.0.0.1:${port}`;
    if (await waitReady(base, server.child)) await askServer(base, port, entries, dockerfile);
    else fail("the server did not become ready");
  } finally {
    server.child.kill("SIGTERM");
  }
  const status = await server.exited;
  if (status !== 0) fail(`clef serve exited with ${status} after SIGTERM`);
  const port = await server.port.catch(() => 0);
  if (port && healthcheck(dockerfile, port) === 0) fail("the Dockerfile's HEALTHCHECK passes with no server");
}

const [cmd, ...args] = process.argv.slice(2);
const commands = {
  k8s: () => checkK8s(args[0]),
  dockerfile: () => checkDockerfile(args[0]),
  packages: () => stagePackages(args[0], args[1]),
  context: () => copyContext(...args),
  live: () => checkLive(...args),
};
if (!commands[cmd]) {
  console.error("usage: check_deploy.cjs k8s DIR | dockerfile FILE | packages FILE build|runtime | " +
                "context ROOT DOCKERIGNORE OUT | live CLEF MODEL K8S_DIR DOCKERFILE UNIT");
  process.exit(2);
}
Promise.resolve(commands[cmd]()).then(finish, (e) => {
  fail(String(e && e.stack ? e.stack : e));
  finish();
});
