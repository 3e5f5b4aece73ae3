// Loopback load test (bounded: 16 keep-alive clients x 100 requests, 5 minutes at most): every request succeeds
// and every answer equals the single-request answer. Prints requests/s and latency percentiles.
const test = require("node:test");
const assert = require("node:assert/strict");
const http = require("node:http");

const base = new URL(process.env.TYPESAFE_BASE_URL);
const key = process.env.TYPESAFE_API_KEY;
const CLIENTS = Number(process.env.LOAD_CLIENTS || 16);
const REQUESTS = Number(process.env.LOAD_REQUESTS || 100);
const DEADLINE_MS = 300000;

const body = JSON.stringify({
  model: "tiny-clef",
  state: "Order 1182 arrived damaged; the customer wants a replacement.",
  questions: {
    damaged: { type: "noul", instructions: "Was the item damaged?" },
    action: { type: "choice", instructions: "Next step?", criteria: { refund: null, replace: null, ignore: null } },
    tone: { type: "score", instructions: "How upset?", criteria: ["calm", "upset"] },
  },
});

function post(agent) {
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
    req.setTimeout(60000, () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end(body);
  });
}

test(`${CLIENTS} keep-alive clients x ${REQUESTS} requests`, { timeout: DEADLINE_MS + 30000 }, async () => {
  const single = await post(new http.Agent({ keepAlive: false }));
  assert.equal(single.status, 200, single.text);
  const expected = JSON.parse(single.text);

  const latencies = [];
  let failures = 0, mismatches = 0;
  const t0 = Date.now();
  const workers = Array.from({ length: CLIENTS }, async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < REQUESTS && Date.now() - t0 < DEADLINE_MS; i++) {
      try {
        const r = await post(agent);
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
