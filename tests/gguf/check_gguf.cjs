// Reads GGUF files written by `clef convert` with a reader we did not write (@huggingface/gguf) and checks
// names, shapes, types and metadata against what the issue and llama.cpp's clef/qwen35 converters specify for
// the tiny-clef fixture (hidden 64, 8 layers, vocab 320, head width 32, 2 routing + 4 field layers).
// Usage: node check_gguf.cjs FILE.gguf TYPE ARCH
"use strict";
const fs = require("node:fs");
const { gguf } = require("@huggingface/gguf");

// ggml type ids and block geometry (ggml.h / ggml.c type traits).
const T = { f32: 0, f16: 1, q4_0: 2, q4_1: 3, q5_0: 6, q5_1: 7, q8_0: 8, q4_K: 12, q5_K: 13, q6_K: 14, bf16: 30 };
const BLOCK = { 0: [1, 4], 1: [1, 2], 2: [32, 18], 3: [32, 20], 6: [32, 22], 7: [32, 24], 8: [32, 34],
                12: [256, 144], 13: [256, 176], 14: [256, 210], 30: [1, 2] };

function fail(msg) { console.error("FAIL: " + msg); process.exitCode = 1; }
function eq(a, b, what) { if (JSON.stringify(a) !== JSON.stringify(b)) fail(`${what}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`); }

(async () => {
  const [file, type, arch] = process.argv.slice(2);
  const r = await gguf(file, { allowLocalFile: true });
  const md = r.metadata;
  const byName = new Map(r.tensorInfos.map((t) => [t.name, t]));
  const shape = (n) => byName.has(n) ? byName.get(n).shape.map(Number) : fail("missing tensor " + n);
  const dtype = (n) => byName.has(n) ? byName.get(n).dtype : -1;

  eq(md["general.architecture"], arch, "general.architecture");
  eq(md.version, 3, "version");
  eq(md["tokenizer.ggml.model"], "gpt2", "tokenizer.ggml.model");
  eq(md["tokenizer.ggml.pre"], "qwen35", "tokenizer.ggml.pre");
  eq(md["tokenizer.ggml.tokens"].length, 320, "token count");
  eq(md["tokenizer.ggml.token_type"].length, 320, "token type count");
  eq(md[`${arch}.block_count`], 8, "block_count");
  eq(md[`${arch}.embedding_length`], 64, "embedding_length");
  eq(md[`${arch}.full_attention_interval`], 4, "full_attention_interval");
  eq(md[`${arch}.rope.dimension_sections`], [2, 1, 1, 0], "rope.dimension_sections");
  eq(md[`${arch}.ssm.group_count`], 2, "ssm.group_count");
  eq(md[`${arch}.ssm.time_step_rank`], 4, "ssm.time_step_rank");

  // Backbone names and ggml shapes ({row length, rows}).
  eq(shape("token_embd.weight"), [64, 320], "token_embd");
  eq(shape("output.weight"), [64, 320], "output");
  eq(shape("output_norm.weight"), [64], "output_norm");
  eq(shape("blk.0.attn_qkv.weight"), [64, 128], "attn_qkv");
  eq(shape("blk.0.attn_gate.weight"), [64, 64], "attn_gate");
  eq(shape("blk.0.ssm_conv1d.weight"), [4, 128], "ssm_conv1d");
  eq(shape("blk.0.ssm_a"), [4], "ssm_a");
  eq(shape("blk.0.ssm_dt.bias"), [4], "ssm_dt.bias");
  eq(shape("blk.0.ssm_alpha.weight"), [64, 4], "ssm_alpha");
  eq(shape("blk.0.ssm_out.weight"), [64, 64], "ssm_out");
  eq(shape("blk.3.attn_q.weight"), [64, 256], "attn_q (q + gate)");
  eq(shape("blk.3.attn_k_norm.weight"), [32], "attn_k_norm");
  eq(shape("blk.7.ffn_down.weight"), [128, 64], "ffn_down");
  let expected = 2 + 1 + 6 * 14 + 2 * 11;  // token_embd, output_norm, output + layers
  if (arch === "clef") {
    eq(md["clef.decision.type"], "clef", "decision.type");
    eq(md["clef.decision.routing_block_count"], 2, "routing_block_count");
    eq(md["clef.decision.block_count"], 4, "decision.block_count");
    eq(shape("decision.proj_memory.weight"), [64, 32], "proj_memory");
    eq(shape("token_types.weight"), [32, 3], "token_types");
    eq(shape("decision.scales"), [3], "decision.scales");
    eq(shape("dec.blk.0.cross_attn_q.weight"), [32, 32], "cross_attn_q");
    eq(shape("dec.blk.0.cross_attn_norm_kv.bias"), [32], "cross_attn_norm_kv");
    eq(shape("dec.blk.5.attn_o.weight"), [32, 32], "attn_o");
    eq(shape("decision.scorer_out.weight"), [32, 1], "scorer_out");
    // hidden_norm, 6 projections, token_types, 2 routing x 18, 4 field x 26, 3 norms, scorer, scorer_out, scales
    expected += 2 + 6 + 1 + 2 * 18 + 4 * 26 + 2 * 3 + 2 + 2 + 1;
  } else if (byName.has("decision.scales")) fail("qwen35 file has head tensors");
  eq(r.tensorInfos.length, expected, "tensor count");

  // Types per file type (tiny rows are 32/64/128 long: K types fall back, see docs/GGUF.md).
  const mat = { f16: T.f16, bf16: T.bf16, q8_0: T.q8_0, q6_k: T.q8_0, q5_k_m: T.q5_1, q4_k_m: T.q5_0 }[type];
  eq(dtype("blk.0.attn_norm.weight"), T.f32, "norm type");
  eq(dtype("blk.0.ssm_conv1d.weight"), T.f32, "conv type");
  eq(dtype("blk.1.ffn_gate.weight"), mat, "ffn_gate type");
  if (type.endsWith("_m")) {
    eq(dtype("blk.0.attn_qkv.weight"), T.q8_0, "attn_qkv type");
    eq(dtype("output.weight"), T.q8_0, "output type (q6_K -> q8_0 fallback)");
    eq(dtype("blk.0.ffn_down.weight"), T.q8_0, "ffn_down layer 0 (q6_K fallback)");
  }
  if (arch === "clef") {
    const head = ["f16", "bf16"].includes(type) ? mat : T.q8_0;
    eq(dtype("decision.proj_memory.weight"), head, "head matrix type");
    eq(dtype("decision.scales"), T.f32, "scales type");
  }

  // Every tensor's bytes inside the file, aligned, without overlaps.
  const size = fs.statSync(file).size;
  const ranges = r.tensorInfos.map((t) => {
    const [bs, ts] = BLOCK[t.dtype] || fail(`${t.name}: unexpected type ${t.dtype}`);
    const n = t.shape.reduce((a, b) => a * Number(b), 1);
    if (Number(t.shape[0]) % bs !== 0) fail(`${t.name}: row not whole blocks`);
    const begin = Number(r.tensorDataOffset) + Number(t.offset);
    if (begin % 32 !== 0) fail(`${t.name}: not 32-byte aligned`);
    return [begin, begin + (n / bs) * ts, t.name];
  }).sort((a, b) => a[0] - b[0]);
  for (let i = 0; i < ranges.length; ++i) {
    if (ranges[i][1] > size) fail(`${ranges[i][2]} runs past the end of the file`);
    if (i > 0 && ranges[i - 1][1] > ranges[i][0]) fail(`${ranges[i - 1][2]} overlaps ${ranges[i][2]}`);
  }
  if (!process.exitCode) console.log(`ok ${file}: ${r.tensorInfos.length} tensors`);
})().catch((e) => { console.error(e); process.exit(1); });
