// End-to-end: TypeSafe's official TypeScript client (@typesafe-ai/sdk, pinned, unmodified) against `clef serve`
// on the tiny fixture model. Run by run_with_server.sh, which sets TYPESAFE_BASE_URL and TYPESAFE_API_KEY.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const sdk = require("@typesafe-ai/sdk");

const cases = JSON.parse(fs.readFileSync(path.join(process.env.CLEF_TEST_DATA, "tiny-clef", "cases.json"))).cases;
const byName = (n) => cases.find((c) => c.name === n);
const client = new sdk.TypeSafeClient({ retry: { maxRetries: 0 }, timeout: 60000 });

function assertNear(got, want, where) {
  if (typeof want === "number") {
    assert.equal(typeof got, "number", where);
    assert.ok(Math.abs(got - want) <= 1e-4 + 1e-12, `${where}: ${got} vs ${want}`);
  } else if (Array.isArray(want)) {
    assert.equal(got.length, want.length, where);
    want.forEach((w, i) => assertNear(got[i], w, `${where}[${i}]`));
  } else if (want && typeof want === "object") {
    assert.deepEqual(Object.keys(got), Object.keys(want), where);
    for (const k of Object.keys(want)) assertNear(got[k], want[k], `${where}.${k}`);
  } else {
    assert.equal(got, want, where);
  }
}

test("models.list() returns the served model and its alias", async () => {
  const models = await client.models.list();
  assert.ok(Array.isArray(models));
  assert.equal(models[0].name, "tiny-clef");
  assert.equal(typeof models[0].description, "string");
  assert.equal(typeof models[0].release_date, "string");
  assert.ok(models.some((m) => m.name === "clef-flash"));
});

for (const name of ["basic_mixed", "special_tokens_in_text", "choice_1_and_40_options", "nfc_normalisation"]) {
  test(`systemOne answers ${name} like the reference`, async () => {
    const c = byName(name);
    const { data, requestId } = await client.systemOne(c.request).withResponse();
    assert.ok(requestId && requestId.length > 0);
    assert.equal(data.model, "tiny-clef");
    assertNear(data.answers, c.response.answers, "answers");
    assert.deepEqual(data.usage, c.response.usage);
  });
}

test("builders: noul, choice and score in one request", async () => {
  const data = await client.systemOne({
    model: "tiny-clef",
    state: { ticket: "I was charged twice this month.", plan: "pro" },
    questions: {
      urgent: sdk.noul("Is this urgent?"),
      team: sdk.choice("Which team should handle `ticket`?", { billing: "Payments", technical: null, sales: null }),
      mood: sdk.score("How upset is the customer?", ["calm", "annoyed", "angry"]),
    },
  });
  assert.equal(data.answers.urgent.type, "noul");
  assert.ok(data.answers.urgent.noul >= 0 && data.answers.urgent.noul <= 1);
  assert.ok(["billing", "technical", "sales"].includes(data.answers.team.choice));
  assert.deepEqual(Object.keys(data.answers.team.probabilities), ["billing", "technical", "sales"]);
  assert.deepEqual(data.answers.mood.legend, { 0: "calm", 1: "annoyed", 2: "angry" });
  const sum = Object.values(data.answers.team.probabilities).reduce((a, b) => a + b, 0);
  assert.ok(Math.abs(sum - 1) < 1e-3);
});

test("400 unknown model -> BadRequestError", async () => {
  await assert.rejects(
    client.systemOne({ model: "jev-9.9.9", state: "s", questions: { q: sdk.noul("ok?") } }),
    (e) => {
      assert.ok(e instanceof sdk.BadRequestError);
      assert.equal(e.status, 400);
      assert.deepEqual(e.body, { detail: { error_type: "api_usage_error", message: "Unknown model: jev-9.9.9" } });
      assert.ok(e.requestId);
      return true;
    },
  );
});

test("401 wrong key -> AuthenticationError", async () => {
  const bad = new sdk.TypeSafeClient({ apiKey: "not-the-key", retry: { maxRetries: 0 } });
  await assert.rejects(bad.systemOne({ model: "tiny-clef", state: "s", questions: { q: sdk.noul("ok?") } }), (e) => {
    assert.ok(e instanceof sdk.AuthenticationError);
    assert.equal(e.status, 401);
    assert.equal(e.body.detail.error_type, "authentication_error");
    return true;
  });
  await assert.rejects(bad.models.list(), sdk.AuthenticationError);
});

test("422 validation -> UnprocessableEntityError", async () => {
  await assert.rejects(client.systemOne({ model: "tiny-clef", state: null, questions: { q: sdk.noul("ok?") } }), (e) => {
    assert.ok(e instanceof sdk.UnprocessableEntityError);
    assert.equal(e.status, 422);
    assert.equal(e.body.detail[0].type, "missing");
    assert.deepEqual(e.body.detail[0].loc, ["body", "state"]);
    return true;
  });
  await assert.rejects(
    client.systemOne({ model: "tiny-clef", state: "s", questions: { q: { type: "choice", instructions: "x" } } }),
    (e) => e instanceof sdk.UnprocessableEntityError && e.body.detail[0].loc.join("/") === "body/questions/q/choice/criteria",
  );
});
