// Images from GGUF (docs/GGUF.md "Images from GGUF (mmproj)"): the tiny fixture converted to a clef GGUF
// (bf16 backbone: the fixture's own weights) plus an f32 mmproj answers every image case of
// tests/data/tiny-clef/image_cases.json as the safetensors directory does, within test_image_decision's
// tolerances of the publisher's float64 goldens. The mmproj's header is checked against llama.cpp's names and
// keys written out here (llama.cpp's tools/mtmd/clip-impl.h TN_* / KEY_* and gguf-py's constants), not taken
// from model/tensors.cpp; its tensors' values against the fixture's checkpoint; the tensor types per file
// type against llama.cpp's converter rules. Refusals: an mmproj of another width, DeepStack, a missing frame,
// a file that is not an mmproj, an mmproj beside a model directory, file types an mmproj cannot take. A GGUF
// without an mmproj refuses images; the CLI writes only the mmproj without --out and loads it with --mmproj.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "decision/engine.h"
#include "decision/media.h"
#include "decision/request.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/gguf_mmproj.h"
#include "quant/quant.h"
#include "test_util.h"
#include "test_vision_util.h"
#include "tools/gguf_convert.h"
#include "tools/gguf_mmproj.h"
#include "util/error.h"

using namespace clef;
using clef::testing::data_path;
using clef::testing::ScratchDir;

namespace {

const std::string kModel = data_path("tiny-clef");

// The pair under test and the other mmproj types, converted once per test program.
struct Files {
    ScratchDir dir{"clef_test_mmproj"};
    std::string gguf = dir.file("tiny-bf16.gguf");

    Files() {
        ConvertOptions o;
        o.type = GgufFileType::BF16;
        convert_to_gguf(kModel, gguf, o);
    }
    std::string mmproj(GgufFileType t) const {
        const std::string p = dir.file(std::string("mmproj-") + gguf_file_type_name(t) + ".gguf");
        if (!std::filesystem::exists(p)) {
            ConvertOptions o;
            o.type = t;
            convert_to_mmproj(kModel, p, o);
        }
        return p;
    }
};

const Files& files() {
    static const Files f;
    return f;
}

std::unique_ptr<Engine> load_pair(const std::string& gguf, const std::string& mmproj) {
    LoadOptions lo;
    lo.mmproj = mmproj;
    return Engine::load(gguf, "", lo);
}

const Engine& gguf_engine() {
    static const std::unique_ptr<Engine> e = load_pair(files().gguf, files().mmproj(GgufFileType::F32));
    return *e;
}

const Engine& dir_engine() {
    static const std::unique_ptr<Engine> e = Engine::load(kModel);
    return *e;
}

const JsonValue& image_case(const std::string& name) {
    for (const auto& c : clef::testing::tiny_image_cases().items())
        if (c.find("name")->as_string() == name) return c;
    throw std::runtime_error("no case " + name);
}

DecisionRequest request_of(const JsonValue& c) {
    DecisionRequest req;
    std::vector<RequestError> errors;
    EXPECT_TRUE(clef::testing::parse_case_request(c, req, errors)) << describe_errors(errors);
    return req;
}

void expect_matches_golden(const Decision& d, const JsonValue& c) {
    clef::testing::expect_matches_image_golden(d, c);
}

// Max |p_a - p_b| over every option.
double max_dp(const Decision& a, const Decision& b) {
    return clef::testing::max_probability_diff(a.probabilities, b.probabilities);
}

// The refusal of the image_pad_in_state case: the engine's ImageTokenMismatch message.
std::string mismatch_message(const Engine& e, const DecisionRequest& req) {
    try {
        e.prepare(req);
    } catch (const ImageTokenMismatch& err) {
        return err.what();
    }
    return "(no ImageTokenMismatch)";
}

std::vector<float> f32_of(const GgufTensorInfo& t) {
    std::vector<float> out(t.n_elements());
    dequantize_ref(static_cast<GgmlType>(t.ggml_type), t.data, out.data(), static_cast<int64_t>(out.size()));
    return out;
}

// A copy of the GGUF file src at dst in which `meta` may replace metadata (it returns true when it wrote the
// key itself, or to drop it) and `tensor` may replace tensors (true when it wrote the tensor itself).
void rewrite(const std::string& src, const std::string& dst,
             const std::function<bool(std::string_view, GgufWriter&)>& meta,
             const std::function<bool(const GgufTensorInfo&, GgufWriter&)>& tensor = {}) {
    const GgufFile in = GgufFile::open(src);
    GgufWriter w;
    for (const GgufKeyValue& kv : in.metadata())
        if (!meta(kv.key, w)) w.add_value(std::string(kv.key), kv.value);
    for (const GgufTensorInfo& t : in.tensors()) {
        if (tensor && tensor(t, w)) continue;
        w.add_tensor(t.name, t.ggml_type, t.dims, t.nbytes,
                     [&t](unsigned char* d) { std::memcpy(d, t.data, t.nbytes); });
    }
    w.write(dst);
}

void expect_load_error(const std::string& gguf, const std::string& mmproj,
                       const std::vector<std::string>& needles) {
    try {
        load_pair(gguf, mmproj);
        ADD_FAILURE() << "loaded " << mmproj;
    } catch (const Error& e) {
        for (const std::string& n : needles)
            EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(Mmproj, EveryImageCaseAsFromTheDirectory) {
    ASSERT_NE(gguf_engine().vision(), nullptr);
    const ImageProcessorConfig& gp = gguf_engine().image_processor();
    const ImageProcessorConfig& dp = dir_engine().image_processor();
    EXPECT_EQ(gp.min_pixels, dp.min_pixels);
    EXPECT_EQ(gp.max_pixels, dp.max_pixels);
    EXPECT_EQ(gp.image_mean, dp.image_mean);
    EXPECT_EQ(gp.image_std, dp.image_std);
    int answered = 0, refused = 0;
    for (const auto& c : clef::testing::tiny_image_cases().items()) {
        SCOPED_TRACE(c.find("name")->as_string());
        const DecisionRequest req = request_of(c);
        DecideOptions opt;
        opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
        if (const JsonValue* err = c.find("expected_error")) {
            const std::string got = mismatch_message(gguf_engine(), req);
            EXPECT_EQ(got.rfind(err->find("message")->as_string(), 0), 0u) << got;
            EXPECT_EQ(got, mismatch_message(dir_engine(), req));
            ++refused;
            continue;
        }
        const Decision g = gguf_engine().decide(req, opt, /*keep_hidden=*/true);
        const Decision d = dir_engine().decide(req, opt);
        expect_matches_golden(g, c);
        EXPECT_EQ(g.prompt.input_ids, d.prompt.input_ids);
        const double dp_dir = max_dp(g, d);
        std::printf("  %-28s max |p_gguf - p_dir| %.3g\n", c.find("name")->as_string().c_str(), dp_dir);
        EXPECT_LE(dp_dir, 2e-5);
        ++answered;
    }
    EXPECT_EQ(answered, 5);
    EXPECT_EQ(refused, 1);
}

// llama.cpp's names for the Qwen3-VL projector (clip-impl.h: TN_PATCH_EMBD, TN_PATCH_EMBD_1, TN_PATCH_BIAS,
// TN_POS_EMBD, TN_LN_1/2, TN_ATTN_QKV, TN_ATTN_OUTPUT, TN_FFN_UP/DOWN, TN_LN_POST, TN_LLAVA_PROJ 0 and 2),
// ggml dims from the fixture's vision_config (hidden 32, intermediate 48, 2 blocks, patch 16, 16 positions,
// merged width 4 x 32, text width 64).
TEST(Mmproj, HeaderHasLlamaCppNamesAndKeys) {
    const GgufFile f = GgufFile::open(files().mmproj(GgufFileType::F32));
    EXPECT_EQ(f.get_string("general.architecture"), "clip");
    EXPECT_EQ(f.get_string("general.type"), "mmproj");
    EXPECT_EQ(f.get_uint("general.file_type"), 0u);
    EXPECT_EQ(f.get_string("clip.projector_type"), "qwen3vl_merger");
    EXPECT_TRUE(f.get_bool("clip.has_vision_encoder"));
    EXPECT_TRUE(f.get_bool("clip.use_gelu"));
    const std::pair<const char*, uint64_t> ints[] = {
        {"clip.vision.projection_dim", 64},
        {"clip.vision.embedding_length", 32},
        {"clip.vision.feed_forward_length", 48},
        {"clip.vision.block_count", 2},
        {"clip.vision.attention.head_count", 2},
        {"clip.vision.patch_size", 16},
        {"clip.vision.image_size", 64},  // sqrt(num_position_embeddings) * patch_size
        {"clip.vision.spatial_merge_size", 2},
        {"clip.vision.image_min_pixels", 4096},  // processor_config.json size.shortest_edge / longest_edge
        {"clip.vision.image_max_pixels", 12288}};
    for (const auto& [k, v] : ints) EXPECT_EQ(f.get_uint(k), v) << k;
    EXPECT_NEAR(f.get_float("clip.vision.attention.layer_norm_epsilon"), 1e-6, 1e-12);
    for (const char* k : {"clip.vision.image_mean", "clip.vision.image_std"}) {
        EXPECT_EQ(f.at(k).element_type(), GgufType::kFloat32) << k;
        EXPECT_EQ(f.at(k).floats(), (std::vector<double>{0.5, 0.5, 0.5})) << k;
    }
    const GgufValue& ds = f.at("clip.vision.is_deepstack_layers");
    ASSERT_EQ(ds.size(), 2u);
    EXPECT_FALSE(ds.bool_at(0) || ds.bool_at(1));

    std::vector<std::pair<std::string, std::vector<uint64_t>>> want = {
        {"v.patch_embd.weight", {16, 16, 3, 32}},
        {"v.patch_embd.weight.1", {16, 16, 3, 32}},
        {"v.patch_embd.bias", {32}},
        {"v.position_embd.weight", {32, 16}},
        {"v.post_ln.weight", {32}},
        {"v.post_ln.bias", {32}},
        {"mm.0.weight", {128, 128}},
        {"mm.0.bias", {128}},
        {"mm.2.weight", {128, 64}},
        {"mm.2.bias", {64}}};
    for (int i = 0; i < 2; ++i) {
        const std::string b = "v.blk." + std::to_string(i) + ".";
        for (const char* ln : {"ln1", "ln2"})
            for (const char* wb : {".weight", ".bias"}) want.push_back({b + ln + wb, {32}});
        want.push_back({b + "attn_qkv.weight", {32, 96}});
        want.push_back({b + "attn_qkv.bias", {96}});
        want.push_back({b + "attn_out.weight", {32, 32}});
        want.push_back({b + "attn_out.bias", {32}});
        want.push_back({b + "ffn_up.weight", {32, 48}});
        want.push_back({b + "ffn_up.bias", {48}});
        want.push_back({b + "ffn_down.weight", {48, 32}});
        want.push_back({b + "ffn_down.bias", {32}});
    }
    EXPECT_EQ(f.tensors().size(), want.size());
    for (const auto& [name, dims] : want) {
        const GgufTensorInfo* t = f.find_tensor(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(t->dims, dims) << name;
        EXPECT_EQ(t->ggml_type, static_cast<uint32_t>(GgmlType::F32)) << name;
    }
}

// The values: each patch kernel is one temporal frame of the Conv3d [32][3][2][16][16]; the fused qkv and the
// merger's projections are the checkpoint's tensors as they are; the reader gives the checkpoint back.
TEST(Mmproj, TensorsHoldTheCheckpointValues) {
    const GgufFile f = GgufFile::open(files().mmproj(GgufFileType::F32));
    const Checkpoint ck = Checkpoint::open(kModel);
    const std::vector<float> conv = ck.get("model.visual.patch_embed.proj.weight").to_f32();
    for (int t = 0; t < 2; ++t) {
        const std::vector<float> k =
            f32_of(*f.find_tensor(t ? "v.patch_embd.weight.1" : "v.patch_embd.weight"));
        ASSERT_EQ(k.size() * 2, conv.size());
        for (size_t hc = 0; hc < 32 * 3; ++hc)
            for (size_t i = 0; i < 256; ++i) ASSERT_EQ(k[hc * 256 + i], conv[(hc * 2 + t) * 256 + i]) << t;
    }
    const std::pair<const char*, const char*> same[] = {
        {"v.blk.1.attn_qkv.weight", "model.visual.blocks.1.attn.qkv.weight"},
        {"v.blk.0.ffn_down.weight", "model.visual.blocks.0.mlp.linear_fc2.weight"},
        {"v.position_embd.weight", "model.visual.pos_embed.weight"},
        {"v.post_ln.bias", "model.visual.merger.norm.bias"},
        {"mm.0.weight", "model.visual.merger.linear_fc1.weight"},
        {"mm.2.weight", "model.visual.merger.linear_fc2.weight"}};
    for (const auto& [gguf, hf] : same) EXPECT_EQ(f32_of(*f.find_tensor(gguf)), ck.get(hf).to_f32()) << gguf;

    // Read back: every tensor of the checkpoint's tower under its own name, shape and values (the two frames
    // joined into the Conv3d in their order).
    const GgufMmproj m = load_gguf_mmproj(files().mmproj(GgufFileType::F32), dir_engine().config().text);
    size_t n = 0;
    for (const TensorView* t : ck.all()) {
        if (t->name.rfind("model.visual.", 0) != 0) continue;
        const TensorView* got = m.weights->find(t->name);
        ASSERT_NE(got, nullptr) << t->name;
        EXPECT_EQ(got->shape, t->shape) << t->name;
        EXPECT_EQ(got->to_f32(), t->to_f32()) << t->name;
        ++n;
    }
    EXPECT_EQ(m.weights->names().size(), n);
    EXPECT_EQ(n, 33u);
}

// llama.cpp's converter (MmprojModel.tensor_force_quant and its F32 rules): the patch kernels f16 in f16
// files and f32 otherwise, the position table, norms and biases f32, the matrices in the file type, q8_0
// falling back to f16 for rows that are not whole 32-value blocks (ffn_down's 48). The bf16 pair answers as
// the directory does; q8_0 within its measured deviation (5.4e-4 on this case) and a margin.
TEST(Mmproj, TypesPerFileType) {
    using G = GgmlType;
    struct Row {
        GgufFileType ft;
        G patch, qkv, ffn_down;
    };
    for (const Row& r :
         {Row{GgufFileType::F16, G::F16, G::F16, G::F16}, Row{GgufFileType::BF16, G::F32, G::BF16, G::BF16},
          Row{GgufFileType::Q8_0, G::F32, G::Q8_0, G::F16}}) {
        SCOPED_TRACE(gguf_file_type_name(r.ft));
        const GgufFile f = GgufFile::open(files().mmproj(r.ft));
        auto type = [&](const char* n) { return static_cast<G>(f.find_tensor(n)->ggml_type); };
        EXPECT_EQ(type("v.patch_embd.weight"), r.patch);
        EXPECT_EQ(type("v.patch_embd.weight.1"), r.patch);
        EXPECT_EQ(type("v.blk.0.attn_qkv.weight"), r.qkv);
        EXPECT_EQ(type("mm.0.weight"), r.qkv);
        EXPECT_EQ(type("v.blk.1.ffn_down.weight"), r.ffn_down);
        for (const char* n :
             {"v.position_embd.weight", "v.blk.0.ln1.weight", "v.blk.0.attn_qkv.bias", "v.post_ln.weight"})
            EXPECT_EQ(type(n), G::F32) << n;
        EXPECT_EQ(f.get_uint("general.file_type"), static_cast<uint32_t>(r.ft));
    }
    const JsonValue& c = image_case("image_two_sizes");
    const Decision d = dir_engine().decide(request_of(c));
    for (const auto& [ft, bound] :
         {std::pair{GgufFileType::BF16, 2e-5}, std::pair{GgufFileType::Q8_0, 2e-3}}) {
        const double dp = max_dp(load_pair(files().gguf, files().mmproj(ft))->decide(request_of(c)), d);
        std::printf("  %s mmproj: max |p_gguf - p_dir| %.3g\n", gguf_file_type_name(ft), dp);
        EXPECT_LE(dp, bound) << gguf_file_type_name(ft);
    }
    ConvertOptions o;
    o.type = GgufFileType::Q4_K_M;
    try {
        convert_to_mmproj(kModel, files().dir.file("mmproj-q4.gguf"), o);
        ADD_FAILURE() << "q4_k_m mmproj written";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not an mmproj type"), std::string::npos) << e.what();
    }
}

TEST(Mmproj, GgufWithoutMmprojRefusesImages) {
    const std::unique_ptr<Engine> e = Engine::load(files().gguf);
    clef::testing::expect_refuses_images_answers_text(*e, request_of(image_case("image_single_png")));
}

// llama.cpp's converter writes no pixel bounds for this projector: the reader then takes Clef-Flash's
// published ones (65536 / 16777216), as for a model directory without a processor config.
TEST(Mmproj, WithoutPixelBoundsTakesClefFlashs) {
    const ScratchDir d("clef_test_mmproj_bounds");
    const std::string p = d.file("no_bounds.gguf");
    rewrite(files().mmproj(GgufFileType::F16), p, [](std::string_view k, GgufWriter&) {
        return k == "clip.vision.image_min_pixels" || k == "clip.vision.image_max_pixels";
    });
    const GgufMmproj m = load_gguf_mmproj(p, dir_engine().config().text);
    EXPECT_EQ(m.processor.min_pixels, 65536);
    EXPECT_EQ(m.processor.max_pixels, 16777216);
    EXPECT_EQ(m.processor.patch_size, 16);
    EXPECT_EQ(m.processor.merge_size, 2);
    EXPECT_EQ(m.vision.depth, 2);
    EXPECT_EQ(m.vision.num_position_embeddings, 16);
}

// An mmproj written for a 32-wide text model (projection_dim 32, the merger's output projection cut to 32
// rows) beside the 64-wide backbone; DeepStack blocks; a missing frame; not an mmproj; an mmproj beside a
// model directory.
TEST(Mmproj, Refusals) {
    const std::string src = files().mmproj(GgufFileType::F32), gguf = files().gguf;
    const ScratchDir d("clef_test_mmproj_bad");
    const std::string narrow = d.file("narrow.gguf");
    rewrite(
        src, narrow,
        [](std::string_view k, GgufWriter& w) {
            if (k != "clip.vision.projection_dim") return false;
            w.add_uint32(std::string(k), 32);
            return true;
        },
        [](const GgufTensorInfo& t, GgufWriter& w) {
            if (t.name != "mm.2.weight" && t.name != "mm.2.bias") return false;
            std::vector<uint64_t> dims = t.dims;
            dims.back() = 32;
            const uint64_t n = t.nbytes / 2;  // the first 32 of 64 rows (f32)
            w.add_tensor(t.name, t.ggml_type, dims, n,
                         [&t, n](unsigned char* p) { std::memcpy(p, t.data, n); });
            return true;
        });
    expect_load_error(gguf, narrow, {"narrow.gguf", "clip.vision.projection_dim 32", "64", "another model"});

    const std::string deep = d.file("deepstack.gguf");
    rewrite(src, deep, [](std::string_view k, GgufWriter& w) {
        if (k != "clip.vision.is_deepstack_layers") return false;
        w.add_bool_array(std::string(k), {false, true});
        return true;
    });
    expect_load_error(gguf, deep, {"deepstack_visual_indexes", "DeepStack is not supported"});

    const std::string one_frame = d.file("one_frame.gguf");
    rewrite(
        src, one_frame, [](std::string_view, GgufWriter&) { return false; },
        [](const GgufTensorInfo& t, GgufWriter&) { return t.name == "v.patch_embd.weight.1"; });
    expect_load_error(gguf, one_frame, {"v.patch_embd.weight.1"});

    expect_load_error(gguf, gguf, {"general.architecture is 'clef', not clip"});
    expect_load_error(kModel, src, {"goes with a GGUF model"});
}

TEST(Mmproj, Cli) {
    const ScratchDir d("clef_test_mmproj_cli");
    const std::string bin = CLEF_BINARY, mm = d.file("mm.gguf");
    int status = 0;
    std::string out = clef::testing::run_command(
        bin + " convert --model " + kModel + " --mmproj " + mm + " --type f32 2>&1", status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    EXPECT_NE(out.find("34 tensors"), std::string::npos) << out;
    size_t files_written = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path())) files_written += e.is_regular_file();
    EXPECT_EQ(files_written, 1u);  // no backbone file without --out

    const JsonValue& c = image_case("image_nonsquare_resize");
    const std::string req = d.write("req.json", c.find("request_body")->as_string());
    out = clef::testing::run_command(
        bin + " decide --model " + files().gguf + " --mmproj " + mm + " " + req + " 2>&1", status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    clef::testing::expect_json_near(parse_json_or_throw(out, "stdout"), *c.find("response"), 1e-4,
                                    "response");

    out = clef::testing::run_command(
        bin + " convert --model " + files().gguf + " --mmproj " + d.file("x.gguf") + " 2>&1", status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_NE(out.find("--mmproj writes the vision tower of a model directory"), std::string::npos) << out;
    out = clef::testing::run_command(bin + " convert --model " + kModel + " 2>&1", status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_NE(out.find("give --out"), std::string::npos) << out;
}
