// What `clef serve` says about its model and the names it answers to, through the real binary: the
// publisher-layout fixture and a community-named GGUF of it answer "clef-flash"; /v1/models, Ollama's
// /api/version, /api/tags and /api/show report the files' truth (expected values come from the fixture's
// config.json, its safetensors headers and the file type asked of `clef convert`); --log-format json lines
// carry no key and no state text. The naming rules themselves (model/model_card.h) are checked on their own
// first.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device/vulkan.h"
#include "model/model_card.h"
#include "model/serve_plan.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;
using clef::testing::data_path;
using clef::testing::read_file;

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------------------
// The naming rules.

TEST(ModelNames, CommunityFileNames) {
    EXPECT_EQ(model_name_in_file_name("Cloudflare_clef-flash-Q4_K_M"), "clef-flash");
    EXPECT_EQ(model_name_in_file_name("clef-flash-IQ2_M"), "clef-flash");
    EXPECT_EQ(model_name_in_file_name("clef-flash.Q8_0"), "clef-flash");
    EXPECT_EQ(model_name_in_file_name("clef-flash-bf16"), "clef-flash");
    EXPECT_EQ(model_name_in_file_name("clef-27b-Q5_K_S"), "clef");
    EXPECT_EQ(model_name_in_file_name("clef-flash"), "clef-flash");
    EXPECT_EQ(model_name_in_file_name("Cloudflare_clef"), "clef");
    EXPECT_EQ(model_name_in_file_name("tiny-clef"), "");
    EXPECT_EQ(model_name_in_file_name("clef-demo"), "");
    EXPECT_EQ(model_name_in_file_name("my_model-Q4_K_M"), "");
    EXPECT_EQ(model_name_in_file_name("clef-flashy-Q4_K_M"), "");
}

TEST(ModelNames, WrittenNames) {
    EXPECT_EQ(known_model_name("Clef Flash"), "clef-flash");
    EXPECT_EQ(known_model_name("Cloudflare/clef-flash"), "clef-flash");
    EXPECT_EQ(known_model_name("Clef-Flash 9B"), "clef-flash");
    EXPECT_EQ(known_model_name("Clef"), "clef");
    EXPECT_EQ(known_model_name("tiny-clef"), "");
    EXPECT_EQ(known_model_name(""), "");
}

TextConfig gdn_heads(int key_heads, int value_heads) {
    TextConfig t;
    t.linear_num_key_heads = key_heads;
    t.linear_num_value_heads = value_heads;
    return t;
}

TEST(ModelNames, CheckpointStructure) {
    // Clef-Flash: 16 key / 32 value heads; Clef 27B: 16 / 48 (docs/API.md, "Model names").
    EXPECT_EQ(checkpoint_model_name(gdn_heads(16, 32)), "clef-flash");
    EXPECT_EQ(checkpoint_model_name(gdn_heads(16, 48)), "clef");
    EXPECT_EQ(checkpoint_model_name(gdn_heads(16, 16)), "");
    EXPECT_EQ(checkpoint_model_name(gdn_heads(0, 0)), "");
    const JsonValue cfg = parse_json_or_throw(read_file(data_path("tiny-clef/config.json")), "config.json");
    const JsonValue& t = *cfg.find("text_config");
    EXPECT_EQ(
        checkpoint_model_name(gdn_heads(static_cast<int>(t.find("linear_num_key_heads")->as_int64()),
                                        static_cast<int>(t.find("linear_num_value_heads")->as_int64()))),
        "clef-flash");
}

TEST(ModelNames, ReleaseDateOnlyForThePublishedShapes) {
    TextConfig flash = gdn_heads(16, 32);
    flash.hidden_size = 4096, flash.num_layers = 32, flash.vocab_size = 248320;
    EXPECT_EQ(published_release_date(flash), "2026-10-01");
    TextConfig clef27 = gdn_heads(16, 48);
    clef27.hidden_size = 5120, clef27.num_layers = 64, clef27.vocab_size = 248320;
    EXPECT_EQ(published_release_date(clef27), "2026-10-01");
    flash.num_layers = 4;  // the 4-layer flash-shaped test model is not the release
    EXPECT_EQ(published_release_date(flash), "");
}

TEST(ModelNames, ServedNames) {
    ModelCard c;
    c.checkpoint_name = "clef-flash";
    c.file_name = "tiny-clef";
    EXPECT_EQ(served_names(c, "", {}), (std::vector<std::string>{"clef-flash", "tiny-clef"}));
    EXPECT_EQ(served_names(c, "mine", {"clef-flash", "x", "x"}),
              (std::vector<std::string>{"mine", "clef-flash", "tiny-clef", "x"}));
    c.checkpoint_name = "";
    c.file_name = "Cloudflare_clef-flash-Q4_K_M";
    EXPECT_EQ(served_names(c, "", {}),
              (std::vector<std::string>{"clef-flash", "Cloudflare_clef-flash-Q4_K_M"}));
    EXPECT_EQ(served_names(ModelCard{}, "", {}), (std::vector<std::string>{"clef"}));
    const std::vector<std::string> names = {"clef-flash", "tiny-clef"};
    EXPECT_TRUE(names_model(names, "clef-flash"));
    EXPECT_TRUE(names_model(names, "clef-flash:latest"));
    EXPECT_FALSE(names_model(names, "clef-flash:9b"));
    EXPECT_FALSE(names_model(names, "Clef-Flash"));
    EXPECT_FALSE(names_model(names, ":latest"));
}

TEST(ModelNames, ParameterSize) {
    EXPECT_EQ(parameter_size_text(9531576564), "9.5B");
    EXPECT_EQ(parameter_size_text(27000000000), "27B");
    EXPECT_EQ(parameter_size_text(1234567), "1.2M");
    EXPECT_EQ(parameter_size_text(950000), "950K");
    EXPECT_EQ(parameter_size_text(950), "950");
}

// ---------------------------------------------------------------------------------------------------------------
// Independent expectations: the fixture's files read here, not through clef.

// Parameters in a safetensors file (its JSON header), the tensors whose name starts with `skip` left out.
int64_t safetensors_params(const std::string& path, const std::string& skip = "\x01") {
    std::ifstream f(path, std::ios::binary);
    unsigned char len[8];
    f.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    const JsonValue tensors = parse_json_or_throw(header, path);
    int64_t params = 0;
    for (const auto& [name, t] : tensors.members()) {
        if (name == "__metadata__" || name.rfind(skip, 0) == 0) continue;
        int64_t numel = 1;
        for (const JsonValue& d : t.find("shape")->items()) numel *= d.as_int64();
        params += numel;
    }
    return params;
}

const JsonValue& fixture_text_config() {
    static const JsonValue cfg =
        parse_json_or_throw(read_file(data_path("tiny-clef/config.json")), "tiny-clef/config.json");
    return *cfg.find("text_config");
}

int64_t fixture_context_length() {
    return fixture_text_config().find("max_position_embeddings")->as_int64();
}

// The project version, from CMakeLists.txt's project() line.
std::string project_version() {
    const std::string cmake = read_file(std::string(CLEF_TEST_DATA) + "/../../CMakeLists.txt");
    std::smatch m;
    if (!std::regex_search(cmake, m, std::regex(R"(project\(clef_cpp VERSION ([0-9.]+))"))) return "?";
    return m[1];
}

// ---------------------------------------------------------------------------------------------------------------
// `clef serve` as a child process on a free port, stderr captured.

class CliServer {
public:
    explicit CliServer(const std::vector<std::string>& args) : log_(scratch_.path() / "stderr.log") {
        pid_ = fork();
        if (pid_ == 0) {
            const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            dup2(fd, 2);
            const int null = ::open("/dev/null", O_WRONLY);
            dup2(null, 1);
            std::vector<std::string> all = {CLEF_BINARY, "serve", "--port", "0", "--cache-mib", "0"};
            all.insert(all.end(), args.begin(), args.end());
            std::vector<char*> argv;
            for (std::string& a : all) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(CLEF_BINARY, argv.data());
            _exit(127);
        }
        const std::regex listening(R"(on http://127\.0\.0\.1:([0-9]+))");
        for (int i = 0; i < 6000 && port_ == 0; ++i) {
            std::smatch m;
            const std::string text = log();
            if (std::regex_search(text, m, listening))
                port_ = std::stoi(m[1]);
            else if (waitpid(pid_, nullptr, WNOHANG) != 0)
                throw std::runtime_error("clef serve exited: " + text);
            else
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        for (int i = 0; i < 6000; ++i) {
            auto r = client().Get("/ready");
            if (r && r->status == 200) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        throw std::runtime_error("clef serve did not get ready: " + log());
    }
    ~CliServer() { stop(); }
    // SIGTERM, then the exit status (0: a clean stop).
    int stop() {
        if (pid_ > 0) {
            kill(pid_, SIGTERM);
            waitpid(pid_, &status_, 0);
            pid_ = -1;
        }
        return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
    }
    std::string log() const {
        std::ifstream f(log_);
        return std::string(std::istreambuf_iterator<char>(f), {});
    }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(600, 0);
        return c;
    }
    JsonValue get(const std::string& path, int want_status = 200, const httplib::Headers& h = {}) const {
        auto r = client().Get(path, h);
        if (!r) throw std::runtime_error("GET " + path + " failed");
        EXPECT_EQ(r->status, want_status) << path << ": " << r->body;
        return parse_json_or_throw(r->body, path);
    }
    JsonValue post(const std::string& path, const std::string& body, int want_status = 200,
                   const httplib::Headers& h = {}) const {
        auto r = client().Post(path, h, body, "application/json");
        if (!r) throw std::runtime_error("POST " + path + " failed");
        EXPECT_EQ(r->status, want_status) << path << " " << body << ": " << r->body;
        return parse_json_or_throw(r->body, path);
    }

private:
    clef::testing::ScratchDir scratch_{"clef_serve_models"};
    fs::path log_;
    pid_t pid_ = -1;
    int status_ = 0;
    int port_ = 0;
};

std::string decision(const std::string& model, const std::string& state = "s") {
    return R"({"model":")" + model + R"(","state":")" + state +
           R"(","questions":{"q":{"type":"noul","instructions":"ok?"}}})";
}

std::vector<std::string> strings_of(const JsonValue& array) {
    std::vector<std::string> out;
    for (const JsonValue& v : array.items()) out.push_back(v.as_string());
    return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

// ---------------------------------------------------------------------------------------------------------------
// The publisher layout.

TEST(ServeModels, PublisherDirectoryAnswersClefFlash) {
    CliServer s({"--model", data_path("tiny-clef"), "--max-tokens", "4096", "--log-requests"});
    JsonValue r = s.post("/v1/systemone", decision("clef-flash"));
    EXPECT_EQ(r.find("model")->as_string(), "clef-flash");  // the checkpoint's name is the canonical one
    r = s.post("/v1/systemone", decision("tiny-clef"));     // and the directory's name an alias
    EXPECT_EQ(r.find("model")->as_string(), "clef-flash");
    r = s.post("/v1/systemone", decision("clef"), 400);
    EXPECT_EQ(r.find("detail")->find("message")->as_string(), "Unknown model: clef");
    EXPECT_EQ(s.get("/ready").find("model")->as_string(), "clef-flash");

    const JsonValue models = s.get("/v1/models");
    const JsonValue& card = models.find("models")->items().at(0);
    EXPECT_EQ(card.find("name")->as_string(), "clef-flash");
    EXPECT_EQ(strings_of(*card.find("aliases")), std::vector<std::string>{"tiny-clef"});
    EXPECT_EQ(models.find("models")->items().at(1).find("alias_of")->as_string(), "clef-flash");
    // config.json says "dtype": "bfloat16"; the weights are BF16 but the decay logs.
    ASSERT_EQ(fixture_text_config().find("dtype")->as_string(), "bfloat16");
    EXPECT_EQ(card.find("quantization")->as_string(), "bf16");
    EXPECT_EQ(card.find("format")->as_string(), "safetensors");
    EXPECT_EQ(card.find("context_length")->as_int64(), fixture_context_length());
    EXPECT_EQ(card.find("max_prompt_tokens")->as_int64(), 4096);
    EXPECT_EQ(card.find("parameter_count")->as_int64(),
              safetensors_params(data_path("tiny-clef/model.safetensors")) +
                  safetensors_params(data_path("tiny-clef/joint_head.safetensors")));
    EXPECT_TRUE(contains(strings_of(*card.find("capabilities")), "vision"));  // its tower is loaded
    EXPECT_EQ(card.find("release_date")->as_string(), "");                    // a toy, not a release
    EXPECT_TRUE(card.find("ready")->as_bool());

    // --log-requests alone: human-readable lines.
    const std::string log = s.log();
    EXPECT_NE(log.find(" POST /v1/systemone 200 model=clef-flash input_tokens="), std::string::npos) << log;
    EXPECT_NE(log.find(" GET /v1/models 200"), std::string::npos) << log;
    EXPECT_EQ(s.stop(), 0);
}

// ---------------------------------------------------------------------------------------------------------------
// A GGUF under a community file name: the fixture converted to a backbone-only q4_k_m file, its head from
// --head.

class ServeGguf : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new clef::testing::ScratchDir("clef_serve_gguf");
        gguf_ = (dir_->path() / "Cloudflare_clef-flash-Q4_K_M.gguf").string();
        int status = 0;
        const std::string out = clef::testing::run_command(std::string(CLEF_BINARY) + " convert --model " +
                                                               data_path("tiny-clef") + " --out " + gguf_ +
                                                               " --type q4_k_m --arch qwen35 2>&1",
                                                           status);
        ASSERT_EQ(status, 0) << out;
        server_ = new CliServer({"--model", gguf_, "--head", data_path("tiny-clef")});
    }
    static void TearDownTestSuite() {
        delete server_;
        delete dir_;
    }
    // The text tensors and the head: the GGUF holds no vision tower.
    static int64_t expected_params() {
        return safetensors_params(data_path("tiny-clef/model.safetensors"), "model.visual.") +
               safetensors_params(data_path("tiny-clef/joint_head.safetensors"));
    }
    static inline clef::testing::ScratchDir* dir_ = nullptr;
    static inline std::string gguf_;
    static inline CliServer* server_ = nullptr;
};

TEST_F(ServeGguf, AnswersClefFlash) {
    for (const char* name : {"clef-flash", "Cloudflare_clef-flash-Q4_K_M", "clef-flash:latest"})
        EXPECT_EQ(server_->post("/v1/systemone", decision(name)).find("model")->as_string(), "clef-flash");
    server_->post("/v1/systemone", decision("tiny-clef"), 400);
}

TEST_F(ServeGguf, ModelsReportTheFile) {
    const JsonValue models = server_->get("/v1/models");
    const JsonValue& card = models.find("models")->items().at(0);
    EXPECT_EQ(card.find("name")->as_string(), "clef-flash");
    EXPECT_EQ(strings_of(*card.find("aliases")), std::vector<std::string>{"Cloudflare_clef-flash-Q4_K_M"});
    EXPECT_EQ(card.find("quantization")->as_string(), "Q4_K_M");
    EXPECT_EQ(card.find("format")->as_string(), "gguf");
    EXPECT_EQ(card.find("context_length")->as_int64(), fixture_context_length());
    EXPECT_EQ(card.find("max_prompt_tokens")->as_int64(), 16384);  // clef serve's default --max-tokens
    EXPECT_EQ(card.find("parameter_count")->as_int64(), expected_params());
    EXPECT_EQ(strings_of(*card.find("capabilities")), (std::vector<std::string>{"systemone", "decision"}));
    EXPECT_TRUE(card.find("release_date")->is_string());
}

TEST_F(ServeGguf, OllamaVersionTagsShow) {
    EXPECT_EQ(server_->get("/api/version"),
              JsonValue::object({{"version", JsonValue::string(project_version())}}));

    const JsonValue tags = server_->get("/api/tags");
    ASSERT_EQ(tags.find("models")->size(), 1u);
    const JsonValue& m = tags.find("models")->items()[0];
    EXPECT_EQ(m.find("name")->as_string(), "clef-flash");
    EXPECT_EQ(m.find("model")->as_string(), "clef-flash");
    EXPECT_TRUE(std::regex_match(m.find("modified_at")->as_string(),
                                 std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
    EXPECT_EQ(m.find("size")->as_int64(),
              static_cast<int64_t>(fs::file_size(gguf_) +
                                   fs::file_size(data_path("tiny-clef/joint_head.safetensors")) +
                                   fs::file_size(data_path("tiny-clef/joint_head_config.json"))));
    EXPECT_TRUE(std::regex_match(m.find("digest")->as_string(), std::regex("[0-9a-f]{64}")));
    const JsonValue& d = *m.find("details");
    EXPECT_EQ(d.find("format")->as_string(), "gguf");
    EXPECT_EQ(d.find("family")->as_string(), "clef");
    EXPECT_EQ(strings_of(*d.find("families")), std::vector<std::string>{"clef"});
    EXPECT_EQ(d.find("parameter_size")->as_string(), parameter_size_text(expected_params()));
    EXPECT_EQ(d.find("quantization_level")->as_string(), "Q4_K_M");

    for (const char* body : {R"({"model":"clef-flash"})", R"({"name":"Cloudflare_clef-flash-Q4_K_M"})"}) {
        const JsonValue show = server_->post("/api/show", body);
        EXPECT_EQ(*show.find("details"), d) << body;
        EXPECT_EQ(*show.find("modified_at"), *m.find("modified_at"));
        EXPECT_EQ(strings_of(*show.find("capabilities")),
                  (std::vector<std::string>{"systemone", "decision"}));
        const JsonValue& info = *show.find("model_info");
        EXPECT_EQ(info.find("general.architecture")->as_string(), "clef");
        EXPECT_EQ(info.find("general.file_type")->as_int64(), 15);  // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
        EXPECT_EQ(info.find("general.parameter_count")->as_int64(), expected_params());
        EXPECT_EQ(info.find("clef.context_length")->as_int64(), fixture_context_length());
        EXPECT_EQ(info.find("clef.embedding_length")->as_int64(),
                  fixture_text_config().find("hidden_size")->as_int64());
        EXPECT_EQ(info.find("clef.block_count")->as_int64(),
                  fixture_text_config().find("num_hidden_layers")->as_int64());
    }
    EXPECT_EQ(server_->post("/api/show", R"({"model":"llama3"})", 404),
              JsonValue::object({{"error", JsonValue::string("model 'llama3' not found")}}));
    EXPECT_TRUE(server_->post("/api/show", R"({})", 400).find("error")->is_string());
    EXPECT_TRUE(server_->post("/api/show", R"([1])", 400).find("error")->is_string());
    // Ollama's own examples send the body with `curl -d` (a form type): read as JSON all the same.
    auto r =
        server_->client().Post("/api/show", R"({"model":"clef-flash"})", "application/x-www-form-urlencoded");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

// ---------------------------------------------------------------------------------------------------------------
// The demo model, with an API key and JSON request logs.

// A 400 refusal of `body` by the memory admission whose message names each of `names`; then a short decision
// of `model` is still answered.
void expect_memory_refusal(CliServer& s, const std::string& model, const std::string& body,
                           std::initializer_list<const char*> names) {
    const JsonValue big = s.post("/v1/systemone", body, 400);
    ASSERT_TRUE(big.find("detail") && big.find("detail")->find("message")) << "no 400 error body";
    const std::string msg = big.find("detail")->find("message")->as_string();
    for (const char* n : names) EXPECT_NE(msg.find(n), std::string::npos) << msg;
    s.post("/v1/systemone", decision(model), 200);
}

// The memory plan's admission: with a limit that leaves room for short decisions only, a long prompt gets a
// 400 naming the need and the limit before it starts, and the server keeps answering.
TEST(ServeModels, RequestOverTheMemoryPlanIsRefused) {
    CliServer s({"--demo", "--memory-limit-mib", "36"});
    s.post("/v1/systemone", decision("clef-demo"), 200);
    std::string words;
    for (int i = 0; i < 300; ++i) words += "word ";
    const JsonValue err = s.post("/v1/systemone", decision("clef-demo", words), 200);
    EXPECT_TRUE(err.find("answers")) << "300 words (~1,500 tokens) fit 36 MiB on the demo model";
    for (int i = 0; i < 3000; ++i) words += "word ";
    expect_memory_refusal(s, "clef-demo", decision("clef-demo", words),
                          {"memory plan", "--memory-limit-mib 36 MiB"});
    EXPECT_EQ(s.stop(), 0);
}

// The device's part of the admission (--device vulkan, lavapipe here): --gpu-memory that holds the model and
// its 4,096-token plan, and a ~16,000-token decision whose device state and activations do not fit beside it,
// is refused with a 400 naming the device and --gpu-memory; short decisions are answered.
TEST(ServeModels, RequestOverTheDeviceMemoryPlanIsRefused) {
    if (!clef::dev::choose_device("vulkan", clef::dev::probe_vulkan()).vulkan)
        GTEST_SKIP() << "no Vulkan device";
    const std::string model = data_path("tiny-clef");
    clef::MemoryPlanInput in = clef::machine_plan_input(4096);
    in.device = true;
    const uint64_t fits = clef::compute_memory_plan(model, "", in).device->total() + (uint64_t{1} << 20);
    CliServer s({"--model", model, "--device", "vulkan", "--gpu-memory", std::to_string(fits), "--name",
                 "tiny-clef"});
    s.post("/v1/systemone", decision("tiny-clef"), 200);
    std::string words;
    for (int i = 0; i < 3300; ++i) words += "word ";
    expect_memory_refusal(s, "tiny-clef", decision("tiny-clef", words),
                          {"device memory plan", "--gpu-memory"});
    EXPECT_EQ(s.stop(), 0);
}

TEST(ServeModels, DemoCardKeysAndJsonLogs) {
    const std::string key = "sk-test-key-8731", state = "state text that must not be logged 5521";
    CliServer s({"--demo", "--api-key", key, "--log-format", "json"});
    const httplib::Headers auth = {{"Authorization", "Bearer " + key}};

    // The demo is a tiny random model in make-model's form: BF16 weights (src/tools/make_model.h), a
    // max_position_embeddings of 262144, no vision tower.
    const JsonValue models = s.get("/v1/models", 200, auth);
    const JsonValue& card = models.find("models")->items().at(0);
    EXPECT_EQ(card.find("name")->as_string(), "clef-demo");
    EXPECT_EQ(card.find("quantization")->as_string(), "bf16");
    EXPECT_EQ(card.find("context_length")->as_int64(), 262144);
    EXPECT_FALSE(contains(strings_of(*card.find("capabilities")), "vision"));
    const std::vector<std::string> aliases = strings_of(*card.find("aliases"));
    EXPECT_FALSE(contains(aliases, "model")) << "the temporary directory's name is no model name";
    EXPECT_TRUE(contains(aliases, "clef-flash"));  // its structure is Clef-Flash's
    EXPECT_EQ(s.post("/v1/systemone", decision("clef-demo", state), 200, auth).find("model")->as_string(),
              "clef-demo");

    // Ollama's routes: the version for anyone, the model list and details with the key only.
    EXPECT_TRUE(s.get("/api/version").find("version")->is_string());
    EXPECT_TRUE(s.get("/api/tags", 403).find("error")->is_string());
    EXPECT_TRUE(s.get("/api/tags", 401, {{"Authorization", "Bearer wrong"}}).find("error")->is_string());
    EXPECT_EQ(s.get("/api/tags", 200, auth).find("models")->items().at(0).find("name")->as_string(),
              "clef-demo");
    s.post("/api/show", R"({"model":"clef-demo"})", 403);
    s.post("/api/show", R"({"model":"clef-demo"})", 200, auth);
    EXPECT_EQ(s.stop(), 0);

    const std::string log = s.log();
    EXPECT_EQ(log.find(key), std::string::npos) << log;
    EXPECT_EQ(log.find("state text"), std::string::npos) << log;
    int decisions = 0, lines = 0;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] != '{') continue;  // the startup and shutdown messages
        ++lines;
        const JsonValue j = parse_json_or_throw(line, "log line");
        EXPECT_FALSE(j.find("id")->as_string().empty());
        EXPECT_TRUE(j.find("method")->is_string());
        EXPECT_TRUE(j.find("status")->is_int());
        if (j.find("path")->as_string() != "/v1/systemone" || j.find("status")->as_int64() != 200) continue;
        ++decisions;
        EXPECT_EQ(j.find("method")->as_string(), "POST");
        EXPECT_EQ(j.find("model")->as_string(), "clef-demo");
        EXPECT_GT(j.find("input_tokens")->as_int64(), 0);
        for (const char* k : {"queue_ms", "compute_ms", "total_ms"}) EXPECT_TRUE(j.find(k)->is_number()) << k;
    }
    EXPECT_EQ(decisions, 1) << log;
    EXPECT_GE(lines, 9) << log;  // one per request above
}

}  // namespace
