// Loading a Hugging Face tokenizer.json (byte-level BPE only).
#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"
#include "util/error.h"
#include "util/mmap.h"

namespace clef {

namespace {

using nlohmann::json;

constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;  // bounds the per-id tables a lying file can request

const json* member(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

// Typed reads of tokenizer.json values; every failure is an Error that names the file.
struct JsonChecks {
    const std::string& path;

    [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + what); }

    bool get_bool(const json& obj, const char* key, bool fallback, const std::string& where) const {
        const json* v = member(obj, key);
        if (!v || v->is_null()) return fallback;
        if (!v->is_boolean()) fail(where + "." + key + " is not a boolean");
        return v->get<bool>();
    }

    std::string type_of(const json& obj, const std::string& where) const {
        const json* t = member(obj, "type");
        if (!t) fail(where + " has no \"type\"");
        if (!t->is_string()) fail(where + ".type is not a string");
        return t->get<std::string>();
    }

    // An id in 0..kMaxTokenId; `where` (a callable returning the location text) is only used for errors.
    template <class Where>
    int32_t token_id(const json& v, Where&& where) const {
        if (v.is_number_unsigned()) {
            const uint64_t u = v.get<uint64_t>();
            if (u <= static_cast<uint64_t>(kMaxTokenId)) return static_cast<int32_t>(u);
        } else if (v.is_number_integer()) {
            const int64_t i = v.get<int64_t>();
            if (i >= 0 && i <= kMaxTokenId) return static_cast<int32_t>(i);
        } else {
            fail(where() + " = " + v.dump() + " is not an integer id");
        }
        fail(where() + " = " + v.dump() + " is out of range (0.." + std::to_string(kMaxTokenId) + ")");
    }
};

// -----------------------------------------------------------------------------------------------------------
// Parsing: model.vocab and model.merges (most of the file) are captured straight into flat vectors
// instead of being built as a DOM; the rest of the file is small.

class ModelCapture {
public:
    explicit ModelCapture(const JsonChecks& ck) : ck_(ck) {}

    // The document without the members of model.vocab and the entries of model.merges.
    json parse(const char* begin, const char* end) {
        try {
            return json::parse(begin, end, [this](int depth, json::parse_event_t ev, json& parsed) {
                return capture(depth, ev, parsed);
            });
        } catch (const json::exception& e) {
            ck_.fail(std::string("not valid JSON: ") + e.what());
        }
    }

    std::vector<std::pair<std::string, int32_t>> vocab;       // in file order
    std::vector<std::pair<std::string, std::string>> merges;  // in file order (= rank)

private:
    enum class Kind : uint8_t { kNone, kObject, kArray };
    static constexpr int kTrackedDepth = 4;

    bool in_model_member(const char* name, Kind kind) const {
        return kinds_[0] == Kind::kObject && kinds_[1] == Kind::kObject && keys_[1] == "model" &&
               keys_[2] == name && kinds_[2] == kind;
    }

    // parse callback: returns false to drop the value from the DOM.
    bool capture(int depth, json::parse_event_t ev, json& parsed) {
        using E = json::parse_event_t;
        switch (ev) {
            case E::key:
                if (depth < kTrackedDepth) keys_[depth] = parsed.get_ref<const std::string&>();
                // Dropping the key drops the member; the value event still reaches us below.
                return !(depth == 3 && in_model_member("vocab", Kind::kObject));
            case E::object_start:
            case E::array_start:
                if (depth < kTrackedDepth) {
                    kinds_[depth] = ev == E::object_start ? Kind::kObject : Kind::kArray;
                    for (int d = depth + 1; d < kTrackedDepth; ++d) kinds_[d] = Kind::kNone;
                    if (depth == 2 && in_model_member("vocab", Kind::kObject)) vocab.clear();
                    if (depth == 2 && in_model_member("merges", Kind::kArray)) merges.clear();
                }
                return true;
            case E::value:
            case E::object_end:
            case E::array_end:
                if (depth != 3) return true;
                if (in_model_member("vocab", Kind::kObject)) {
                    vocab.emplace_back(
                        keys_[3], ck_.token_id(parsed, [&] { return "model.vocab[\"" + keys_[3] + "\"]"; }));
                    return false;
                }
                if (in_model_member("merges", Kind::kArray)) {
                    add_merge(parsed);
                    return false;
                }
                return true;
        }
        return true;
    }

    void add_merge(const json& m) {
        const size_t index = merges.size();
        auto where = [&] { return "model.merges[" + std::to_string(index) + "] = " + m.dump(); };
        if (m.is_string()) {
            const std::string& s = m.get_ref<const std::string&>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                ck_.fail(where() + " is not of the form \"a b\"");
            merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
            ck_.fail(where() + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
    }

    const JsonChecks& ck_;
    std::array<std::string, kTrackedDepth> keys_;
    std::array<Kind, kTrackedDepth> kinds_{};
};

// -----------------------------------------------------------------------------------------------------------
// "model": a BPE with its vocabulary and merges.

// type, dropout, continuing_subword_prefix and end_of_word_suffix allow only plain BPE; ignore_merges is
// read.
void load_model_options(const JsonChecks& ck, const json& model, Tokenizer::Impl& im) {
    if (const json* t = member(model, "type")) {
        if (!t->is_string()) ck.fail("model.type is not a string");
        const std::string type = t->get<std::string>();
        if (type != "BPE") ck.fail("unsupported model type '" + type + "' (only BPE)");
    } else if (!member(model, "merges")) {
        ck.fail("model has no \"type\" and no \"merges\" (only BPE models are supported)");
    }
    if (const json* d = member(model, "dropout"); d && !d->is_null()) {
        if (!d->is_number()) ck.fail("model.dropout is not a number");
        if (d->get<double>() != 0.0)
            ck.fail("model.dropout = " + d->dump() + " is not supported (only null or 0)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (const json* v = member(model, key); v && !v->is_null()) {
            if (!v->is_string()) ck.fail(std::string("model.") + key + " is not a string");
            if (!v->get_ref<const std::string&>().empty())
                ck.fail(std::string("model.") + key + " = " + v->dump() + " is not supported (only empty)");
        }
    }
    im.ignore_merges = ck.get_bool(model, "ignore_merges", false, "model");
}

// model.vocab from the captured pairs (released afterwards), and the per-id tables.
void load_vocab(const JsonChecks& ck, const json& model,
                std::vector<std::pair<std::string, int32_t>>& captured, Tokenizer::Impl& im) {
    const json* vocab = member(model, "vocab");
    if (!vocab) ck.fail("model has no \"vocab\"");
    if (!vocab->is_object()) ck.fail("model.vocab is not an object");
    if (!vocab->empty()) ck.fail("model.vocab: unexpected content");  // all captured during parsing
    im.vocab.reserve(captured.size());
    int64_t max_id = -1;
    for (auto& [text, id] : captured) {
        im.vocab[std::move(text)] = id;  // a repeated key keeps its last value, as a JSON object does
        max_id = std::max<int64_t>(max_id, id);
    }
    std::vector<std::pair<std::string, int32_t>>().swap(captured);
    im.kinds.assign(static_cast<size_t>(max_id + 1), TokenKind::kNone);
    im.id_text.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [text, id] : im.vocab) {
        if (im.kinds[id] != TokenKind::kNone)
            ck.fail("model.vocab: id " + std::to_string(id) + " is used by both \"" + im.id_text[id] +
                    "\" and \"" + text + "\"");
        im.kinds[id] = TokenKind::kNormal;
        im.id_text[id] = text;
    }
}

void load_unk_token(const JsonChecks& ck, const json& model, Tokenizer::Impl& im) {
    if (const json* unk = member(model, "unk_token"); unk && !unk->is_null()) {
        if (!unk->is_string()) ck.fail("model.unk_token is not a string");
        auto it = im.vocab.find(unk->get<std::string>());
        if (it == im.vocab.end()) ck.fail("model.unk_token " + unk->dump() + " is not in the vocabulary");
        im.unk_id = it->second;
    }
}

int32_t merge_token_id(const JsonChecks& ck, const Tokenizer::Impl& im, std::string_view token, size_t rank,
                       const char* what = "") {
    auto it = im.vocab.find(token);
    if (it == im.vocab.end())
        ck.fail("model.merges[" + std::to_string(rank) + "]" + what + ": token \"" + std::string(token) +
                "\" is not in the vocabulary");
    return it->second;
}

// model.merges from the captured pairs (released afterwards); every token must be in the vocabulary.
void load_merges(const JsonChecks& ck, const json& model,
                 std::vector<std::pair<std::string, std::string>>& captured, Tokenizer::Impl& im) {
    const json* merges = member(model, "merges");
    if (!merges) ck.fail("model has no \"merges\"");
    if (!merges->is_array()) ck.fail("model.merges is not an array");
    if (!merges->empty()) ck.fail("model.merges: unexpected content");  // all captured during parsing
    im.merges.reserve(captured.size());
    std::string merged;
    for (size_t rank = 0; rank < captured.size(); ++rank) {
        const auto& [a, b] = captured[rank];
        const int32_t ia = merge_token_id(ck, im, a, rank);
        const int32_t ib = merge_token_id(ck, im, b, rank);
        merged.assign(a);
        merged.append(b);
        const int32_t id = merge_token_id(ck, im, merged, rank, " (merged token)");
        // Hugging Face builds a hash map from the list, so a repeated pair takes its last rank.
        im.merges.insert(ia, ib, static_cast<uint32_t>(rank), id, /*replace=*/true);
    }
    std::vector<std::pair<std::string, std::string>>().swap(captured);
}

void load_model(const JsonChecks& ck, const json& root, ModelCapture& captured, Tokenizer::Impl& im) {
    const json* model = member(root, "model");
    if (!model || model->is_null()) ck.fail("missing \"model\"");
    if (!model->is_object()) ck.fail("\"model\" is not an object");
    load_model_options(ck, *model, im);
    load_vocab(ck, *model, captured.vocab, im);
    load_unk_token(ck, *model, im);
    load_merges(ck, *model, captured.merges, im);
}

// -----------------------------------------------------------------------------------------------------------
// "added_tokens"

tok::AddedToken parse_added_token(const JsonChecks& ck, const json& t, const std::string& where) {
    if (!t.is_object()) ck.fail(where + " is not an object");
    const json* id = member(t, "id");
    if (!id) ck.fail(where + " has no \"id\"");
    const json* content = member(t, "content");
    if (!content || !content->is_string()) ck.fail(where + ".content is missing or not a string");
    tok::AddedToken a;
    a.id = ck.token_id(*id, [&] { return where + ".id"; });
    a.content = content->get<std::string>();
    if (a.content.empty()) ck.fail(where + ".content is empty");
    const bool special = ck.get_bool(t, "special", false, where);
    a.kind = special ? TokenKind::kSpecial : TokenKind::kUserDefined;
    a.normalized = ck.get_bool(t, "normalized", !special, where);
    a.lstrip = ck.get_bool(t, "lstrip", false, where);
    a.rstrip = ck.get_bool(t, "rstrip", false, where);
    a.single_word = ck.get_bool(t, "single_word", false, where);
    return a;
}

void load_added_tokens(const JsonChecks& ck, const json& root, Tokenizer::Impl& im) {
    const json* added = member(root, "added_tokens");
    if (!added || added->is_null()) return;
    if (!added->is_array()) ck.fail("\"added_tokens\" is not an array");
    size_t i = 0;
    for (const json& t : *added) {
        tok::AddedToken a = parse_added_token(ck, t, "added_tokens[" + std::to_string(i++) + "]");
        if (static_cast<size_t>(a.id) >= im.kinds.size()) {
            im.kinds.resize(static_cast<size_t>(a.id) + 1, TokenKind::kNone);
            im.id_text.resize(static_cast<size_t>(a.id) + 1);
        }
        im.kinds[a.id] = a.kind;
        im.id_text[a.id] = a.content;
        im.added.push_back(std::move(a));
    }
}

// -----------------------------------------------------------------------------------------------------------
// "normalizer": NFC, null/absent, or a Sequence made only of NFC.

void load_normalizer(const JsonChecks& ck, const json& root, Tokenizer::Impl& im) {
    const json* n = member(root, "normalizer");
    if (!n || n->is_null()) return;
    if (!n->is_object()) ck.fail("\"normalizer\" is not an object");
    const std::string type = ck.type_of(*n, "normalizer");
    if (type == "NFC") {
        im.nfc = true;
        return;
    }
    if (type == "Sequence") {
        const json* list = member(*n, "normalizers");
        if (!list || !list->is_array()) ck.fail("normalizer.normalizers is missing or not an array");
        for (const json& sub : *list) {
            if (!sub.is_object()) ck.fail("normalizer.normalizers has a non-object entry");
            const std::string st = ck.type_of(sub, "normalizer.normalizers[]");
            if (st != "NFC")
                ck.fail("unsupported normalizer '" + st + "' in the normalizer Sequence (only NFC)");
            im.nfc = true;
        }
        return;
    }
    ck.fail("unsupported normalizer '" + type + "' (only NFC, a Sequence of NFC, or null)");
}

// -----------------------------------------------------------------------------------------------------------
// "pre_tokenizer": ByteLevel, or a Sequence of an optional Split and a ByteLevel.

// A ByteLevel step's use_regex (add_prefix_space must be false).
bool byte_level_uses_regex(const JsonChecks& ck, const json& bl, const std::string& where) {
    if (ck.get_bool(bl, "add_prefix_space", false, where))
        ck.fail(where + ".add_prefix_space = true is not supported");
    return ck.get_bool(bl, "use_regex", true, where);
}

void set_regex(const JsonChecks& ck, Tokenizer::Impl& im, const std::string& pattern, bool literal,
               const std::string& where) {
    im.split_pattern = pattern;
    try {
        im.regex = std::make_unique<tok::SplitRegex>(pattern, literal);
    } catch (const Error& e) {
        ck.fail(where + ": " + e.what());
    }
}

void load_split(const JsonChecks& ck, const json& split, const std::string& where, Tokenizer::Impl& im) {
    const json* behavior = member(split, "behavior");
    if (!behavior || !behavior->is_string()) ck.fail(where + ".behavior is missing or not a string");
    if (behavior->get<std::string>() != "Isolated")
        ck.fail(where + ".behavior '" + behavior->get<std::string>() + "' is not supported (only Isolated)");
    if (ck.get_bool(split, "invert", false, where)) ck.fail(where + ".invert = true is not supported");
    const json* pattern = member(split, "pattern");
    if (!pattern || !pattern->is_object()) ck.fail(where + ".pattern is missing or not an object");
    if (const json* re = member(*pattern, "Regex"); re && re->is_string()) {
        set_regex(ck, im, re->get<std::string>(), false, where + ".pattern.Regex");
    } else if (const json* lit = member(*pattern, "String"); lit && lit->is_string()) {
        if (lit->get_ref<const std::string&>().empty()) ck.fail(where + ".pattern.String is empty");
        set_regex(ck, im, lit->get<std::string>(), true, where + ".pattern.String");
    } else {
        ck.fail(where + ".pattern has neither a \"Regex\" nor a \"String\"");
    }
}

void load_pre_tokenizer_sequence(const JsonChecks& ck, const json& p, Tokenizer::Impl& im) {
    const json* list = member(p, "pretokenizers");
    if (!list || !list->is_array()) ck.fail("pre_tokenizer.pretokenizers is missing or not an array");
    bool have_split = false, have_byte_level = false;
    for (size_t i = 0; i < list->size(); ++i) {
        const json& sub = (*list)[i];
        const std::string where = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
        if (!sub.is_object()) ck.fail(where + " is not an object");
        const std::string st = ck.type_of(sub, where);
        if (st == "Split") {
            if (have_split || have_byte_level)
                ck.fail(where + ": only one Split, before the ByteLevel, is supported");
            load_split(ck, sub, where, im);
            have_split = true;
        } else if (st == "ByteLevel") {
            if (have_byte_level) ck.fail(where + ": a second ByteLevel is not supported");
            if (byte_level_uses_regex(ck, sub, where)) {
                if (have_split)
                    ck.fail(where + ": ByteLevel with use_regex=true after a Split is not supported");
                set_regex(ck, im, tok::kGpt2Pattern, false, where);
            }
            have_byte_level = true;
        } else {
            ck.fail(where + ": unsupported pre-tokenizer '" + st + "' (only Split and ByteLevel)");
        }
    }
    if (!have_byte_level) ck.fail("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
}

void load_pre_tokenizer(const JsonChecks& ck, const json& root, Tokenizer::Impl& im) {
    const json* p = member(root, "pre_tokenizer");
    if (!p || p->is_null()) ck.fail("no pre_tokenizer: a byte-level BPE needs a ByteLevel pre-tokenizer");
    if (!p->is_object()) ck.fail("\"pre_tokenizer\" is not an object");
    const std::string type = ck.type_of(*p, "pre_tokenizer");
    if (type == "ByteLevel") {
        if (byte_level_uses_regex(ck, *p, "pre_tokenizer"))
            set_regex(ck, im, tok::kGpt2Pattern, false, "pre_tokenizer");
        return;
    }
    if (type != "Sequence")
        ck.fail("unsupported pre_tokenizer '" + type + "' (only ByteLevel or Sequence[Split, ByteLevel])");
    load_pre_tokenizer_sequence(ck, *p, im);
}

// -----------------------------------------------------------------------------------------------------------
// "decoder": ByteLevel or null/absent.

void load_decoder(const JsonChecks& ck, const json& root) {
    const json* d = member(root, "decoder");
    if (!d || d->is_null()) return;
    if (!d->is_object()) ck.fail("\"decoder\" is not an object");
    const std::string type = ck.type_of(*d, "decoder");
    if (type != "ByteLevel") ck.fail("unsupported decoder '" + type + "' (only ByteLevel)");
}

// -----------------------------------------------------------------------------------------------------------
// The whole file

void load_hf_json(const std::string& path, Tokenizer::Impl& im) {
    const JsonChecks ck{path};
    MappedFile file = MappedFile::open(path);
    const char* begin = reinterpret_cast<const char*>(file.data());
    ModelCapture captured(ck);
    const json root = captured.parse(begin, begin + file.size());
    if (!root.is_object()) ck.fail("top level is not a JSON object");
    im.source = path;

    load_model(ck, root, captured, im);
    load_added_tokens(ck, root, im);
    load_normalizer(ck, root, im);
    load_pre_tokenizer(ck, root, im);
    load_decoder(ck, root);
    // post_processor only adds BOS/EOS or pairs; encode() never adds special tokens, so it is not used.
    im.finalize(/*added_raw_decode=*/false);
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
    auto im = std::make_shared<Impl>();
    load_hf_json(path, *im);
    return Tokenizer(std::move(im));
}

}  // namespace clef
