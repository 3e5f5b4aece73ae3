// Tokenizer throughput (single thread) with the Qwen3 tokenizer.json from tests/data.
//
// Two deterministic ~1 MiB corpora are generated in code (fixed-seed PRNG, no files):
//   english: prose from a Zipf-weighted list of common words, plus rarer made-up words, numbers and
//   punctuation; mixed:   ~60% of that prose, then code (C++/Python), JSON records, Chinese/Japanese,
//   Cyrillic/Arabic and
//            emoji, interleaved in chunks.
// "Warm" runs keep the per-word cache across iterations (the steady state of a long-running process);
// "Cold" runs clear it before every iteration. bytes_per_second is the number to read (MB/s).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

const std::string kJson = std::string(CLEF_TEST_DATA) + "/tokenizer/qwen3/tokenizer.json";
constexpr size_t kCorpusBytes = 1 << 20;

class Rng {
public:
    explicit Rng(uint64_t seed) : s_(seed) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    size_t below(size_t n) { return static_cast<size_t>(next() % n); }
    // Roughly Zipf over [0, n): small indices are much more frequent.
    size_t zipf(size_t n) {
        const double u = static_cast<double>(next() >> 11) / 9007199254740992.0;
        return static_cast<size_t>(static_cast<double>(n) * u * u * u) % n;
    }

private:
    uint64_t s_;
};

const std::vector<std::string>& common_words() {
    static const std::vector<std::string> w = [] {
        const std::string all =
            "the of and to a in is that it was for on are as with his they at be this from have or by one "
            "had not but what all were when we there can an your which their said if do will each about how "
            "up out them then she many some so these would other into has more her two like him see time "
            "could no make than first been its who now people my made over did down only way find use may "
            "water long little very after words called just where most know get through back much before go "
            "good new write our used me man too any day same right look think also around another came come "
            "work three word must because does part even place well such here take why things help put years "
            "different away again off went old number great tell men say small every found still between "
            "name should home big give air line set own under read last never us left end along while might "
            "next sound below saw something thought both few those always looked show large often together "
            "asked house don't world going want school important until form food keep children feet land "
            "side without boy once animals life enough took sometimes four head above kind began almost live "
            "page got earth need far hand high year mother light parts country father let night following "
            "picture being study second eyes soon times story boys since white days paper hard near sentence "
            "better best across during today others however sure means knew it's try told young miles sun "
            "ways thing whole hear example heard several change answer room sea against top turned learn "
            "point city play toward five using himself usually money seen didn't car morning I'm body upon "
            "family later turn move face door cut done group true leave color red friends pretty eat front "
            "feel fact hand week eye question government system company program problem research development "
            "information community experience education economic political international technology "
            "environment particular significant understanding relationship responsibility opportunity "
            "organization administration independent measurement performance engineering tokenizer "
            "throughput benchmark language model network";
        std::vector<std::string> out;
        size_t pos = 0;
        while (pos < all.size()) {
            const size_t sp = std::min(all.find(' ', pos), all.size());
            out.push_back(all.substr(pos, sp - pos));
            pos = sp + 1;
        }
        return out;
    }();
    return w;
}

std::string made_up_word(Rng& r) {
    static const char* const syl[] = {"ka", "tor", "ven", "lis", "mar", "quo", "dre", "sil", "pha", "nex",
                                      "ul", "bri", "gon", "esh", "tha", "rim", "zo",  "cle", "mun", "ast"};
    std::string w;
    const size_t n = 2 + r.below(3);
    for (size_t i = 0; i < n; ++i) w += syl[r.below(20)];
    return w;
}

void append_prose(Rng& r, std::string& out, size_t bytes) {
    const auto& words = common_words();
    // A fixed pool of rarer made-up words (names, jargon), drawn Zipf-style.
    static std::vector<std::string> rare;
    if (rare.empty()) {
        Rng rr(7);
        for (int i = 0; i < 5000; ++i) rare.push_back(made_up_word(rr));
    }
    const size_t stop = out.size() + bytes;
    while (out.size() < stop) {
        const size_t sentence_len = 6 + r.below(20);
        for (size_t i = 0; i < sentence_len; ++i) {
            std::string w;
            const size_t k = r.below(100);
            if (k < 88) {
                w = words[r.zipf(words.size())];
            } else if (k < 97) {
                w = rare[r.zipf(rare.size())];
            } else {
                w = std::to_string(r.below(k == 97 ? 100 : 100000));
            }
            if (i == 0 && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
            if (i > 0) out += ' ';
            out += w;
            if (i + 1 < sentence_len && r.below(12) == 0) out += r.below(4) == 0 ? ";" : ",";
        }
        const size_t p = r.below(20);
        out += p < 15 ? "." : p < 18 ? "?" : "!";
        out += r.below(7) == 0 ? "\n\n" : " ";
    }
}

void append_code(Rng& r, std::string& out) {
    static const char* const snippets[] = {
        "for (size_t i = 0; i < n; ++i) {\n    sum += values[i] * weights[i];\n}\n",
        "def parse_line(line: str) -> dict:\n    key, _, value = line.partition('=')\n    return "
        "{key.strip(): "
        "value.strip()}\n\n",
        "if (!file) {\n    throw std::runtime_error(\"cannot open \" + path);\n}\n",
        "    return std::accumulate(xs.begin(), xs.end(), 0.0) / static_cast<double>(xs.size());\n",
        "class Cache:\n    def __init__(self, capacity=1024):\n        self.items = {}\n        "
        "self.capacity = "
        "capacity\n",
        "const auto it = index.find(name);\nif (it == index.end()) return nullptr;\n",
        "    # TODO: handle the empty case\n    if not items:\n        return None\n",
    };
    out += snippets[r.below(7)];
    out += "int var_" + std::to_string(r.below(1000)) + " = " + std::to_string(r.below(65536)) + ";\n";
}

void append_json(Rng& r, std::string& out) {
    out += "{\"id\": " + std::to_string(r.below(1000000)) + ", \"name\": \"" + common_words()[r.zipf(200)] +
           "_" + std::to_string(r.below(100)) + "\", \"score\": " + std::to_string(r.below(1000)) + "." +
           std::to_string(r.below(100)) + ", \"tags\": [\"" + common_words()[r.below(100)] + "\", \"" +
           common_words()[r.below(100)] + "\"], \"active\": " + (r.below(2) ? "true" : "false") + "}\n";
}

void append_cjk(Rng& r, std::string& out) {
    static const char* const zh[] = {"我们", "中国", "今天", "天气", "非常", "好",   "的",   "是",
                                     "在",   "有",   "人",   "这个", "问题", "时间", "工作", "学习",
                                     "语言", "模型", "计算", "数据", "系统", "开发", "研究", "世界",
                                     "经济", "社会", "技术", "发展", "可以", "一个"};
    static const char* const ja[] = {"これは",     "日本語",     "の",       "テキスト", "です",
                                     "私は",       "東京",       "に",       "住んで",   "います",
                                     "ありがとう", "ございます", "カタカナ", "ひらがな", "漢字"};
    const bool japanese = r.below(3) == 0;
    const size_t n = 4 + r.below(14);
    for (size_t i = 0; i < n; ++i) out += japanese ? ja[r.below(15)] : zh[r.zipf(30)];
    out += japanese ? "。" : (r.below(3) ? "，" : "。");
}

void append_other(Rng& r, std::string& out) {
    static const char* const s[] = {
        "Привет, как дела? Всё хорошо. ",
        "مرحبا بالعالم، كيف حالك؟ ",
        "Ελληνικά κείμενα για δοκιμή. ",
        "emoji 😀🎉👍🏽 and 👨‍👩‍👧‍👦 family 🏳️‍🌈 ",
        "Café crème brûlée — naïve façade. ",
        "नमस्ते दुनिया ",
        "한국어 텍스트입니다. ",
    };
    out += s[r.below(7)];
}

const std::string& english_corpus() {
    static const std::string c = [] {
        Rng r(42);
        std::string s;
        append_prose(r, s, kCorpusBytes);
        return s;
    }();
    return c;
}

const std::string& mixed_corpus() {
    static const std::string c = [] {
        Rng r(1234);
        std::string s;
        while (s.size() < kCorpusBytes) {
            const size_t k = r.below(100);
            if (k < 60) {
                append_prose(r, s, 400);
            } else if (k < 75) {
                append_code(r, s);
            } else if (k < 85) {
                append_json(r, s);
            } else if (k < 95) {
                append_cjk(r, s);
            } else {
                append_other(r, s);
            }
        }
        return s;
    }();
    return c;
}

const clef::Tokenizer& qwen3() {
    static const clef::Tokenizer t = clef::Tokenizer::from_hf_json(kJson);
    return t;
}

void run_encode(benchmark::State& state, const std::string& corpus, bool cold) {
    const clef::Tokenizer& tok = qwen3();
    std::vector<int32_t> ids;
    ids.reserve(corpus.size() / 2);
    tok.encode(corpus, {}, ids);  // warm-up (and the token count)
    const size_t n_tokens = ids.size();
    for (auto _ : state) {
        if (cold) {
            state.PauseTiming();
            tok.clear_cache();
            state.ResumeTiming();
        }
        ids.clear();
        tok.encode(corpus, {}, ids);
        benchmark::DoNotOptimize(ids.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus.size()));
    state.counters["corpus_bytes"] = static_cast<double>(corpus.size());
    state.counters["tokens"] = static_cast<double>(n_tokens);
    state.counters["bytes_per_token"] = static_cast<double>(corpus.size()) / static_cast<double>(n_tokens);
}

void BM_EncodeEnglish(benchmark::State& s) {
    run_encode(s, english_corpus(), false);
}
void BM_EncodeEnglishCold(benchmark::State& s) {
    run_encode(s, english_corpus(), true);
}
void BM_EncodeMixed(benchmark::State& s) {
    run_encode(s, mixed_corpus(), false);
}
void BM_EncodeMixedCold(benchmark::State& s) {
    run_encode(s, mixed_corpus(), true);
}

void BM_DecodeMixed(benchmark::State& state) {
    const clef::Tokenizer& tok = qwen3();
    const std::vector<int32_t> ids = tok.encode(mixed_corpus());
    for (auto _ : state) {
        std::string s = tok.decode(ids);
        benchmark::DoNotOptimize(s.data());
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed_corpus().size()));
}

void BM_LoadTokenizerJson(benchmark::State& state) {
    for (auto _ : state) {
        clef::Tokenizer t = clef::Tokenizer::from_hf_json(kJson);
        benchmark::DoNotOptimize(t.vocab_size());
    }
}

BENCHMARK(BM_EncodeEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeEnglishCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeMixed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeMixedCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeMixed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadTokenizerJson)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
