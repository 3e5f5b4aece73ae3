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

class JsonLoader {
public:
    JsonLoader(const std::string& path, Tokenizer::Impl& im) : path_(path), im_(im) {}

    void load() {
        MappedFile file = MappedFile::open(path_);
        const char* begin = reinterpret_cast<const char*>(file.data());
        json root;
        try {
            // model.vocab and model.merges (most of the file) are captured straight into flat vectors instead
            // of being built as a DOM; the rest of the file is small.
            root = json::parse(begin, begin + file.size(),
                               [this](int depth, json::parse_event_t ev, json& parsed) {
                                   return capture(depth, ev, parsed);
                               });
        } catch (const json::exception& e) {
            fail(std::string("not valid JSON: ") + e.what());
        }
        if (!root.is_object()) fail("top level is not a JSON object");
        im_.source = path_;

        const json* model = member(root, "model");
        if (!model || model->is_null()) fail("missing \"model\"");
        if (!model->is_object()) fail("\"model\" is not an object");
        load_model(*model);
        load_added(root);
        load_normalizer(root);
        load_pre_tokenizer(root);
        load_decoder(root);
        // post_processor only adds BOS/EOS or pairs; encode() never adds special tokens, so it is not used.
        im_.finalize(/*added_raw_decode=*/false);
    }

private:
    [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

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
                    if (depth == 2 && in_model_member("vocab", Kind::kObject)) vocab_.clear();
                    if (depth == 2 && in_model_member("merges", Kind::kArray)) merges_.clear();
                }
                return true;
            case E::value:
            case E::object_end:
            case E::array_end:
                if (depth != 3) return true;
                if (in_model_member("vocab", Kind::kObject)) {
                    vocab_.emplace_back(
                        keys_[3], token_id(parsed, [&] { return "model.vocab[\"" + keys_[3] + "\"]"; }));
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
        const size_t index = merges_.size();
        auto where = [&] { return "model.merges[" + std::to_string(index) + "] = " + m.dump(); };
        if (m.is_string()) {
            const std::string& s = m.get_ref<const std::string&>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                fail(where() + " is not of the form \"a b\"");
            merges_.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            merges_.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
            fail(where() + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
    }

    static const json* member(const json& obj, const char* key) {
        auto it = obj.find(key);
        return it == obj.end() ? nullptr : &*it;
    }

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

    void load_model(const json& model) {
        if (const json* t = member(model, "type")) {
            if (!t->is_string()) fail("model.type is not a string");
            const std::string type = t->get<std::string>();
            if (type != "BPE") fail("unsupported model type '" + type + "' (only BPE)");
        } else if (!member(model, "merges")) {
            fail("model has no \"type\" and no \"merges\" (only BPE models are supported)");
        }
        if (const json* d = member(model, "dropout"); d && !d->is_null()) {
            if (!d->is_number()) fail("model.dropout is not a number");
            if (d->get<double>() != 0.0)
                fail("model.dropout = " + d->dump() + " is not supported (only null or 0)");
        }
        for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
            if (const json* v = member(model, key); v && !v->is_null()) {
                if (!v->is_string()) fail(std::string("model.") + key + " is not a string");
                if (!v->get_ref<const std::string&>().empty())
                    fail(std::string("model.") + key + " = " + v->dump() + " is not supported (only empty)");
            }
        }
        im_.ignore_merges = get_bool(model, "ignore_merges", false, "model");

        const json* vocab = member(model, "vocab");
        if (!vocab) fail("model has no \"vocab\"");
        if (!vocab->is_object()) fail("model.vocab is not an object");
        if (!vocab->empty()) fail("model.vocab: unexpected content");  // all captured during parsing
        im_.vocab.reserve(vocab_.size());
        int64_t max_id = -1;
        for (auto& [text, id] : vocab_) {
            im_.vocab[std::move(text)] = id;  // a repeated key keeps its last value, as a JSON object does
            max_id = std::max<int64_t>(max_id, id);
        }
        std::vector<std::pair<std::string, int32_t>>().swap(vocab_);
        im_.kinds.assign(static_cast<size_t>(max_id + 1), TokenKind::kNone);
        im_.id_text.assign(static_cast<size_t>(max_id + 1), std::string());
        for (const auto& [text, id] : im_.vocab) {
            if (im_.kinds[id] != TokenKind::kNone)
                fail("model.vocab: id " + std::to_string(id) + " is used by both \"" + im_.id_text[id] +
                     "\" and \"" + text + "\"");
            im_.kinds[id] = TokenKind::kNormal;
            im_.id_text[id] = text;
        }

        if (const json* unk = member(model, "unk_token"); unk && !unk->is_null()) {
            if (!unk->is_string()) fail("model.unk_token is not a string");
            auto it = im_.vocab.find(unk->get<std::string>());
            if (it == im_.vocab.end()) fail("model.unk_token " + unk->dump() + " is not in the vocabulary");
            im_.unk_id = it->second;
        }

        const json* merges = member(model, "merges");
        if (!merges) fail("model has no \"merges\"");
        if (!merges->is_array()) fail("model.merges is not an array");
        if (!merges->empty()) fail("model.merges: unexpected content");  // all captured during parsing
        im_.merges.reserve(merges_.size());
        std::string merged;
        for (size_t rank = 0; rank < merges_.size(); ++rank) {
            const auto& [a, b] = merges_[rank];
            const int32_t ia = vocab_id(a, rank);
            const int32_t ib = vocab_id(b, rank);
            merged.assign(a);
            merged.append(b);
            const int32_t im = vocab_id(merged, rank, " (merged token)");
            // Hugging Face builds a hash map from the list, so a repeated pair takes its last rank.
            im_.merges.insert(ia, ib, static_cast<uint32_t>(rank), im, /*replace=*/true);
        }
        std::vector<std::pair<std::string, std::string>>().swap(merges_);
    }

    int32_t vocab_id(std::string_view token, size_t rank, const char* what = "") const {
        auto it = im_.vocab.find(token);
        if (it == im_.vocab.end())
            fail("model.merges[" + std::to_string(rank) + "]" + what + ": token \"" + std::string(token) +
                 "\" is not in the vocabulary");
        return it->second;
    }

    void load_added(const json& root) {
        const json* added = member(root, "added_tokens");
        if (!added || added->is_null()) return;
        if (!added->is_array()) fail("\"added_tokens\" is not an array");
        size_t i = 0;
        for (const json& t : *added) {
            const std::string where = "added_tokens[" + std::to_string(i++) + "]";
            if (!t.is_object()) fail(where + " is not an object");
            const json* id = member(t, "id");
            if (!id) fail(where + " has no \"id\"");
            const json* content = member(t, "content");
            if (!content || !content->is_string()) fail(where + ".content is missing or not a string");
            tok::AddedToken a;
            a.id = token_id(*id, [&] { return where + ".id"; });
            a.content = content->get<std::string>();
            if (a.content.empty()) fail(where + ".content is empty");
            const bool special = get_bool(t, "special", false, where);
            a.kind = special ? TokenKind::kSpecial : TokenKind::kUserDefined;
            a.normalized = get_bool(t, "normalized", !special, where);
            a.lstrip = get_bool(t, "lstrip", false, where);
            a.rstrip = get_bool(t, "rstrip", false, where);
            a.single_word = get_bool(t, "single_word", false, where);
            if (static_cast<size_t>(a.id) >= im_.kinds.size()) {
                im_.kinds.resize(static_cast<size_t>(a.id) + 1, TokenKind::kNone);
                im_.id_text.resize(static_cast<size_t>(a.id) + 1);
            }
            im_.kinds[a.id] = a.kind;
            im_.id_text[a.id] = a.content;
            im_.added.push_back(std::move(a));
        }
    }

    // NFC, null/absent, or a Sequence made only of NFC.
    void load_normalizer(const json& root) {
        const json* n = member(root, "normalizer");
        if (!n || n->is_null()) return;
        if (!n->is_object()) fail("\"normalizer\" is not an object");
        const std::string type = type_of(*n, "normalizer");
        if (type == "NFC") {
            im_.nfc = true;
            return;
        }
        if (type == "Sequence") {
            const json* list = member(*n, "normalizers");
            if (!list || !list->is_array()) fail("normalizer.normalizers is missing or not an array");
            for (const json& sub : *list) {
                if (!sub.is_object()) fail("normalizer.normalizers has a non-object entry");
                const std::string st = type_of(sub, "normalizer.normalizers[]");
                if (st != "NFC")
                    fail("unsupported normalizer '" + st + "' in the normalizer Sequence (only NFC)");
                im_.nfc = true;
            }
            return;
        }
        fail("unsupported normalizer '" + type + "' (only NFC, a Sequence of NFC, or null)");
    }

    void check_byte_level(const json& bl, const std::string& where, bool& use_regex) {
        if (get_bool(bl, "add_prefix_space", false, where))
            fail(where + ".add_prefix_space = true is not supported");
        use_regex = get_bool(bl, "use_regex", true, where);
    }

    void set_regex(const std::string& pattern, bool literal, const std::string& where) {
        im_.split_pattern = pattern;
        try {
            im_.regex = std::make_unique<tok::SplitRegex>(pattern, literal);
        } catch (const Error& e) {
            fail(where + ": " + e.what());
        }
    }

    void load_split(const json& split, const std::string& where) {
        const json* behavior = member(split, "behavior");
        if (!behavior || !behavior->is_string()) fail(where + ".behavior is missing or not a string");
        if (behavior->get<std::string>() != "Isolated")
            fail(where + ".behavior '" + behavior->get<std::string>() + "' is not supported (only Isolated)");
        if (get_bool(split, "invert", false, where)) fail(where + ".invert = true is not supported");
        const json* pattern = member(split, "pattern");
        if (!pattern || !pattern->is_object()) fail(where + ".pattern is missing or not an object");
        if (const json* re = member(*pattern, "Regex"); re && re->is_string()) {
            set_regex(re->get<std::string>(), false, where + ".pattern.Regex");
        } else if (const json* lit = member(*pattern, "String"); lit && lit->is_string()) {
            if (lit->get_ref<const std::string&>().empty()) fail(where + ".pattern.String is empty");
            set_regex(lit->get<std::string>(), true, where + ".pattern.String");
        } else {
            fail(where + ".pattern has neither a \"Regex\" nor a \"String\"");
        }
    }

    void load_pre_tokenizer(const json& root) {
        const json* p = member(root, "pre_tokenizer");
        if (!p || p->is_null()) fail("no pre_tokenizer: a byte-level BPE needs a ByteLevel pre-tokenizer");
        if (!p->is_object()) fail("\"pre_tokenizer\" is not an object");
        const std::string type = type_of(*p, "pre_tokenizer");
        if (type == "ByteLevel") {
            bool use_regex = true;
            check_byte_level(*p, "pre_tokenizer", use_regex);
            if (use_regex) set_regex(tok::kGpt2Pattern, false, "pre_tokenizer");
            return;
        }
        if (type != "Sequence")
            fail("unsupported pre_tokenizer '" + type + "' (only ByteLevel or Sequence[Split, ByteLevel])");
        const json* list = member(*p, "pretokenizers");
        if (!list || !list->is_array()) fail("pre_tokenizer.pretokenizers is missing or not an array");
        bool have_split = false, have_byte_level = false;
        for (size_t i = 0; i < list->size(); ++i) {
            const json& sub = (*list)[i];
            const std::string where = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
            if (!sub.is_object()) fail(where + " is not an object");
            const std::string st = type_of(sub, where);
            if (st == "Split") {
                if (have_split || have_byte_level)
                    fail(where + ": only one Split, before the ByteLevel, is supported");
                load_split(sub, where);
                have_split = true;
            } else if (st == "ByteLevel") {
                if (have_byte_level) fail(where + ": a second ByteLevel is not supported");
                bool use_regex = true;
                check_byte_level(sub, where, use_regex);
                if (use_regex) {
                    if (have_split)
                        fail(where + ": ByteLevel with use_regex=true after a Split is not supported");
                    set_regex(tok::kGpt2Pattern, false, where);
                }
                have_byte_level = true;
            } else {
                fail(where + ": unsupported pre-tokenizer '" + st + "' (only Split and ByteLevel)");
            }
        }
        if (!have_byte_level) fail("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    }

    void load_decoder(const json& root) {
        const json* d = member(root, "decoder");
        if (!d || d->is_null()) return;
        if (!d->is_object()) fail("\"decoder\" is not an object");
        const std::string type = type_of(*d, "decoder");
        if (type != "ByteLevel") fail("unsupported decoder '" + type + "' (only ByteLevel)");
    }

    const std::string& path_;
    Tokenizer::Impl& im_;
    std::array<std::string, kTrackedDepth> keys_;
    std::array<Kind, kTrackedDepth> kinds_{};
    std::vector<std::pair<std::string, int32_t>> vocab_;
    std::vector<std::pair<std::string, std::string>> merges_;
};

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
    auto im = std::make_shared<Impl>();
    JsonLoader(path, *im).load();
    return Tokenizer(std::move(im));
}

}  // namespace clef
