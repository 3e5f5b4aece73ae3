#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <optional>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"
#include "util/error.h"

namespace clef {

namespace tok {

// ---------------------------------------------------------------------------------------------------------
// AddedMatcher

void AddedMatcher::add(const AddedToken& token, std::string pattern) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (unsigned char b : pattern) {
        int32_t next = child(node, b);
        if (next < 0) {
            next = static_cast<int32_t>(nodes_.size());
            nodes_[node].edges.emplace_back(b, next);
            nodes_.emplace_back();
        }
        node = next;
    }
    first_[static_cast<unsigned char>(pattern[0])] = true;
    if (nodes_[node].token >= 0) return;  // same text twice: the first one wins
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
}

namespace {

// Start of the code point that ends at `end` in s (bytes possibly ill-formed); end itself when none is valid.
size_t char_start_before(const unsigned char* s, size_t lo, size_t end) {
    for (size_t len = 1; len <= 4 && len <= end - lo; ++len) {
        size_t bad = 0;
        if (utf8_sequence(s + end - len, len, bad) == len) return end - len;
    }
    return end;
}

}  // namespace

bool AddedMatcher::find(std::string_view text, size_t from, const EncodeOptions& options, Match& m) const {
    if (tokens_.empty()) return false;
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t pos = from;
    while (pos < n) {
        if (!first_[s[pos]]) {
            ++pos;
            continue;
        }
        int32_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t k = pos; k < n; ++k) {
            node = child(node, s[k]);
            if (node < 0) break;
            const int32_t t = nodes_[node].token;
            if (t >= 0) {
                const TokenKind kind = tokens_[t].kind;
                const bool allowed =
                    kind == TokenKind::kSpecial ? options.parse_special : options.parse_user_defined;
                if (allowed) {
                    best = t;
                    best_end = k + 1;
                }
            }
        }
        if (best < 0) {
            ++pos;
            continue;
        }
        const AddedToken& tk = tokens_[best];
        if (tk.single_word) {
            bool ok = true;
            if (pos > 0) {
                const size_t st = char_start_before(s, 0, pos);
                size_t bad = 0;
                if (st < pos && utf8_sequence(s + st, pos - st, bad) == pos - st)
                    ok = !is_word_char(utf8_decode(s + st, pos - st));
            }
            if (ok && best_end < n) {
                size_t bad = 0;
                const size_t len = utf8_sequence(s + best_end, n - best_end, bad);
                if (len) ok = !is_word_char(utf8_decode(s + best_end, len));
            }
            if (!ok) {  // like a rejected Aho-Corasick match: the search resumes after it
                pos = best_end;
                continue;
            }
        }
        size_t begin = pos, end = best_end;
        if (tk.lstrip) {
            while (begin > from) {
                const size_t st = char_start_before(s, from, begin);
                if (st == begin || !is_white_space(utf8_decode(s + st, begin - st))) break;
                begin = st;
            }
        }
        if (tk.rstrip) {
            while (end < n) {
                size_t bad = 0;
                const size_t len = utf8_sequence(s + end, n - end, bad);
                if (!len || !is_white_space(utf8_decode(s + end, len))) break;
                end += len;
            }
        }
        m = Match{begin, end, tk.id};
        return true;
    }
    return false;
}

}  // namespace tok

// ---------------------------------------------------------------------------------------------------------
// Impl::finalize

void Tokenizer::Impl::finalize(bool added_raw_decode) {
    const size_t n = kinds.size();
    for (const auto& a : added) added_ids.emplace(a.content, a.id);

    std::vector<bool> raw_added(n, false);
    if (added_raw_decode)
        for (const auto& a : added) raw_added[a.id] = true;
    dec_off.assign(n + 1, 0);
    dec_bytes.clear();
    std::string tmp;
    for (size_t id = 0; id < n; ++id) {
        dec_off[id] = static_cast<uint32_t>(dec_bytes.size());
        const std::string& t = id_text[id];
        if (kinds[id] == TokenKind::kNone) continue;
        tmp.clear();
        if (raw_added[id] || !tok::byte_level_decode(t, tmp)) {
            dec_bytes.append(t);  // outside the byte-level alphabet: the token's own UTF-8 (as HF does)
        } else {
            dec_bytes.append(tmp);
        }
    }
    dec_off[n] = static_cast<uint32_t>(dec_bytes.size());

    for (int b = 0; b < 256; ++b) {
        auto it = vocab.find(tok::byte_level_char(static_cast<uint8_t>(b)));
        byte_ids[b] = it == vocab.end() ? -1 : it->second;
    }
    if (ignore_merges) {
        for (const auto& [text, id] : vocab) {
            std::string raw;
            if (tok::byte_level_decode(text, raw)) raw_vocab.emplace(std::move(raw), id);
        }
    }
    for (const auto& a : added) {
        if (a.normalized) {
            std::string pat;
            if (nfc && tok::is_valid_utf8(a.content))
                tok::nfc_append(a.content, pat);
            else
                pat = a.content;
            norm_matcher.add(a, std::move(pat));
        } else {
            raw_matcher.add(a, a.content);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Encoding

namespace {

class Encoder {
public:
    Encoder(const Tokenizer::Impl& im, const EncodeOptions& opt, std::vector<int32_t>& out)
        : im_(im), opt_(opt), out_(out) {}

    void run(std::string_view text) {
        size_t pos = 0;
        tok::AddedMatcher::Match m{};
        while (pos < text.size()) {
            const bool found = im_.raw_matcher.find(text, pos, opt_, m);
            const size_t seg_end = found ? m.begin : text.size();
            if (seg_end > pos) segment(text.substr(pos, seg_end - pos));
            if (!found) break;
            out_.push_back(m.id);
            pos = m.end;
        }
    }

private:
    // A piece between added tokens: valid runs go through NFC + regex; ill-formed runs are their own
    // pre-token.
    void segment(std::string_view piece) {
        const auto* s = reinterpret_cast<const unsigned char*>(piece.data());
        const size_t n = piece.size();
        size_t i = 0;
        while (i < n) {
            size_t j = i;
            size_t bad = 0;
            while (j < n) {
                if (j + 8 <= n) {  // eight ASCII bytes at once
                    uint64_t w;
                    std::memcpy(&w, s + j, 8);
                    if ((w & 0x8080808080808080ull) == 0) {
                        j += 8;
                        continue;
                    }
                }
                if (s[j] < 0x80) {
                    ++j;
                    continue;
                }
                const size_t len = tok::utf8_sequence(s + j, n - j, bad);
                if (!len) break;
                j += len;
            }
            if (j > i) valid_run(piece.substr(i, j - i));
            if (j >= n) break;
            size_t k = j;
            while (k < n) {
                size_t b2 = 0;
                if (s[k] < 0x80 || tok::utf8_sequence(s + k, n - k, b2) != 0) break;
                k += b2;
            }
            word(piece.substr(j, k - j));
            i = k;
        }
    }

    void valid_run(std::string_view run) {
        std::string_view t = run;
        if (opt_.normalize && im_.nfc && tok::nfc_if_needed(run, nfc_buf_)) t = nfc_buf_;
        if (im_.norm_matcher.empty()) {
            pretokenize(t);
            return;
        }
        size_t pos = 0;
        tok::AddedMatcher::Match m{};
        while (pos < t.size()) {
            const bool found = im_.norm_matcher.find(t, pos, opt_, m);
            const size_t seg_end = found ? m.begin : t.size();
            if (seg_end > pos) pretokenize(t.substr(pos, seg_end - pos));
            if (!found) break;
            out_.push_back(m.id);
            pos = m.end;
        }
    }

    void pretokenize(std::string_view t) {
        if (!im_.regex) {
            word(t);
            return;
        }
        if (!matcher_) matcher_.emplace(*im_.regex);
        pieces_.clear();
        matcher_->split(t, pieces_);
        for (const tok::Piece& p : pieces_) word(t.substr(p.begin, p.len));
    }

    void word(std::string_view w) {
        if (w.empty()) return;
        const bool cacheable = w.size() <= tok::WordCache::kMaxKeyLen;
        size_t h = 0;
        if (cacheable) {
            h = std::hash<std::string_view>{}(w);
            if (im_.cache.lookup(w, h, out_)) return;
        }
        const size_t before = out_.size();
        bool done = false;
        if (im_.ignore_merges) {
            auto it = im_.raw_vocab.find(w);
            if (it != im_.raw_vocab.end()) {
                out_.push_back(it->second);
                done = true;
            }
        }
        if (!done) {
            syms_.clear();
            for (unsigned char b : w) {
                const int32_t id = im_.byte_ids[b];
                if (id >= 0)
                    syms_.push_back(id);
                else if (im_.unk_id >= 0)
                    syms_.push_back(im_.unk_id);
                // else: dropped, as Hugging Face BPE does for a character missing from the vocab without unk
            }
            tok::bpe_merge(syms_.data(), syms_.size(), im_.merges, bpe_, out_);
        }
        if (cacheable) im_.cache.insert(w, h, out_.data() + before, out_.size() - before);
    }

    const Tokenizer::Impl& im_;
    const EncodeOptions& opt_;
    std::vector<int32_t>& out_;
    std::optional<tok::SplitRegex::Matcher> matcher_;
    std::vector<tok::Piece> pieces_;
    std::vector<int32_t> syms_;
    std::string nfc_buf_;
    tok::BpeScratch bpe_;
};

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    return encode(text, EncodeOptions{});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    encode(text, options, out);
    return out;
}

void Tokenizer::encode(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const {
    Encoder(*impl_, options, out).run(text);
}

// ---------------------------------------------------------------------------------------------------------
// Decoding and lookups

std::string Tokenizer::decode_bytes(const std::vector<int32_t>& ids) const {
    const Impl& im = *impl_;
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= im.kinds.size() || im.kinds[id] == TokenKind::kNone)
            throw Error("cannot decode token id " + std::to_string(id) + ": no such token (vocabulary size " +
                        std::to_string(im.kinds.size()) + ")");
        out.append(im.dec_bytes, im.dec_off[id], im.dec_off[id + 1] - im.dec_off[id]);
    }
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    return tok::utf8_lossy(decode_bytes(ids));
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
    if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
    if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
    return -1;
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_text.size()) return {};
    return impl_->id_text[id];
}

TokenKind Tokenizer::token_kind(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->kinds.size()) return TokenKind::kNone;
    return impl_->kinds[id];
}

size_t Tokenizer::vocab_size() const {
    return impl_->kinds.size();
}
void Tokenizer::clear_cache() const {
    impl_->cache.clear();
}
bool Tokenizer::has_normalizer() const {
    return impl_->nfc;
}
const std::string& Tokenizer::split_pattern() const {
    return impl_->split_pattern;
}
const std::string& Tokenizer::source() const {
    return impl_->source;
}

// ---------------------------------------------------------------------------------------------------------
// load

Tokenizer Tokenizer::load(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": no such file or directory");
    if (S_ISDIR(st.st_mode)) {
        const std::string json = path + (path.empty() || path.back() == '/' ? "" : "/") + "tokenizer.json";
        if (::stat(json.c_str(), &st) != 0) throw Error(path + ": directory has no tokenizer.json");
        return from_hf_json(json);
    }
    char magic[4] = {0, 0, 0, 0};
    {
        std::ifstream f(path, std::ios::binary);
        if (!f) throw Error(path + ": cannot open");
        f.read(magic, 4);
    }
    if (std::memcmp(magic, "GGUF", 4) == 0) return from_gguf(path);
    return from_hf_json(path);
}

}  // namespace clef
