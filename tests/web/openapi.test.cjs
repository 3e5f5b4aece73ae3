// docs/openapi.json against a live `clef serve` (run by tests/web/run.sh through tests/e2e/run_with_server.sh,
// server started with an API key):
//   * the document is valid OpenAPI 3.1 (@seriousme/openapi-schema-validator) and every schema in it compiles
//     under Ajv's strict JSON Schema 2020-12;
//   * GET /openapi.json serves the file's bytes, and the playground files are served without a key;
//   * every request the official SDK test (tests/e2e/sdk.test.cjs, run here unchanged) and this file send, and
//     every answer, matches the document: status listed, required headers present and valid, body valid, a
//     request the server accepted valid and one it refused with 422 invalid;
//   * every route the server registers is in the document, and every documented operation was called.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { Validator } = require("@seriousme/openapi-schema-validator");
const { OpenApiValidator } = require("./openapi_validator.cjs");

const root = path.join(__dirname, "..", "..");
const docText = fs.readFileSync(path.join(root, "docs", "openapi.json"));
const doc = JSON.parse(docText);
const base = process.env.TYPESAFE_BASE_URL;
const key = process.env.TYPESAFE_API_KEY;

// Every exchange through fetch, the SDK's included, is recorded for the last test.
const exchanges = [];
const realFetch = globalThis.fetch;
globalThis.fetch = async (input, init = {}) => {
  const res = await realFetch(input, init);
  const body = await res.clone().text();
  const url = new URL(String(input instanceof Request ? input.url : input));
  const method = (init.method || "GET").toUpperCase();
  exchanges.push({
    method,
    path: url.pathname,
    requestBody: init.body,
    status: res.status,
    headers: res.headers,
    body,
  });
  return res;
};

// The official SDK's end-to-end calls, unchanged: they run first, through the recording fetch.
require("../e2e/sdk.test.cjs");

async function call(method, route, { body, headers = {}, auth = true } = {}) {
  const h = { ...headers };
  if (auth) h.Authorization = `Bearer ${key}`;
  if (body !== undefined && !("Content-Type" in h)) h["Content-Type"] = "application/json";
  const res = await fetch(base + route, { method, headers: h, body });
  return { res, text: await res.clone().text() };
}

const noul = { type: "noul", instructions: "ok?" };
const decision = (extra = {}) =>
  JSON.stringify({ model: "tiny-clef", state: "The invoice was paid twice.", questions: { q: noul }, ...extra });

test("docs/openapi.json is valid OpenAPI 3.1", async () => {
  const result = await new Validator().validate(doc);
  assert.deepEqual(result, { valid: true });
  assert.equal(doc.openapi, "3.1.0");
  assert.ok(new OpenApiValidator(doc).compileAll() > 30);
});

test("the exchange check finds answers that do not match the document", () => {
  const v = new OpenApiValidator(doc);
  const good = decision();
  const answer = {
    model: "tiny-clef",
    answers: { q: { type: "noul", noul: 0.5 } },
    usage: { input_tokens: 9, output_tokens: 0 },
  };
  const headers = (extra = {}) =>
    new Headers({
      "content-type": "application/json",
      "x-typesafe-request-id": "r1",
      "x-clef-input-tokens": "9",
      "x-clef-queue-ms": "0.1",
      "x-clef-compute-ms": "1.5",
      "x-clef-total-ms": "2.0",
      "server-timing": 'queue;dur=0.100, compute;dur=1.500, cache;desc="0 tokens reused"',
      ...extra,
    });
  const x = (over) => ({
    method: "POST",
    path: "/v1/systemone",
    requestBody: good,
    status: 200,
    headers: headers(),
    body: JSON.stringify(answer),
    ...over,
  });
  assert.deepEqual(v.checkExchange(x({})), []);
  const broken = [
    x({ body: JSON.stringify({ ...answer, usage: undefined }) }),
    x({ body: JSON.stringify({ ...answer, answers: { q: { type: "noul", noul: 0.5, confidence: 1 } } }) }),
    x({ status: 418 }),
    x({ headers: headers({ "x-typesafe-request-id": "" }) }),
    x({ headers: headers({ "x-clef-queue-ms": "soon" }) }),
    x({ status: 422, body: JSON.stringify({ detail: [{ type: "missing", loc: ["body"], msg: "m" }] }) }),
    x({ requestBody: JSON.stringify({ model: "m", questions: { q: noul } }) }),
    x({ method: "GET", path: "/health", status: 200, headers: headers({ "content-type": "text/plain" }), body: "ok" }),
  ];
  for (const b of broken) assert.notDeepEqual(v.checkExchange(b), [], JSON.stringify(b.body));
});

test("GET /openapi.json serves docs/openapi.json, without a key", async () => {
  const { res } = await call("GET", "/openapi.json", { auth: false });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "application/json");
  assert.ok(Buffer.from(await res.arrayBuffer()).equals(docText));
});

test("the playground files are served as they are in src/server/web, without a key", async () => {
  for (const [route, file, type] of [
    ["/", "index.html", "text/html"],
    ["/playground.css", "playground.css", "text/css"],
    ["/playground.js", "playground.js", "text/javascript"],
  ]) {
    const { res } = await call("GET", route, { auth: false });
    assert.equal(res.status, 200, route);
    assert.equal(res.headers.get("content-type"), `${type}; charset=utf-8`, route);
    assert.match(res.headers.get("content-security-policy"), /default-src 'none'/);
    assert.ok(Buffer.from(await res.arrayBuffer()).equals(fs.readFileSync(path.join(root, "src/server/web", file))));
  }
});

test("operations routes need no key", async () => {
  assert.equal((await call("GET", "/health", { auth: false })).res.status, 200);
  const ready = await call("GET", "/ready", { auth: false });
  assert.deepEqual(JSON.parse(ready.text), { status: "ready", model: "tiny-clef" });
  const metrics = await call("GET", "/metrics", { auth: false });
  assert.match(metrics.text, /^# (HELP|TYPE) /m);
});

test("decisions: an image, request ids, and the error statuses", async () => {
  const png = fs.readFileSync(path.join(process.env.CLEF_TEST_DATA, "tiny-clef", "images", "gray.png"));
  const image = await call("POST", "/v1/systemone", {
    body: decision({ images: [`data:image/png;base64,${png.toString("base64")}`] }),
    headers: { "x-request-id": "openapi-test-1" },
  });
  assert.equal(image.res.status, 200, image.text);
  assert.equal(image.res.headers.get("x-typesafe-request-id"), "openapi-test-1");

  const expect = async (status, method, route, options) => {
    const { res, text } = await call(method, route, options);
    assert.equal(res.status, status, `${method} ${route}: ${text}`);
    return JSON.parse(text);
  };
  await expect(403, "POST", "/v1/systemone", { body: decision(), auth: false });
  await expect(403, "GET", "/v1/models", { auth: false });
  await expect(400, "POST", "/v1/systemone", { body: "{not json" });
  const many = Object.fromEntries(Array.from({ length: 256 }, (_, i) => [`o${i}`, null]));
  const limit = await expect(400, "POST", "/v1/systemone", {
    body: decision({ questions: { q: { type: "choice", criteria: many } } }),
  });
  assert.equal(limit.detail, "Too many choices. Must have at most 255 choices.");
  await expect(400, "POST", "/v1/systemone", { body: decision({ images: ["https://example.com/x.png"] }) });
  await expect(415, "POST", "/v1/systemone", { body: decision(), headers: { "Content-Type": "text/plain" } });
  await expect(422, "POST", "/v1/systemone", {
    body: JSON.stringify({ model: "tiny-clef", state: "s", questions: {} }),
  });
  await expect(422, "POST", "/v1/systemone", { body: decision({ questions: { q: { type: "maybe" } } }) });
  const unknown = await expect(404, "GET", "/no/such/route");
  assert.deepEqual(unknown, { detail: "Not Found" });
  await expect(405, "GET", "/v1/systemone");
  await expect(404, "POST", "/openapi.json");
});

test("Ollama's discovery routes", async () => {
  const version = await call("GET", "/api/version", { auth: false });
  assert.equal(version.res.status, 200);
  assert.equal(typeof JSON.parse(version.text).version, "string");
  const tags = await call("GET", "/api/tags");
  assert.equal(tags.res.status, 200);
  assert.equal(JSON.parse(tags.text).models[0].name, "tiny-clef");
  const noKey = await call("GET", "/api/tags", { auth: false });
  assert.equal(noKey.res.status, 403);
  assert.equal(typeof JSON.parse(noKey.text).error, "string");
  const show = await call("POST", "/api/show", { body: JSON.stringify({ model: "tiny-clef" }) });
  assert.equal(show.res.status, 200, show.text);
  assert.equal((await call("POST", "/api/show", { body: JSON.stringify({ model: "jev-9.9.9" }) })).res.status, 404);
  assert.equal((await call("POST", "/api/show", { body: "{}" })).res.status, 400);
});

// The routes the server registers, read from its sources: http.Get/Post("...") calls and the static route table.
function registeredRoutes() {
  const routes = [];
  const dir = path.join(root, "src", "server");
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith(".cpp"))) {
    const src = fs.readFileSync(path.join(dir, file), "utf8");
    for (const m of src.matchAll(/\bhttp\.(Get|Post|Put|Delete|Patch)\(\s*"([^"]+)"/g))
      routes.push(`${m[1].toUpperCase()} ${m[2]}`);
    for (const m of src.matchAll(/\{"(\/[^"]*)", "[^"]+", "[^"]+"\}/g)) routes.push(`GET ${m[1]}`);
  }
  return routes;
}

test("every route the server registers is documented, and every documented operation was called", () => {
  const documented = Object.entries(doc.paths).flatMap(([p, item]) =>
    Object.keys(item)
      .filter((k) => ["get", "post", "put", "delete", "patch"].includes(k))
      .map((m) => `${m.toUpperCase()} ${p}`),
  );
  const registered = registeredRoutes();
  assert.ok(registered.length >= 9, registered.join(", "));
  for (const r of registered) assert.ok(documented.includes(r), `${r} is not in docs/openapi.json`);
  const called = new Set(exchanges.map((x) => `${x.method} ${x.path}`));
  for (const op of documented) assert.ok(called.has(op), `${op} was never called`);
});

test("every exchange matches docs/openapi.json", () => {
  const v = new OpenApiValidator(doc);
  assert.ok(exchanges.length >= 30, `only ${exchanges.length} exchanges`);
  const problems = exchanges.flatMap((x) => v.checkExchange(x));
  assert.deepEqual(problems, []);
  const systemone = new Set(exchanges.filter((x) => x.path === "/v1/systemone").map((x) => x.status));
  for (const s of [200, 400, 401, 403, 405, 415, 422]) assert.ok(systemone.has(s), `no ${s} from /v1/systemone`);
});
