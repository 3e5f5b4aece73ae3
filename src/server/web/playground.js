// The clef playground (docs/PLAYGROUND.md): builds a System One request from the form, sends it to this server's
// POST /v1/systemone and draws each answer's probabilities. Plain browser JavaScript: no build step, no external
// resources. Every text the user or the server supplies is set with textContent, never parsed as HTML.
"use strict";

const MAX_IMAGES = 4;
const MAX_IMAGE_BYTES = 4 << 20;

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));

// Creates an element with a class and text.
function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

const images = []; // {name, url}: the attached images as data URLs, in order

const EXAMPLE = {
  state: "Hi, I was charged twice for my March invoice and I need the second payment back before the weekend.",
  questions: [
    { type: "noul", id: "duplicate", instructions: "Was something paid twice?" },
    {
      type: "choice",
      id: "team",
      instructions: "Which team should handle this?",
      options: [
        ["billing", "Payments, invoices, refunds"],
        ["technical", "Bugs and outages"],
        ["sales", ""],
      ],
    },
    { type: "score", id: "urgency", instructions: "How urgent is it?", levels: ["low", "medium", "high"] },
  ],
};

// ---- the form ----

function optionRow(kind, values) {
  const row = el("div", "option-row");
  if (kind === "choice") {
    const label = el("input", "opt-label");
    label.placeholder = "label";
    label.spellcheck = false;
    label.value = values[0] || "";
    const desc = el("input", "opt-desc");
    desc.placeholder = "description (optional)";
    desc.value = values[1] || "";
    row.append(label, desc);
  } else {
    row.append(el("span", "level-index"));
    const level = el("input", "opt-level");
    level.placeholder = "level, lowest first";
    level.value = values[0] || "";
    row.append(level);
  }
  const remove = el("button", "icon remove-option", "×");
  remove.type = "button";
  remove.setAttribute("aria-label", "Remove");
  remove.addEventListener("click", () => {
    row.remove();
    changed();
  });
  row.append(remove);
  return row;
}

function nextId(type) {
  const used = new Set($$("#questions .qid").map((i) => i.value.trim()));
  for (let n = 1; ; ++n) if (!used.has(`${type}_${n}`)) return `${type}_${n}`;
}

function addQuestion(type, preset = {}) {
  const card = $("#tpl-question").content.firstElementChild.cloneNode(true);
  card.dataset.type = type;
  $(".type-tag", card).textContent = type;
  $(".type-tag", card).classList.add(type);
  $(".qid", card).value = preset.id || nextId(type);
  $(".instructions", card).value = preset.instructions || "";
  const options = $(".options", card);
  const add = $(".add-option", card);
  if (type === "noul") {
    for (const side of ["true", "false"]) {
      const row = el("div", "option-row");
      row.append(el("span", "noul-side", side === "true" ? "yes means" : "no means"));
      const input = el("input", `noul-${side}`);
      input.placeholder = "optional";
      row.append(input);
      options.append(row);
    }
  } else {
    const rows =
      type === "choice"
        ? preset.options || [
            ["", ""],
            ["", ""],
          ]
        : (preset.levels || ["", ""]).map((l) => [l]);
    for (const values of rows) options.append(optionRow(type, values));
    add.hidden = false;
    add.textContent = type === "choice" ? "+ option" : "+ level";
    add.addEventListener("click", () => {
      options.append(optionRow(type, []));
      changed();
      $("input", options.lastElementChild).focus();
    });
  }
  $(".remove", card).addEventListener("click", () => {
    card.remove();
    changed();
  });
  $("#questions").append(card);
  changed();
  return card;
}

function addImages(files) {
  const errors = [];
  for (const file of files) {
    if (images.length >= MAX_IMAGES) {
      errors.push(`at most ${MAX_IMAGES} images`);
      break;
    }
    if (file.size > MAX_IMAGE_BYTES) {
      errors.push(`${file.name} is larger than 4 MiB`);
      continue;
    }
    const entry = { name: file.name, url: null };
    images.push(entry);
    const reader = new FileReader();
    reader.onload = () => {
      entry.url = reader.result;
      renderImages();
    };
    reader.onerror = () => {
      images.splice(images.indexOf(entry), 1);
      showError(`Cannot read ${file.name}.`);
      renderImages();
    };
    reader.readAsDataURL(file);
  }
  if (errors.length) showError(`Images: ${errors.join("; ")}.`);
}

function renderImages() {
  const list = $("#image-list");
  list.replaceChildren();
  images.forEach((img, i) => {
    const item = el("li", "thumb");
    if (img.url) {
      const pic = el("img");
      pic.src = img.url;
      pic.alt = img.name;
      item.append(pic);
    }
    item.append(el("span", "thumb-name", img.name));
    const remove = el("button", "icon", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Remove ${img.name}`);
    remove.addEventListener("click", () => {
      images.splice(i, 1);
      renderImages();
    });
    item.append(remove);
    list.append(item);
  });
  changed();
}

function stateFormat() {
  return $("input[name=state-format]:checked").value;
}

function loadExample() {
  clearForm();
  $("#state").value = EXAMPLE.state;
  for (const q of EXAMPLE.questions) addQuestion(q.type, q);
}

function clearForm() {
  $("#state").value = "";
  $("input[name=state-format][value=text]").checked = true;
  images.length = 0;
  renderImages();
  $("#questions").replaceChildren();
  changed();
}

// ---- the request ----

// The request body the form describes, or {error} naming the first problem.
function buildRequest() {
  const body = { model: $("#model").value.trim() };
  const stateText = $("#state").value;
  if (stateFormat() === "json") {
    try {
      body.state = JSON.parse(stateText);
    } catch (e) {
      return { error: `State is not valid JSON: ${e.message}` };
    }
  } else {
    body.state = stateText;
  }
  if (!stateText.trim()) return { error: "Write a state first." };
  const questions = {};
  for (const card of $$("#questions .question")) {
    const q = buildQuestion(card);
    if (q.error) return q;
    if (Object.hasOwn(questions, q.id)) return { error: `Two questions have the id "${q.id}".` };
    questions[q.id] = q.question;
  }
  if (!Object.keys(questions).length) return { error: "Add a question." };
  body.questions = questions;
  if (images.some((i) => !i.url)) return { error: "Images are still being read." };
  if (images.length) body.images = images.map((i) => i.url);
  return { body };
}

function buildQuestion(card) {
  const type = card.dataset.type;
  const id = $(".qid", card).value.trim();
  if (!id) return { error: `A ${type} question has no id.` };
  const question = { type };
  const instructions = $(".instructions", card).value.trim();
  if (instructions) question.instructions = instructions;
  if (type === "noul") {
    const criteria = {};
    for (const side of ["true", "false"]) {
      const v = $(`.noul-${side}`, card).value.trim();
      if (v) criteria[side] = v;
    }
    if (Object.keys(criteria).length) question.criteria = criteria;
  } else if (type === "choice") {
    const criteria = {};
    for (const row of $$(".option-row", card)) {
      const label = $(".opt-label", row).value.trim();
      if (!label) return { error: `${id}: an option has no label.` };
      if (Object.hasOwn(criteria, label)) return { error: `${id}: the option "${label}" appears twice.` };
      criteria[label] = $(".opt-desc", row).value.trim() || null;
    }
    if (!Object.keys(criteria).length) return { error: `${id}: add an option.` };
    question.criteria = criteria;
  } else {
    const levels = $$(".opt-level", card).map((i) => i.value.trim());
    if (!levels.length) return { error: `${id}: add a level.` };
    if (levels.some((l) => !l)) return { error: `${id}: a level is empty.` };
    question.criteria = levels;
  }
  return { id, question };
}

// Keeps the level numbers, the request preview and the state check current.
function changed() {
  for (const card of $$("#questions .question"))
    $$(".level-index", card).forEach((span, i) => (span.textContent = String(i)));
  const { body, error } = buildRequest();
  const stateError = $("#state-error");
  const jsonError = error && error.startsWith("State is not valid JSON") ? error : "";
  stateError.hidden = !jsonError;
  stateError.textContent = jsonError;
  $("#request-preview").textContent = body ? previewJson(body) : error;
}

// The body as JSON, with long data URLs shortened for reading.
function previewJson(body) {
  return JSON.stringify(
    body,
    (key, value) =>
      typeof value === "string" && value.startsWith("data:") && value.length > 80 ? `${value.slice(0, 60)}…` : value,
    2,
  );
}

async function send() {
  const { body, error } = buildRequest();
  hideError();
  if (error) return showError(error);
  const headers = { "Content-Type": "application/json" };
  const key = $("#api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const button = $("#send");
  button.disabled = true;
  button.classList.add("busy");
  const t0 = performance.now();
  try {
    const res = await fetch("v1/systemone", { method: "POST", headers, body: JSON.stringify(body) });
    const roundTrip = performance.now() - t0;
    const text = await res.text();
    let data;
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text };
    }
    if (!res.ok) {
      showApiError(res, data);
      return;
    }
    renderAnswers(body, data, res.headers, roundTrip);
  } catch (e) {
    showError(`The server did not answer: ${e.message}`);
  } finally {
    button.disabled = false;
    button.classList.remove("busy");
  }
}

// ---- the answers ----

function fixed(x) {
  return Number(x).toFixed(4);
}

// One probability bar; data-* carry the number for tests and tools.
function bar(question, option, label, p, chosen) {
  const row = el("div", chosen ? "bar chosen" : "bar");
  row.dataset.question = question;
  row.dataset.option = option;
  row.dataset.value = String(p);
  row.append(el("span", "bar-label", label));
  const track = el("span", "bar-track");
  const fill = el("span", "bar-fill");
  fill.style.width = `${Math.max(0, Math.min(1, p)) * 100}%`;
  track.append(fill);
  row.append(track, el("span", "bar-value", fixed(p)));
  return row;
}

function levelText(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

function argmax(entries) {
  let best = entries[0];
  for (const e of entries) if (e[1] > best[1]) best = e;
  return best[0];
}

function headline(card, items) {
  const line = el("div", "headline");
  for (const [name, value, cls] of items) {
    const item = el("span", `stat ${cls || ""}`);
    item.append(el("span", "stat-name", name), el("span", "stat-value", value));
    line.append(item);
  }
  card.append(line);
}

function answerCard(id, question, answer) {
  const card = el("article", "card answer");
  card.dataset.question = id;
  const head = el("div", "card-head");
  const tag = el("span", `type-tag ${answer.type}`, answer.type);
  head.append(tag, el("h3", "answer-id", id));
  card.append(head);
  if (question.instructions) card.append(el("p", "answer-q", question.instructions));
  const bars = el("div", "bars");
  if (answer.type === "noul") {
    const yes = answer.noul >= 0.5;
    headline(card, [
      ["answer", yes ? "yes" : "no", "answer-value"],
      ["P(yes)", fixed(answer.noul), "answer-noul"],
    ]);
    bars.append(bar(id, "true", "yes", answer.noul, yes), bar(id, "false", "no", 1 - answer.noul, !yes));
  } else if (answer.type === "choice") {
    headline(card, [
      ["answer", answer.choice, "answer-value"],
      ["confidence", fixed(answer.confidence), "answer-confidence"],
    ]);
    for (const [label, p] of Object.entries(answer.probabilities))
      bars.append(bar(id, label, label, p, label === answer.choice));
  } else {
    const entries = Object.entries(answer.probabilities);
    const mode = argmax(entries);
    headline(card, [
      ["score", fixed(answer.score), "answer-value"],
      ["most likely", `${mode} · ${levelText(answer.legend[mode])}`, "answer-mode"],
      ["confidence", fixed(answer.confidence), "answer-confidence"],
    ]);
    for (const [level, p] of entries)
      bars.append(bar(id, level, `${level} · ${levelText(answer.legend[level])}`, p, level === mode));
  }
  card.append(bars);
  return card;
}

function renderAnswers(request, data, headers, roundTrip) {
  const list = $("#answers");
  list.replaceChildren();
  for (const [id, question] of Object.entries(request.questions))
    if (data.answers[id]) list.append(answerCard(id, question, data.answers[id]));
  const summary = $("#summary");
  summary.replaceChildren();
  const ms = (name) => {
    const v = headers.get(name);
    return v === null ? "–" : `${Number(v).toFixed(1)} ms`;
  };
  const stats = [
    ["model", data.model, "sum-model"],
    ["input tokens", String(data.usage.input_tokens), "sum-tokens"],
    ["queue", ms("x-clef-queue-ms"), "sum-queue"],
    ["compute", ms("x-clef-compute-ms"), "sum-compute"],
    ["server total", ms("x-clef-total-ms"), "sum-total"],
    ["round trip", `${roundTrip.toFixed(1)} ms`, "sum-roundtrip"],
  ];
  for (const [name, value, cls] of stats) {
    const item = el("span", `stat ${cls}`);
    item.append(el("span", "stat-name", name), el("span", "stat-value", value));
    summary.append(item);
  }
  const rid = headers.get("x-typesafe-request-id");
  if (rid) summary.append(el("span", "request-id", `request ${rid}`));
  summary.hidden = false;
}

// ---- errors and server status ----

function hideError() {
  $("#error").hidden = true;
}

function showError(message, extra = []) {
  const box = $("#error");
  box.replaceChildren(el("strong", "", message));
  if (extra.length) {
    const ul = el("ul");
    for (const line of extra) ul.append(el("li", "", line));
    box.append(ul);
  }
  box.hidden = false;
}

// The three System One error shapes: {"detail": "text"}, {"detail": {error_type, message}}, {"detail": [items]}.
function showApiError(res, data) {
  const detail = data && data.detail;
  const rid = res.headers.get("x-typesafe-request-id");
  const title = `HTTP ${res.status}`;
  let lines = [];
  if (typeof detail === "string") lines = [detail];
  else if (Array.isArray(detail)) lines = detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`);
  else if (detail && typeof detail === "object")
    lines = [[detail.error_type, detail.message].filter(Boolean).join(": ")];
  else lines = [JSON.stringify(data)];
  if (res.status === 401 || res.status === 403) lines.push("Enter the server's API key above.");
  if (rid) lines.push(`request ${rid}`);
  showError(title, lines);
}

async function checkServer() {
  const badge = $("#server-status");
  try {
    const res = await fetch("ready");
    const data = await res.json();
    if (res.ok) {
      badge.textContent = "ready";
      badge.className = "badge ok";
      if (!$("#model").value) $("#model").value = data.model;
      changed();
      return;
    }
    badge.textContent = data.status === "failed" ? "model failed to load" : "loading…";
    badge.className = data.status === "failed" ? "badge bad" : "badge";
    if (data.status !== "failed") setTimeout(checkServer, 1000);
  } catch {
    badge.textContent = "unreachable";
    badge.className = "badge bad";
  }
}

function init() {
  document.addEventListener("input", changed);
  document.addEventListener("change", changed);
  for (const b of $$("[data-add]"))
    b.addEventListener("click", () => $(".instructions", addQuestion(b.dataset.add)).focus());
  $("#attach").addEventListener("click", () => $("#image-input").click());
  $("#image-input").addEventListener("change", (e) => {
    addImages(Array.from(e.target.files));
    e.target.value = "";
  });
  $("#send").addEventListener("click", send);
  $("#clear").addEventListener("click", clearForm);
  $("#example").addEventListener("click", loadExample);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      send();
    }
  });
  loadExample();
  checkServer();
}

init();
