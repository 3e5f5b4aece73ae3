// Loopback load test (bounded by count: 16 keep-alive clients x 50 requests; LOAD_REQUESTS=100 for the longer run): every request succeeds and every
// answer equals the single-request answer. Prints requests/s and latency percentiles. The time bound is scaled
// from this machine's measured single-request time (no assumption about the CPU's speed): the whole run may
// take 4x the time of answering every request one after another (at least 60 s).
const test = require("node:test");
const assert = require("node:assert/strict");
const http = require("node:http");

const base = new URL(process.env.TYPESAFE_BASE_URL);
const key = process.env.TYPESAFE_API_KEY;
const CLIENTS = Number(process.env.LOAD_CLIENTS || 16);
const REQUESTS = Number(process.env.LOAD_REQUESTS || 50);

const body = JSON.stringify({
  model: "tiny-clef",
  state: "Order 1182 arrived damaged; the customer wants a replacement.",
  questions: {
    damaged: { type: "noul", instructions: "Was the item damaged?" },
    action: { type: "choice", instructions: "Next step?", criteria: { refund: null, replace: null, ignore: null } },
    tone: { type: "score", instructions: "How upset?", criteria: ["calm", "upset"] },
  },
});

function post(agent, timeoutMs = 600000) {
  return new Promise((resolve, reject) => {
    const started = process.hrtime.bigint();
    const req = http.request(
      {
        host: base.hostname, port: base.port, path: "/v1/systemone", method: "POST", agent,
        headers: { "content-type": "application/json", authorization: `Bearer ${key}`, "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode, text: Buffer.concat(chunks).toString(), ms: Number(process.hrtime.bigint() - started) / 1e6 }),
        );
      },
    );
    req.setTimeout(timeoutMs, () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end(body);
  });
}

test(`${CLIENTS} keep-alive clients x ${REQUESTS} requests`, async () => {
  const singles = [];
  for (let i = 0; i < 3; i++) singles.push(await post(new http.Agent({ keepAlive: false })));
  for (const s of singles) assert.equal(s.status, 200, s.text);
  const expected = JSON.parse(singles[0].text);
  const singleMs = singles.map((s) => s.ms).sort((a, b) => a - b)[1];
  const DEADLINE_MS = Math.max(60000, Math.ceil(4 * singleMs * CLIENTS * REQUESTS));
  const requestMs = Math.max(20000, 20 * CLIENTS * singleMs);  // one request behind every other client's
  console.log(`load: single request ${singleMs.toFixed(1)} ms -> time bound ${(DEADLINE_MS / 1000).toFixed(0)} s`);

  const latencies = [];
  let failures = 0, mismatches = 0;
  const t0 = Date.now();
  const workers = Array.from({ length: CLIENTS }, async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < REQUESTS && Date.now() - t0 < DEADLINE_MS; i++) {
      try {
        const r = await post(agent, requestMs);
        latencies.push(r.ms);
        if (r.status !== 200) failures++;
        else if (JSON.stringify(JSON.parse(r.text)) !== JSON.stringify(expected)) mismatches++;
      } catch (e) {
        failures++;
      }
    }
    agent.destroy();
  });
  await Promise.all(workers);
  const seconds = (Date.now() - t0) / 1000;
  latencies.sort((a, b) => a - b);
  const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))];
  console.log(
    `load: ${latencies.length} requests in ${seconds.toFixed(1)} s = ${(latencies.length / seconds).toFixed(1)} req/s; ` +
      `p50 ${pct(50).toFixed(1)} ms, p99 ${pct(99).toFixed(1)} ms; failures ${failures}, mismatches ${mismatches}; ` +
      `input_tokens ${expected.usage.input_tokens}`,
  );
  assert.equal(latencies.length, CLIENTS * REQUESTS, "the run hit its time bound");
  assert.equal(failures, 0);
  assert.equal(mismatches, 0);
});
