// Model-file faults: a copy of the tiny-clef directory with one file truncated, corrupted, reshaped or
// poisoned must fail at load with a clef::Error naming the problem (or, for NaN weights, fail the decision
// with a clef::Error that the server turns into a 500) -- never undefined behaviour (the ASan build runs
// these too).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "decision/engine.h"
#include "decision/request.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

using namespace clef;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(CLEF_TEST_DATA) / "tiny-clef";
const char* const kFiles[] = {"config.json",           "model.safetensors",     "tokenizer.json",
                              "tokenizer_config.json", "processor_config.json", "joint_head_config.json",
                              "joint_head.safetensors"};

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_file(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << s;
}

// A private copy of the model files (not the large golden probes) in a temporary directory.
class ModelCopy {
public:
    ModelCopy() {
        dir_ = fs::temp_directory_path() /
               ("clef-faults-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
        fs::create_directories(dir_);
        for (const char* f : kFiles)
            if (fs::exists(kModel / f))
                fs::copy_file(kModel / f, dir_ / f, fs::copy_options::overwrite_existing);
    }
    ~ModelCopy() { fs::remove_all(dir_); }
    fs::path operator/(const char* f) const { return dir_ / f; }
    std::string path() const { return dir_.string(); }

private:
    static inline int counter_ = 0;
    fs::path dir_;
};

// The JSON header of a safetensors file and the bytes after it.
struct Safetensors {
    JsonValue header;
    std::string data;

    static Safetensors read(const fs::path& p) {
        std::string bytes = read_file(p);
        uint64_t n = 0;
        std::memcpy(&n, bytes.data(), 8);
        Safetensors st;
        st.header = parse_json_or_throw(bytes.substr(8, n), p.string());
        st.data = bytes.substr(8 + n);
        return st;
    }
    void write(const fs::path& p) const {
        std::string h = write_json(header);
        uint64_t n = h.size();
        std::string out(8, '\0');
        std::memcpy(out.data(), &n, 8);
        write_file(p, out + h + data);
    }
    // First tensor whose name contains `part`.
    JsonValue& tensor(const std::string& part) {
        for (auto& [name, v] : header.members())
            if (name != "__metadata__" && name.find(part) != std::string::npos) return v;
        throw std::runtime_error("no tensor " + part);
    }
};

// Loading must throw clef::Error whose message contains `needle`; returns the message.
std::string expect_load_error(const std::string& dir, const std::string& needle) {
    try {
        Engine::load(dir);
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "not a clef::Error: " << e.what();
        return e.what();
    }
    ADD_FAILURE() << "loaded without error; wanted: " << needle;
    return "";
}

DecisionRequest simple_request() {
    JsonValue body = parse_json_or_throw(
        R"({"model":"m","state":"hello","questions":{"q":{"type":"noul","instructions":"ok?"}}})", "request");
    DecisionRequest req;
    std::vector<RequestError> errors;
    if (!parse_request(body, req, errors)) throw std::runtime_error("request rejected");
    return req;
}

}  // namespace

TEST(ModelFaults, IntactCopyLoadsAndDecides) {
    ModelCopy m;
    auto engine = Engine::load(m.path());
    Decision d = engine->decide(simple_request());
    ASSERT_EQ(d.probabilities.size(), 1u);
    EXPECT_NEAR(d.probabilities[0][0] + d.probabilities[0][1], 1.0f, 1e-5f);
}

TEST(ModelFaults, MissingFiles) {
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "joint_head.safetensors",
                          "joint_head_config.json"}) {
        ModelCopy m;
        fs::remove(m / f);
        expect_load_error(m.path(), "");
    }
}

TEST(ModelFaults, TruncatedWeights) {
    const std::string full = read_file(kModel / "model.safetensors");
    uint64_t n = 0;
    std::memcpy(&n, full.data(), 8);
    // Inside the length prefix, inside the header, right after it, inside the data, one byte short.
    for (size_t keep :
         {size_t{0}, size_t{5}, size_t{8 + n / 2}, size_t{8 + n}, size_t{8 + n + 100}, full.size() - 1}) {
        ModelCopy m;
        write_file(m / "model.safetensors", full.substr(0, keep));
        expect_load_error(m.path(), "model.safetensors");
    }
    const std::string head = read_file(kModel / "joint_head.safetensors");
    for (size_t keep : {size_t{3}, head.size() / 2, head.size() - 1}) {
        ModelCopy m;
        write_file(m / "joint_head.safetensors", head.substr(0, keep));
        expect_load_error(m.path(), "joint_head.safetensors");
    }
}

TEST(ModelFaults, CorruptedSafetensorsHeaders) {
    const std::function<void(Safetensors&)> faults[] = {
        [](Safetensors& s) { s.tensor("embed").set("dtype", JsonValue::string("Q9")); },
        [](Safetensors& s) {  // offsets past the end
            JsonValue& t = s.tensor("embed");
            t.set("data_offsets",
                  JsonValue::array({JsonValue::integer(0), JsonValue::integer(int64_t{1} << 40)}));
        },
        [](Safetensors& s) {  // offsets reversed
            JsonValue& t = s.tensor("norm");
            const auto& off = t.find("data_offsets")->items();
            t.set("data_offsets", JsonValue::array({off[1], off[0]}));
        },
        [](Safetensors& s) {  // shape that disagrees with the byte count
            JsonValue& t = s.tensor("norm");
            t.set("shape", JsonValue::array({JsonValue::integer(3), JsonValue::integer(1000)}));
        },
        [](Safetensors& s) {  // negative and overflowing dimensions
            s.tensor("embed").set("shape",
                                  JsonValue::array({JsonValue::integer(-1), JsonValue::integer(16)}));
        },
        [](Safetensors& s) {
            s.tensor("embed").set("shape", JsonValue::array({JsonValue::integer(int64_t{1} << 62),
                                                             JsonValue::integer(int64_t{1} << 62)}));
        },
        [](Safetensors& s) { s.tensor("embed").set("shape", JsonValue::string("16x16")); },
        [](Safetensors& s) { s.header = JsonValue::array(); },
    };
    int i = 0;
    for (const auto& fault : faults) {
        SCOPED_TRACE("fault " + std::to_string(i++));
        ModelCopy m;
        Safetensors st = Safetensors::read(m / "model.safetensors");
        fault(st);
        st.write(m / "model.safetensors");
        expect_load_error(m.path(), "model.safetensors");
    }
    {  // a header that is not JSON, and a header length beyond the file
        ModelCopy m;
        std::string bytes = read_file(m / "model.safetensors");
        bytes[10] = '\xff';
        bytes[11] = '{';
        write_file(m / "model.safetensors", bytes);
        expect_load_error(m.path(), "model.safetensors");
        std::string big = bytes;
        uint64_t n = uint64_t{1} << 50;
        std::memcpy(big.data(), &n, 8);
        write_file(m / "model.safetensors", big);
        expect_load_error(m.path(), "model.safetensors");
    }
}

TEST(ModelFaults, WrongShapesAreRefusedAtLoad) {
    // A consistent file (byte count matches the shape) whose shape is not what the config asks for.
    ModelCopy m;
    Safetensors st = Safetensors::read(m / "model.safetensors");
    JsonValue& t = st.tensor("embed");
    const auto& shape = t.find("shape")->items();
    ASSERT_EQ(shape.size(), 2u);
    t.set("shape", JsonValue::array({shape[1], shape[0]}));  // transposed: same bytes, wrong layout
    st.write(m / "model.safetensors");
    expect_load_error(m.path(), "embed_tokens");

    // A missing tensor.
    ModelCopy m2;
    Safetensors st2 = Safetensors::read(m2 / "model.safetensors");
    auto& members = st2.header.members();
    for (auto it = members.begin(); it != members.end(); ++it) {
        if (it->first.find("norm") != std::string::npos) {
            members.erase(it);
            break;
        }
    }
    st2.write(m2 / "model.safetensors");
    expect_load_error(m2.path(), "missing");

    // A config whose width disagrees with the weights.
    ModelCopy m3;
    JsonValue cfg = parse_json_or_throw(read_file(m3 / "config.json"), "config.json");
    JsonValue* text = cfg.find("text_config") ? const_cast<JsonValue*>(cfg.find("text_config")) : &cfg;
    ASSERT_TRUE(text->find("hidden_size"));
    text->set("hidden_size", JsonValue::integer(text->find("hidden_size")->as_int64() * 2));
    write_file(m3 / "config.json", write_json(cfg));
    expect_load_error(m3.path(), "");
}

TEST(ModelFaults, CorruptedConfigAndTokenizer) {
    const std::pair<const char*, std::string> cases[] = {
        {"config.json", "{\"model_type\": "},
        {"config.json", "[]"},
        {"config.json", ""},
        {"joint_head_config.json", "{\"oops\":1}"},
        {"joint_head_config.json", "\xff\xfe"},
        {"tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}"},
        {"tokenizer.json", "{\"model\":{\"type\":\"Unigram\"}}"},
        {"tokenizer.json", "null"},
    };
    for (const auto& [file, content] : cases) {
        SCOPED_TRACE(std::string(file) + ": " + content);
        ModelCopy m;
        write_file(m / file, content);
        expect_load_error(m.path(), "");
    }
    // Truncated tokenizer.json at several points.
    const std::string tok = read_file(kModel / "tokenizer.json");
    for (size_t keep : {size_t{1}, tok.size() / 3, tok.size() - 2}) {
        ModelCopy m;
        write_file(m / "tokenizer.json", tok.substr(0, keep));
        expect_load_error(m.path(), "tokenizer.json");
    }
    // A merge that names tokens missing from the vocabulary, and a negative vocabulary id.
    const std::pair<std::string, std::string> edits[] = {{"\"merges\": [", "\"zzzq qqqz\","},
                                                         {"\"vocab\": {", "\"zzzq\": -5,"}};
    for (const auto& [key, insert] : edits) {
        std::string t = tok;
        size_t at = t.find(key);
        ASSERT_NE(at, std::string::npos) << key;
        t.insert(at + key.size(), insert);
        ModelCopy m;
        write_file(m / "tokenizer.json", t);
        try {
            Tokenizer::from_hf_json((m / "tokenizer.json").string());
            ADD_FAILURE() << "loaded with " << insert;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
        }
    }
}

TEST(ModelFaults, NanWeightsFailTheDecisionClearly) {
    // NaN in the token embeddings reaches every hidden state: the decision must throw clef::Error (the server's
    // 500), not answer with NaN probabilities.
    ModelCopy m;
    Safetensors st = Safetensors::read(m / "model.safetensors");
    std::string name;
    for (const auto& [n, v] : st.header.members())
        if (n.find("embed_tokens.weight") != std::string::npos && n.find("visual") == std::string::npos) name = n;
    ASSERT_FALSE(name.empty());
    const JsonValue& t = *st.header.find(name);
    const std::string dtype = t.find("dtype")->as_string();
    const size_t begin = static_cast<size_t>(t.find("data_offsets")->items()[0].as_int64());
    const size_t end = static_cast<size_t>(t.find("data_offsets")->items()[1].as_int64());
    if (dtype == "F32") {
        const float nan = std::nanf("");
        for (size_t at = begin; at + 4 <= end; at += 4) std::memcpy(&st.data[at], &nan, 4);
    } else {  // BF16 / F16: 0x7fc0 / 0x7e00 are quiet NaNs
        const uint16_t nan = dtype == "BF16" ? 0x7fc0 : 0x7e00;
        for (size_t at = begin; at + 2 <= end; at += 2) std::memcpy(&st.data[at], &nan, 2);
    }
    st.write(m / "model.safetensors");
    std::unique_ptr<Engine> engine;
    try {
        engine = Engine::load(m.path());
    } catch (const Error& e) {
        SUCCEED() << "refused at load: " << e.what();  // a load-time check is just as good
        return;
    }
    try {
        Decision d = engine->decide(simple_request());
        ADD_FAILURE() << "answered with NaN weights: " << write_json(d.response);
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    }
}
