#include "tools/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string_view>
#include <vector>

#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/tensors.h"
#include "util/error.h"
#include "util/half.h"

namespace clef {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Presets

// A preset: the configs it writes (config.json's text and vision parts, joint_head_config.json) and the
// processor's pixel bounds.
struct Preset {
    TextConfig text;
    VisionConfig vision;
    HeadConfig head;
    int64_t img_shortest = 0, img_longest = 0, vid_shortest = 0, vid_longest = 0;
    bool output_gate_key = false;  // text_config.output_gate_type "swish", as Cloudflare/clef's config has
};

void set_text(TextConfig& t, int hidden, int layers, int heads, int kv_heads, int head_dim, int lin_k_heads,
              int lin_v_heads, int lin_dim, int ffn, int vocab, std::vector<int> mrope_section) {
    t.hidden_size = hidden;
    t.num_layers = layers;
    t.num_heads = heads;
    t.num_kv_heads = kv_heads;
    t.head_dim = head_dim;
    t.linear_num_key_heads = lin_k_heads;
    t.linear_num_value_heads = lin_v_heads;
    t.linear_key_head_dim = t.linear_value_head_dim = lin_dim;
    t.intermediate_size = ffn;
    t.vocab_size = vocab;
    t.mrope_section = std::move(mrope_section);
    t.attn_output_gate = true;
    t.linear_conv_kernel = 4;
}

void set_vision(VisionConfig& v, int depth, int hidden, int heads, int inter, int pos, int out) {
    v.depth = depth;
    v.hidden_size = hidden;
    v.num_heads = heads;
    v.intermediate_size = inter;
    v.num_position_embeddings = pos;
    v.out_hidden_size = out;
    v.hidden_act = "gelu_pytorch_tanh";
}

void set_head(HeadConfig& h, int hidden, int width, int heads, int ff, int routing, int layers) {
    h.hidden_size = hidden;
    h.width = width;
    h.heads = heads;
    h.feedforward = ff;
    h.routing_layers = routing;
    h.layers = layers;
}

Preset preset_of(const MakeModelOptions& opt) {
    Preset d;
    if (opt.preset == "tiny") {
        set_text(d.text, 64, 8, 4, 2, 32, 2, 4, 16, 128, 320, {2, 1, 1});
        set_head(d.head, 64, 32, 4, 64, 2, 4);
        set_vision(d.vision, 2, 32, 2, 48, 16, 64);
        d.img_shortest = 4096, d.img_longest = 12288, d.vid_shortest = 1024, d.vid_longest = 24576;
    } else if (opt.preset == "small") {  // 256-wide rows: the K-quant and i-quant GGUF types apply
        set_text(d.text, 256, 4, 4, 2, 64, 2, 4, 64, 512, 320, {4, 2, 2});
        set_head(d.head, 256, 64, 4, 128, 2, 4);
        set_vision(d.vision, 2, 64, 2, 96, 16, 256);
        d.img_shortest = 4096, d.img_longest = 12288, d.vid_shortest = 1024, d.vid_longest = 24576;
    } else if (opt.preset == "flash-shaped") {
        set_text(d.text, 4096, 32, 16, 4, 256, 16, 32, 128, 12288, 248320, {11, 11, 10});
        set_head(d.head, 4096, 1024, 16, 4096, 2, 4);
        set_vision(d.vision, 27, 1152, 16, 4304, 2304, 4096);
        d.img_shortest = 65536, d.img_longest = 16777216, d.vid_shortest = 4096, d.vid_longest = 25165824;
    } else if (opt.preset == "clef27-shaped") {  // shared reference clef-architecture.md §3.4
        set_text(d.text, 5120, 64, 24, 4, 256, 16, 48, 128, 17408, 248320, {11, 11, 10});
        set_head(d.head, 5120, 1024, 16, 4096, 2, 4);
        set_vision(d.vision, 27, 1152, 16, 4304, 2304, 5120);
        d.img_shortest = 65536, d.img_longest = 16777216, d.vid_shortest = 4096, d.vid_longest = 25165824;
        d.output_gate_key = true;
    } else {
        throw Error("make-model: unknown preset '" + opt.preset +
                    "' (expected tiny, small, flash-shaped or clef27-shaped)");
    }
    if (opt.layers != -1) {
        if (opt.layers < 1 || opt.layers > 1024)
            throw Error("make-model: --layers must be between 1 and 1024, got " + std::to_string(opt.layers));
        d.text.num_layers = opt.layers;
    }
    d.text.layer_types = layer_types_for(d.text.num_layers, kDefaultFullAttentionInterval);
    return d;
}

// ---------------------------------------------------------------------------------------------------------------
// Deterministic random numbers: splitmix64 streams, Box-Muller with our own log and sin/cos, so the values do
// not depend on the C++ library. Float arithmetic only uses +, -, *, / and sqrt (correctly rounded in IEEE
// 754).

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr size_t kSubBlock = 4096;  // values per independent stream (even: normals come in pairs)

uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

struct SplitMix64 {
    uint64_t state;
    uint64_t next() {
        state += kGolden;
        return mix64(state);
    }
};

// Natural log for x > 0 (finite, normal): x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then the atanh series
// ln m = 2 (s + s^3/3 + ... + s^11/11), s = (m - 1) / (m + 1), |s| <= 0.172. Relative error ~1e-7.
inline float ln_f(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t mant = bits & 0x7fffffu;
    const uint32_t big = mant > 0x3504f3u ? 1u : 0u;  // m > sqrt(2): use m / 2 (integer selects only, so the
                                                      // Box-Muller loop if-converts and vectorises)
    const int32_t e = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(big);
    bits = mant | (big ? 0x3f000000u : 0x3f800000u);
    float m;
    std::memcpy(&m, &bits, 4);
    const float s = (m - 1.0f) / (m + 1.0f);
    const float s2 = s * s;
    const float p =
        s * (2.0f + s2 * (0.666666667f +
                          s2 * (0.4f + s2 * (0.285714286f + s2 * (0.222222222f + s2 * 0.181818182f)))));
    return static_cast<float>(e) * 0.693147181f + p;
}

// In-place IEEE square roots of x[0, n) (x >= 0), correctly rounded on every CPU. The file is compiled with
// -fno-math-errno (CMakeLists.txt), so the loop vectorises.
void sqrt_in_place(float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = std::sqrt(x[i]);
}

// sin and cos of 2*pi*u for u in [0, 1): quadrant q from 4u (exact), Taylor polynomials of degree 11 and 12
// on phi in [0, pi/2) (error < 1e-7), then rotation by q * pi/2. Branch-free so that the loop vectorises.
inline void sincos_2pi(float u, float& s_out, float& c_out) {
    const float u4 = u * 4.0f;
    const int32_t q = static_cast<int32_t>(u4);  // 0..3
    const float phi = (u4 - static_cast<float>(q)) * 1.57079633f;
    const float p2 = phi * phi;
    const float s =
        phi * (1.0f + p2 * (-1.66666667e-1f +
                            p2 * (8.33333333e-3f +
                                  p2 * (-1.98412698e-4f + p2 * (2.75573192e-6f + p2 * -2.50521084e-8f)))));
    const float c =
        1.0f +
        p2 * (-0.5f + p2 * (4.16666667e-2f +
                            p2 * (-1.38888889e-3f +
                                  p2 * (2.48015873e-5f + p2 * (-2.75573192e-7f + p2 * 2.08767570e-9f)))));
    // q = 0: (s, c); 1: (c, -s); 2: (-s, -c); 3: (-c, s).
    // The signs are applied to the bits (no conditional float operation, so the loop vectorises).
    const bool swap = (q & 1) != 0;
    const float s_sel = swap ? c : s, c_sel = swap ? s : c;
    uint32_t bs, bc;
    std::memcpy(&bs, &s_sel, 4);
    std::memcpy(&bc, &c_sel, 4);
    bs ^= static_cast<uint32_t>(q & 2) << 30;
    bc ^= static_cast<uint32_t>((q + 1) & 2) << 30;
    std::memcpy(&s_out, &bs, 4);
    std::memcpy(&c_out, &bc, 4);
}

constexpr float kTwoM24 = 1.0f / 16777216.0f;

using Init = TensorInit;

// Fills out[0, n) with the values of sub-block `sb` (n <= kSubBlock; the first n of its kSubBlock values).
// Each 64-bit draw gives two 24-bit uniforms (bits 63..40 and 31..8), which give the values 2i and 2i + 1.
void generate_sub_block(const Init& init, uint64_t tensor_seed, uint64_t sb, float* out, size_t n) {
    if (init.kind == Init::Kind::Constant) {
        std::fill(out, out + n, init.a);
        return;
    }
    alignas(64) float hi[kSubBlock / 2], lo[kSubBlock / 2];
    const size_t pairs = (n + 1) / 2;
    SplitMix64 rng{mix64(tensor_seed + (sb + 1) * kGolden)};
    for (size_t i = 0; i < pairs; ++i) {
        const uint64_t r = rng.next();
        hi[i] = static_cast<float>(static_cast<int32_t>(r >> 40)) * kTwoM24;               // [0, 1)
        lo[i] = static_cast<float>(static_cast<int32_t>((r >> 8) & 0xffffffu)) * kTwoM24;  // [0, 1)
    }
    const float a = init.a, b = init.b;
    switch (init.kind) {
        case Init::Kind::Normal:  // Box-Muller: radius from hi (log of (0, 1]), angle from lo
            for (size_t i = 0; i < pairs; ++i) hi[i] = -2.0f * ln_f(hi[i] + kTwoM24);
            sqrt_in_place(hi, pairs);
            for (size_t i = 0; i < pairs; ++i) {
                float s, c;
                sincos_2pi(lo[i], s, c);
                const float rad = hi[i];
                hi[i] = a + b * (rad * c);
                lo[i] = a + b * (rad * s);
            }
            break;
        case Init::Kind::Uniform:
            for (size_t i = 0; i < pairs; ++i) {
                hi[i] = a + (b - a) * hi[i];
                lo[i] = a + (b - a) * lo[i];
            }
            break;
        default:  // LogUniform
            for (size_t i = 0; i < pairs; ++i) {
                hi[i] = ln_f(a + (b - a) * hi[i]);
                lo[i] = ln_f(a + (b - a) * lo[i]);
            }
            break;
    }
    for (size_t i = 0; i < n / 2; ++i) {
        out[2 * i] = hi[i];
        out[2 * i + 1] = lo[i];
    }
    if (n % 2) out[n - 1] = hi[n / 2];
    if (init.row_len > 0 && init.row_scale != 1.0f) {
        const uint64_t first = sb * kSubBlock;
        for (size_t i = 0; i < n; ++i) {
            const uint64_t row = (first + i) / init.row_len;
            if (row >= init.row_begin && row < init.row_end) out[i] *= init.row_scale;
        }
    }
}

// Writes elements [e0, e0 + count) of a tensor as `dtype` to dst; sub-blocks are generated in parallel.
void fill_elements(const Init& init, uint64_t tensor_seed, DType dtype, uint64_t e0, uint64_t count,
                   unsigned char* dst) {
    if (count == 0) return;
    const uint64_t sb0 = e0 / kSubBlock, sb1 = (e0 + count - 1) / kSubBlock;
    const int64_t nsb = static_cast<int64_t>(sb1 - sb0 + 1);
    const size_t es = dtype_size(dtype);
#pragma omp parallel if (nsb > 4)
    {
        std::vector<float> vals(kSubBlock);
        std::vector<uint16_t> half(kSubBlock);
#pragma omp for schedule(static)
        for (int64_t k = 0; k < nsb; ++k) {
            const uint64_t sb = sb0 + static_cast<uint64_t>(k);
            const uint64_t sb_begin = sb * kSubBlock;
            const uint64_t lo = std::max(sb_begin, e0), hi = std::min(sb_begin + kSubBlock, e0 + count);
            generate_sub_block(init, tensor_seed, sb, vals.data(), static_cast<size_t>(hi - sb_begin));
            unsigned char* p = dst + (lo - e0) * es;
            const float* v = vals.data() + (lo - sb_begin);
            const size_t m = static_cast<size_t>(hi - lo);
            if (dtype == DType::F32) {
                std::memcpy(p, v, m * 4);
            } else if (dtype == DType::BF16) {
                for (size_t j = 0; j < m; ++j) half[j] = f32_to_bf16(v[j]);
                std::memcpy(p, half.data(), m * 2);
            } else {
                for (size_t j = 0; j < m; ++j) half[j] = f32_to_f16(v[j]);
                std::memcpy(p, half.data(), m * 2);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor plans: model/tensors.h's tables (a packed in-projection once, not once per GGUF third)

// The backbone file's tensors in Hugging Face module order (model.visual, model.language_model, lm_head);
// this is the order shards are filled in.
std::vector<TensorSpec> plan_backbone(const Preset& d, bool vision) {
    std::vector<TensorSpec> plans;
    const auto add = [&](const TensorSpec& s) {
        if (s.slice == 0) plans.push_back(s);  // the patch embedding once, not once per GGUF frame
    };
    if (vision) for_each_vision_tensor(d.vision, add);
    for_each_text_tensor(d.text, true, add);
    return plans;
}

std::vector<TensorSpec> plan_head(const Preset& d) {
    std::vector<TensorSpec> plans;
    for_each_head_tensor(d.head, [&](const TensorSpec& s) {
        if (s.layout != GgufLayout::Split || s.slice == 0) plans.push_back(s);
    });
    return plans;
}

std::vector<TensorSource> sources_of(const std::vector<TensorSpec>& plans, uint64_t seed) {
    std::vector<TensorSource> out;
    out.reserve(plans.size());
    const uint64_t base = mix64(seed ^ 0x636c65662d6d6b21ull);  // "clef-mk!"
    for (const TensorSpec& pl : plans) {
        TensorSource t;
        t.name = pl.hf;
        t.dtype = pl.dtype;
        t.shape = pl.shape;
        const uint64_t tseed = mix64(base ^ fnv1a64(pl.hf));
        const Init init = pl.init;
        const DType dt = pl.dtype;
        const size_t es = dtype_size(dt);
        t.fill = [init, tseed, dt, es](unsigned char* dst, uint64_t offset, size_t nbytes) {
            fill_elements(init, tseed, dt, offset / es, nbytes / es, dst);
        };
        out.push_back(std::move(t));
    }
    return out;
}

const std::map<std::string, std::string> kMetadata = {{"format", "pt"}};

// ---------------------------------------------------------------------------------------------------------------
// JSON files (Python json.dump(..., indent=2, ensure_ascii=False) style plus a trailing newline)

// Token ids: the 256 byte tokens, then the added tokens.
constexpr int kEndOfText = 256, kImStart = 257, kImEnd = 258, kVisionStart = 259, kVisionEnd = 260,
              kImagePad = 261, kVideoPad = 262, kThink = 263, kEndThink = 264;

struct AddedToken {
    int id;
    const char* content;
    bool special;
};
constexpr AddedToken kAddedTokens[] = {
    {kEndOfText, "<|endoftext|>", true},  {kImStart, "<|im_start|>", true},
    {kImEnd, "<|im_end|>", true},         {kVisionStart, "<|vision_start|>", true},
    {kVisionEnd, "<|vision_end|>", true}, {kImagePad, "<|image_pad|>", true},
    {kVideoPad, "<|video_pad|>", true},   {kThink, "<think>", false},
    {kEndThink, "</think>", false},
};

// The Qwen3.5 pre-tokenizer regex (with \p{M}), as in Qwen3.5's tokenizer.json.
constexpr const char* kSplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xc0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
        s += static_cast<char>(0xe0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    return s;
}

// GPT-2 bytes_to_unicode, in its own order: entry i is (byte, symbol) of token id i.
std::vector<std::pair<int, uint32_t>> bytes_to_unicode() {
    std::vector<std::pair<int, uint32_t>> out;
    std::vector<bool> used(256, false);
    for (int b = '!'; b <= '~'; ++b) used[b] = true, out.push_back({b, static_cast<uint32_t>(b)});
    for (int b = 0xa1; b <= 0xac; ++b) used[b] = true, out.push_back({b, static_cast<uint32_t>(b)});
    for (int b = 0xae; b <= 0xff; ++b) used[b] = true, out.push_back({b, static_cast<uint32_t>(b)});
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b)
        if (!used[b]) out.push_back({b, 256 + n++});
    return out;
}

ojson byte_level(bool with_use_regex = true) {
    ojson j = ojson::object();
    j["type"] = "ByteLevel";
    j["add_prefix_space"] = false;
    j["trim_offsets"] = false;
    if (with_use_regex) j["use_regex"] = false;
    return j;
}

std::string tokenizer_json() {
    ojson t = ojson::object();
    t["version"] = "1.0";
    t["truncation"] = nullptr;
    t["padding"] = nullptr;
    ojson added = ojson::array();
    for (const AddedToken& a : kAddedTokens) {
        ojson e = ojson::object();
        e["id"] = a.id;
        e["content"] = a.content;
        e["single_word"] = false;
        e["lstrip"] = false;
        e["rstrip"] = false;
        e["normalized"] = false;
        e["special"] = a.special;
        added.push_back(std::move(e));
    }
    t["added_tokens"] = std::move(added);
    t["normalizer"] = {{"type", "NFC"}};
    ojson split = ojson::object();
    split["type"] = "Split";
    split["pattern"] = {{"Regex", kSplitRegex}};
    split["behavior"] = "Isolated";
    split["invert"] = false;
    ojson pre = ojson::object();
    pre["type"] = "Sequence";
    pre["pretokenizers"] = ojson::array({split, byte_level()});
    t["pre_tokenizer"] = std::move(pre);
    t["post_processor"] = byte_level();
    t["decoder"] = byte_level();
    ojson model = ojson::object();
    model["type"] = "BPE";
    model["dropout"] = nullptr;
    model["unk_token"] = nullptr;
    model["continuing_subword_prefix"] = "";
    model["end_of_word_suffix"] = "";
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = false;
    ojson vocab = ojson::object();
    const auto table = bytes_to_unicode();
    for (size_t id = 0; id < table.size(); ++id) vocab[utf8(table[id].second)] = id;
    model["vocab"] = std::move(vocab);
    model["merges"] = ojson::array();
    t["model"] = std::move(model);
    return t.dump(2) + "\n";
}

std::string tokenizer_config_json() {
    ojson t = ojson::object();
    t["add_bos_token"] = false;
    t["add_prefix_space"] = false;
    ojson dec = ojson::object();
    for (const AddedToken& a : kAddedTokens) {
        ojson e = ojson::object();
        e["content"] = a.content;
        e["lstrip"] = false;
        e["normalized"] = false;
        e["rstrip"] = false;
        e["single_word"] = false;
        e["special"] = a.special;
        dec[std::to_string(a.id)] = std::move(e);
    }
    t["added_tokens_decoder"] = std::move(dec);
    t["bos_token"] = nullptr;
    t["clean_up_tokenization_spaces"] = false;
    t["eos_token"] = "<|im_end|>";
    t["errors"] = "replace";
    t["model_max_length"] = 262144;
    t["pad_token"] = "<|endoftext|>";
    t["split_special_tokens"] = false;
    t["tokenizer_class"] = "Qwen2Tokenizer";
    t["unk_token"] = nullptr;
    return t.dump(2) + "\n";
}

std::string processor_config_json(const Preset& d) {
    auto block = [&](bool video) {
        ojson b = ojson::object();
        b["data_format"] = "channels_first";
        b["do_convert_rgb"] = true;
        b["do_normalize"] = true;
        b["do_rescale"] = true;
        b["do_resize"] = true;
        b["image_mean"] = {0.5, 0.5, 0.5};
        if (!video) b["image_processor_type"] = "Qwen2VLImageProcessorFast";
        b["image_std"] = {0.5, 0.5, 0.5};
        b["merge_size"] = d.vision.spatial_merge_size;
        b["patch_size"] = d.vision.patch_size;
        b["resample"] = 3;
        b["rescale_factor"] = 1.0 / 255.0;
        ojson size = ojson::object();
        size["longest_edge"] = video ? d.vid_longest : d.img_longest;
        size["shortest_edge"] = video ? d.vid_shortest : d.img_shortest;
        b["size"] = std::move(size);
        b["temporal_patch_size"] = d.vision.temporal_patch_size;
        if (video) b["video_processor_type"] = "Qwen3VLVideoProcessor";
        return b;
    };
    ojson p = ojson::object();
    p["image_processor"] = block(false);
    p["processor_class"] = "Qwen3VLProcessor";
    p["video_processor"] = block(true);
    return p.dump(2) + "\n";
}

std::string config_json(const Preset& d, bool vision) {
    ojson c = ojson::object();
    c["architectures"] = {"Qwen3_5ForConditionalGeneration"};
    c["model_type"] = "qwen3_5";
    c["image_token_id"] = kImagePad;
    c["video_token_id"] = kVideoPad;
    c["vision_start_token_id"] = kVisionStart;
    c["vision_end_token_id"] = kVisionEnd;
    c["tie_word_embeddings"] = false;
    c["dtype"] = "bfloat16";
    ojson t = ojson::object();
    t["model_type"] = "qwen3_5_text";
    t["vocab_size"] = d.text.vocab_size;
    t["hidden_size"] = d.text.hidden_size;
    t["intermediate_size"] = d.text.intermediate_size;
    t["num_hidden_layers"] = d.text.num_layers;
    ojson types = ojson::array();
    for (LayerType type : d.text.layer_types) types.push_back(layer_type_name(type));
    t["layer_types"] = std::move(types);
    t["full_attention_interval"] = kDefaultFullAttentionInterval;
    t["num_attention_heads"] = d.text.num_heads;
    t["num_key_value_heads"] = d.text.num_kv_heads;
    t["head_dim"] = d.text.head_dim;
    t["attn_output_gate"] = true;
    t["attention_bias"] = false;
    t["attention_dropout"] = 0.0;
    t["hidden_act"] = "silu";
    t["rms_norm_eps"] = 1e-6;
    ojson rope = ojson::object();
    rope["rope_type"] = "default";
    rope["rope_theta"] = 10000000.0;
    rope["partial_rotary_factor"] = 0.25;
    rope["mrope_section"] = d.text.mrope_section;
    rope["mrope_interleaved"] = true;
    t["rope_parameters"] = std::move(rope);
    t["linear_num_key_heads"] = d.text.linear_num_key_heads;
    t["linear_num_value_heads"] = d.text.linear_num_value_heads;
    t["linear_key_head_dim"] = d.text.linear_key_head_dim;
    t["linear_value_head_dim"] = d.text.linear_value_head_dim;
    t["linear_conv_kernel_dim"] = d.text.linear_conv_kernel;
    if (d.output_gate_key) t["output_gate_type"] = "swish";
    t["max_position_embeddings"] = 262144;
    t["mtp_num_hidden_layers"] = 0;
    t["tie_word_embeddings"] = false;
    t["initializer_range"] = 0.02;
    t["use_cache"] = true;
    t["dtype"] = "bfloat16";
    t["mamba_ssm_dtype"] = "float32";
    t["bos_token_id"] = nullptr;
    t["eos_token_id"] = kEndOfText;
    t["pad_token_id"] = nullptr;
    c["text_config"] = std::move(t);
    if (vision) {
        ojson v = ojson::object();
        v["deepstack_visual_indexes"] = ojson::array();
        v["depth"] = d.vision.depth;
        v["hidden_act"] = "gelu_pytorch_tanh";
        v["hidden_size"] = d.vision.hidden_size;
        v["in_channels"] = d.vision.in_channels;
        v["initializer_range"] = 0.02;
        v["intermediate_size"] = d.vision.intermediate_size;
        v["model_type"] = "qwen3_5_vision";
        v["num_heads"] = d.vision.num_heads;
        v["num_position_embeddings"] = d.vision.num_position_embeddings;
        v["out_hidden_size"] = d.vision.out_hidden_size;
        v["patch_size"] = d.vision.patch_size;
        v["spatial_merge_size"] = d.vision.spatial_merge_size;
        v["temporal_patch_size"] = d.vision.temporal_patch_size;
        c["vision_config"] = std::move(v);
    }
    return c.dump(2) + "\n";
}

std::string head_config_json(const Preset& d) {
    const HeadConfig& c = d.head;
    ojson h = ojson::object();
    h["hidden_size"] = c.hidden_size;
    h["width"] = c.width;
    h["routing_layers"] = c.routing_layers;
    h["layers"] = c.layers;
    h["heads"] = c.heads;
    h["feedforward"] = c.feedforward;
    return h.dump(2) + "\n";
}

void write_text_file(const fs::path& path, const std::string& text) {
    const fs::path tmp = path.string() + ".partial";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) throw Error(path.string() + ": cannot create file");
        f.write(text.data(), static_cast<std::streamsize>(text.size()));
        f.close();
        if (!f) {
            std::error_code ec;
            fs::remove(tmp, ec);
            throw Error(path.string() + ": write failed");
        }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw Error(path.string() + ": cannot rename " + tmp.string() + ": " + ec.message());
}

// Removes the weight files of an earlier checkpoint (they would contradict or shadow the new ones).
void remove_stale_weights(const fs::path& dir) {
    static const std::regex shard(R"(model-\d+-of-\d+\.safetensors)");
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n == "model.safetensors" || n == "model.safetensors.index.json" || std::regex_match(n, shard)) {
            std::error_code rec;
            fs::remove(e.path(), rec);
            if (rec) throw Error(e.path().string() + ": cannot remove: " + rec.message());
        }
    }
    if (ec) throw Error(dir.string() + ": cannot list: " + ec.message());
}

}  // namespace

uint64_t make_model_weight_bytes(const MakeModelOptions& opt) {
    const Preset d = preset_of(opt);
    const auto model = sources_of(plan_backbone(d, opt.vision), opt.seed);
    uint64_t total = 0;
    for (const auto& shard : plan_shards(model, opt.shard_bytes)) {
        std::vector<TensorSource> part;
        for (size_t i : shard) part.push_back(model[i]);
        total += safetensors_file_size(part, kMetadata);
    }
    return total + safetensors_file_size(sources_of(plan_head(d), opt.seed), kMetadata);
}

void make_model(const MakeModelOptions& opt, const std::string& out_dir, ProgressFn progress) {
    const Preset d = preset_of(opt);
    const fs::path dir(out_dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
        throw Error(out_dir + ": cannot create directory" + (ec ? ": " + ec.message() : ""));
    remove_stale_weights(dir);

    write_text_file(dir / "config.json", config_json(d, opt.vision));
    write_text_file(dir / "joint_head_config.json", head_config_json(d));
    write_text_file(dir / "tokenizer.json", tokenizer_json());
    write_text_file(dir / "tokenizer_config.json", tokenizer_config_json());
    write_text_file(dir / "processor_config.json", processor_config_json(d));
    if (opt.configs_only) return;

    const auto model = sources_of(plan_backbone(d, opt.vision), opt.seed);
    const auto head = sources_of(plan_head(d), opt.seed);
    const uint64_t total = make_model_weight_bytes(opt);

    ShardedWriteOptions so;
    so.max_shard_bytes = opt.shard_bytes;
    so.prefix = "model";
    so.file.metadata = kMetadata;
    so.file.progress = progress;
    so.file.progress_total = total;
    const ShardedWriteResult res = write_sharded_safetensors(out_dir, model, so);
    (void)res;

    SafetensorsWriteOptions ho = so.file;
    ho.progress_base = total - safetensors_file_size(head, kMetadata);
    write_safetensors((dir / "joint_head.safetensors").string(), head, ho);
}

}  // namespace clef
