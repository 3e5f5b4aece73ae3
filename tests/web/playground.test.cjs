// The playground page (GET /) in headless Chromium (Debian's chromium, driven by playwright-core), against a live
// `clef serve` started with an API key by tests/e2e/run_with_server.sh (through tests/web/run.sh): the page loads
// without a key, a state, an image and one question of each type are entered as a person would, a send without a
// key shows the 403, and with the key the bars show exactly the numbers the API returns for the same request sent
// directly. Any console error, page error, failed request or unexpected HTTP error fails the test.
// CLEF_PLAYGROUND_SCREENSHOT=FILE saves a screenshot of the answered page (docs/playground.png).
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { chromium } = require("playwright-core");

const base = process.env.TYPESAFE_BASE_URL;
const key = process.env.TYPESAFE_API_KEY;
const imagePath = path.join(process.env.CLEF_TEST_DATA, "tiny-clef", "images", "square_rgb.png");
const chromiumPath = process.env.CLEF_CHROMIUM || "/usr/bin/chromium";

// What the test types, and the request it expects the page to send for it (written out independently).
const STATE = "Hi, I was charged twice for my March invoice and I need the second payment back before Friday.";
const expectedRequest = (model) => ({
  model,
  state: STATE,
  questions: {
    urgent: { type: "noul", instructions: "Is this urgent?", criteria: { true: "It must be handled today" } },
    team: {
      type: "choice",
      instructions: "Which team should handle this?",
      criteria: { billing: "Payments, invoices, refunds", technical: null, sales: null },
    },
    mood: { type: "score", instructions: "How upset is the customer?", criteria: ["calm", "annoyed", "angry"] },
  },
  images: [`data:image/png;base64,${fs.readFileSync(imagePath).toString("base64")}`],
});

async function addQuestion(page, type, id, instructions) {
  await page.click(`[data-add=${type}]`);
  const card = page.locator("#questions .question").last();
  await card.locator(".qid").fill(id);
  await card.locator(".instructions").fill(instructions);
  return card;
}

// The bars of one answer card as [option, shown value, data-value] rows; each fill's width must be its value.
async function bars(page, id) {
  const rows = await page
    .locator(`.answer[data-question="${id}"] .bar`)
    .evaluateAll((bars) =>
      bars.map((r) => [
        r.dataset.option,
        r.querySelector(".bar-value").textContent,
        Number(r.dataset.value),
        r.querySelector(".bar-fill").style.width,
      ]),
    );
  for (const [option, , value, width] of rows) {
    assert.match(width, /%$/, option);
    assert.ok(Math.abs(parseFloat(width) / 100 - value) < 1e-6, `${id}.${option}: width ${width} for ${value}`);
  }
  return rows.map((r) => r.slice(0, 3));
}

const stat = (page, id, cls) => page.locator(`.answer[data-question="${id}"] .${cls} .stat-value`).textContent();
const row = (option, p) => [option, p.toFixed(4), p];

test("the playground answers a noul, a choice and a score like the API", async () => {
  assert.ok(fs.existsSync(chromiumPath), `${chromiumPath} is missing: run scripts/setup (Debian's chromium)`);
  const browser = await chromium.launch({ executablePath: chromiumPath });
  const problems = [];
  const httpErrors = [];
  const expectedErrors = []; // console messages for HTTP errors the test provokes on purpose
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on("console", (m) => {
      if (m.type() !== "error") return;
      const i = expectedErrors.findIndex((re) => re.test(m.text()));
      if (i >= 0) expectedErrors.splice(i, 1);
      else problems.push(`console: ${m.text()}`);
    });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure().errorText}`));
    const sent = [];
    page.on("request", (r) => {
      if (!r.url().startsWith(`${base}/`) && !r.url().startsWith("data:"))
        problems.push(`request elsewhere: ${r.url()}`);
      if (r.url().endsWith("/v1/systemone")) sent.push({ body: r.postData(), auth: r.headers().authorization });
    });
    page.on("response", (r) => {
      if (r.status() >= 400) httpErrors.push(`${r.status()} ${r.url()}`);
    });

    const loaded = await page.goto(`${base}/`);
    assert.equal(loaded.status(), 200);
    await page.locator("#server-status", { hasText: "ready" }).waitFor();
    const model = await page.inputValue("#model");
    assert.equal(model, "tiny-clef"); // from GET /ready

    await page.click("#clear");
    await page.fill("#state", STATE);
    const urgent = await addQuestion(page, "noul", "urgent", "Is this urgent?");
    await urgent.locator(".noul-true").fill("It must be handled today");
    const team = await addQuestion(page, "choice", "team", "Which team should handle this?");
    await team.locator(".opt-label").nth(0).fill("billing");
    await team.locator(".opt-desc").nth(0).fill("Payments, invoices, refunds");
    await team.locator(".opt-label").nth(1).fill("technical");
    await team.locator(".add-option").click();
    await team.locator(".opt-label").nth(2).fill("sales");
    const mood = await addQuestion(page, "score", "mood", "How upset is the customer?");
    await mood.locator(".opt-level").nth(0).fill("calm");
    await mood.locator(".opt-level").nth(1).fill("annoyed");
    await mood.locator(".add-option").click();
    await mood.locator(".opt-level").nth(2).fill("angry");
    await page.setInputFiles("#image-input", imagePath);
    await page.locator("#image-list img").waitFor();

    // Without the key: the server's 403, shown as such.
    expectedErrors.push(/status of 403/);
    await page.click("#send");
    await page.locator("#error", { hasText: "HTTP 403" }).waitFor();
    assert.match(await page.textContent("#error"), /authentication_error: Must supply an API key/);

    await page.fill("#api-key", key);
    await page.click("#send");
    await page.locator(".answer").nth(2).waitFor({ timeout: 90000 }); // a loaded 2-core CI box is slow
    assert.equal(await page.isVisible("#error"), false);

    // The page sent what was typed, with the key.
    const request = expectedRequest(model);
    assert.equal(sent.length, 2);
    assert.deepEqual(JSON.parse(sent[1].body), request);
    assert.equal(sent[1].auth, `Bearer ${key}`);

    // The same request sent directly: the page shows the API's numbers.
    const res = await fetch(`${base}/v1/systemone`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
      body: JSON.stringify(request),
    });
    assert.equal(res.status, 200);
    const { answers, usage } = await res.json();

    const p = answers.urgent.noul;
    assert.deepEqual(await bars(page, "urgent"), [row("true", p), row("false", 1 - p)]);
    assert.equal(await stat(page, "urgent", "answer-value"), p >= 0.5 ? "yes" : "no");

    const choice = answers.team;
    assert.deepEqual(
      await bars(page, "team"),
      Object.entries(choice.probabilities).map(([o, q]) => row(o, q)),
    );
    assert.deepEqual(
      (await bars(page, "team")).map((r) => r[0]),
      ["billing", "technical", "sales"],
    );
    assert.equal(await stat(page, "team", "answer-value"), choice.choice);
    assert.equal(await stat(page, "team", "answer-confidence"), choice.confidence.toFixed(4));
    assert.equal(
      await page.locator('.answer[data-question="team"] .bar.chosen').getAttribute("data-option"),
      choice.choice,
    );

    const score = answers.mood;
    assert.deepEqual(
      await bars(page, "mood"),
      ["0", "1", "2"].map((l) => row(l, score.probabilities[l])),
    );
    assert.equal(await stat(page, "mood", "answer-value"), score.score.toFixed(4));
    assert.equal(await stat(page, "mood", "answer-confidence"), score.confidence.toFixed(4));
    assert.equal(await page.textContent(".sum-tokens .stat-value"), String(usage.input_tokens));
    assert.match(await page.textContent(".sum-compute .stat-value"), /^[0-9]+\.[0-9] ms$/);

    if (process.env.CLEF_PLAYGROUND_SCREENSHOT) {
      await page.locator("details.preview").evaluate((d) => (d.open = false));
      await page.screenshot({ path: process.env.CLEF_PLAYGROUND_SCREENSHOT, fullPage: true });
    }
  } finally {
    await browser.close();
  }
  assert.deepEqual(problems, []);
  assert.deepEqual(httpErrors, [`403 ${base}/v1/systemone`]);
  assert.deepEqual(expectedErrors, [], "the 403 was not reported");
});
