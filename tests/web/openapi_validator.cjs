// Checks HTTP exchanges (request body, status, headers, response body) against docs/openapi.json with Ajv's
// JSON Schema 2020-12 validator, the dialect of OpenAPI 3.1's schemas. Used by openapi.test.cjs.
const Ajv2020 = require("ajv/dist/2020").default;

const DOC_ID = "openapi.json";
// Statuses a route's `default` response covers (docs/openapi.json, components/responses/Default); any other
// status must be listed by the operation itself.
const DEFAULT_STATUSES = new Set([400, 404, 405, 413, 414]);

function pointerGet(doc, pointer) {
  let node = doc;
  for (const raw of pointer.split("/").slice(1)) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === undefined || node === null || !(key in node)) throw new Error(`${pointer}: no such node`);
    node = node[key];
  }
  return node;
}

const escape = (key) => key.replace(/~/g, "~0").replace(/\//g, "~1");

class OpenApiValidator {
  constructor(doc) {
    this.doc = doc;
    // Strict: an unknown keyword or a misspelt type in the document is an error, not silently ignored.
    this.ajv = new Ajv2020({ strict: true, strictRequired: false, allowUnionTypes: true, allErrors: true });
    this.ajv.addVocabulary(["discriminator", "example"]); // OpenAPI's annotations
    // The document itself is added as one schema, so that "#/components/..." references resolve: its top-level
    // fields are known (and ignored) keywords; the schemas they hold are compiled, strictly, when referenced.
    this.ajv.addVocabulary(Object.keys(doc).filter((k) => !this.ajv.getKeyword(k)));
    this.ajv.addSchema(doc, DOC_ID);
    this.compiled = new Map();
  }

  // Follows $ref from a pointer until a node without one: returns the final pointer.
  deref(pointer) {
    for (let i = 0; i < 16; ++i) {
      const node = pointerGet(this.doc, pointer);
      if (!node || typeof node.$ref !== "string") return pointer;
      pointer = node.$ref.replace(/^#/, "");
    }
    throw new Error(`${pointer}: $ref loop`);
  }

  validator(pointer) {
    if (!this.compiled.has(pointer)) this.compiled.set(pointer, this.ajv.compile({ $ref: `${DOC_ID}#${pointer}` }));
    return this.compiled.get(pointer);
  }

  // Errors of a value against the schema at a pointer ([] when valid).
  check(pointer, value) {
    const validate = this.validator(pointer);
    if (validate(value)) return [];
    return validate.errors.map((e) => `${pointer}${e.instancePath}: ${e.message} ${JSON.stringify(e.params)}`);
  }

  // Every schema in the document compiles under strict mode: components and the inline ones of operations.
  compileAll() {
    const pointers = Object.keys(this.doc.components.schemas).map((n) => `/components/schemas/${escape(n)}`);
    const walk = (node, pointer) => {
      if (!node || typeof node !== "object") return;
      for (const [k, v] of Object.entries(node)) {
        const p = `${pointer}/${escape(k)}`;
        if (k === "schema" && v && typeof v === "object") pointers.push(p);
        else walk(v, p);
      }
    };
    walk(this.doc.paths, "/paths");
    walk(this.doc.components.responses, "/components/responses");
    walk(this.doc.components.headers, "/components/headers");
    walk(this.doc.components.parameters, "/components/parameters");
    for (const p of pointers) this.validator(p);
    return pointers.length;
  }

  // The response object's pointer for a method, path and status; throws when the document has none.
  responsePointer(method, path, status) {
    const item = this.doc.paths[path];
    const op = item && item[method.toLowerCase()];
    if (!op) {
      if (status !== 404 && status !== 405)
        throw new Error(`${method} ${path}: not in the document, answered ${status}`);
      return this.deref("/components/responses/Default");
    }
    const base = `/paths/${escape(path)}/${method.toLowerCase()}/responses`;
    if (op.responses[String(status)]) return this.deref(`${base}/${status}`);
    if (!DEFAULT_STATUSES.has(status)) throw new Error(`${method} ${path}: status ${status} is not documented`);
    return this.deref(`${base}/default`);
  }

  // Checks one exchange: {method, path, requestBody (text or undefined), status, headers (Headers), body (text)}.
  // Returns a list of problems ([] when it matches the document).
  checkExchange(x) {
    const problems = [];
    const where = `${x.method} ${x.path} -> ${x.status}`;
    let rp;
    try {
      rp = this.responsePointer(x.method, x.path, x.status);
    } catch (e) {
      return [e.message];
    }
    const response = pointerGet(this.doc, rp);
    for (const name of Object.keys(response.headers || {})) {
      const hp = this.deref(`${rp}/headers/${escape(name)}`);
      const header = pointerGet(this.doc, hp);
      const value = x.headers.get(name);
      if (value === null) {
        if (header.required) problems.push(`${where}: header ${name} missing`);
        continue;
      }
      const numeric = ["number", "integer"].includes(header.schema.type);
      const parsed = numeric ? (/^-?[0-9]+(\.[0-9]+)?$/.test(value) ? Number(value) : value) : value;
      problems.push(...this.check(`${hp}/schema`, parsed).map((e) => `${where}: header ${name}: ${e}`));
    }
    const contentType = (x.headers.get("content-type") || "").split(";")[0].trim();
    const content = response.content || {};
    const key = Object.keys(content).find((k) => k.split(";")[0].trim() === contentType);
    if (!key) {
      problems.push(`${where}: Content-Type ${contentType} not documented (${Object.keys(content).join(", ")})`);
    } else {
      let body = x.body;
      if (contentType === "application/json") {
        try {
          body = JSON.parse(x.body);
        } catch {
          problems.push(`${where}: body is not JSON`);
        }
      }
      problems.push(...this.check(`${rp}/content/${escape(key)}/schema`, body).map((e) => `${where}: ${e}`));
    }
    problems.push(...this.checkRequestBody(x, where));
    return problems;
  }

  // A request body the server accepted (200) must match the request schema; one it refused with 422 must not.
  checkRequestBody(x, where) {
    const op = (this.doc.paths[x.path] || {})[x.method.toLowerCase()];
    if (!op || !op.requestBody || x.requestBody === undefined || ![200, 422].includes(x.status)) return [];
    const pointer = `/paths/${escape(x.path)}/${x.method.toLowerCase()}/requestBody/content/application~1json/schema`;
    const errors = this.check(pointer, JSON.parse(x.requestBody));
    if (x.status === 200) return errors.map((e) => `${where}: accepted request: ${e}`);
    return errors.length ? [] : [`${where}: the server refused (422) a request the document accepts`];
  }
}

module.exports = { OpenApiValidator };
