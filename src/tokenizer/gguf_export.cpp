// Writing a Hugging Face tokenizer.json as GGUF tokenizer.ggml.* metadata, in the form load_gguf.cpp reads.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "tokenizer/gguf_vocab.h"
#include "util/error.h"

namespace clef {

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
    try {
        std::ifstream in(path);
        return json::parse(in);
    } catch (const std::exception& e) {
        throw Error(path + ": " + e.what());
    }
}

// One text and one token type per id.
struct GgufVocab {
    std::vector<std::string> tokens;
    std::vector<GgufTokenType> types;

    void set(int id, std::string text, GgufTokenType type, const std::string& path, const char* what) {
        if (id < 0 || static_cast<size_t>(id) >= tokens.size())
            throw Error(path + ": " + what + " id " + std::to_string(id) + " outside the vocabulary");
        tokens[static_cast<size_t>(id)] = std::move(text);
        types[static_cast<size_t>(id)] = type;
    }
    int32_t id_of(const std::string& text) const {  // the first id with this text, -1 if none
        auto it = std::find(tokens.begin(), tokens.end(), text);
        return it == tokens.end() ? -1 : static_cast<int32_t>(it - tokens.begin());
    }
};

// The BPE vocabulary, then the added tokens over it, then "[PAD<id>]" for every id still without a token.
GgufVocab collect_vocab(const json& j, const json& model, const std::string& path, int vocab_size) {
    GgufVocab v;
    v.tokens.resize(static_cast<size_t>(vocab_size));
    v.types.resize(static_cast<size_t>(vocab_size), GgufTokenType::kUndefined);
    const json& vocab = model.at("vocab");
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
        v.set(it.value().get<int>(), it.key(), GgufTokenType::kNormal, path, "token");
    if (j.contains("added_tokens"))
        for (const json& a : j["added_tokens"]) {
            const GgufTokenType type =
                a.value("special", false) ? GgufTokenType::kControl : GgufTokenType::kUserDefined;
            v.set(a.at("id").get<int>(), a.at("content").get<std::string>(), type, path, "added token");
        }
    for (size_t i = 0; i < v.types.size(); ++i)
        if (v.types[i] == GgufTokenType::kUndefined) {
            v.tokens[i] = "[PAD" + std::to_string(i) + "]";
            v.types[i] = GgufTokenType::kUnused;
        }
    return v;
}

// Merges as "a b", whether tokenizer.json lists them as strings or as pairs.
std::vector<std::string> collect_merges(const json& model) {
    std::vector<std::string> merges;
    for (const json& m : model.at("merges")) {
        if (m.is_string())
            merges.push_back(m.get<std::string>());
        else
            merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    }
    return merges;
}

}  // namespace

void write_gguf_tokenizer(GgufWriter& w, const std::string& tokenizer_json_path, int vocab_size) {
    const std::string& path = tokenizer_json_path;
    const json j = read_json(path);
    const json& model = j.at("model");
    if (model.value("type", "") != "BPE") throw Error(path + ": only BPE tokenizers can be converted");
    const GgufVocab v = collect_vocab(j, model, path, vocab_size);
    const std::vector<std::string> merges = collect_merges(model);

    std::vector<int32_t> types(v.types.size());
    std::transform(v.types.begin(), v.types.end(), types.begin(),
                   [](GgufTokenType t) { return static_cast<int32_t>(t); });
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen35");
    w.add_string_array("tokenizer.ggml.tokens", v.tokens);
    w.add_int32_array("tokenizer.ggml.token_type", types);
    w.add_string_array("tokenizer.ggml.merges", merges);
    if (const int32_t eos = v.id_of("<|im_end|>"); eos >= 0) w.add_uint32("tokenizer.ggml.eos_token_id", eos);
    if (const int32_t pad = v.id_of("<|endoftext|>"); pad >= 0)
        w.add_uint32("tokenizer.ggml.padding_token_id", pad);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
}

}  // namespace clef
