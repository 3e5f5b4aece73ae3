// Whole decisions on the tiny-clef fixture model (tests/data/tiny-clef): the fixture case basic_mixed (1362
// prompt tokens) on the fast path (Exact and BF16 projections) and the scalar reference path, for several
// prefill chunk lengths. items_per_second = prompt tokens per second. For the Clef-Flash-shaped numbers use
// `clef bench` on a `clef make-model --preset flash-shaped` checkpoint (docs/PERFORMANCE.md).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "decision/engine.h"
#include "decision/request.h"
#include "ops/gemm.h"
#include "util/json.h"

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

struct Setup {
    std::unique_ptr<clef::Engine> engine = clef::Engine::load(kModel);
    clef::Engine::Prepared prepared;
    Setup() {
        const clef::JsonValue cases = clef::parse_json_or_throw(read(kModel + "/cases.json"), "cases.json");
        for (const auto& c : cases.find("cases")->items()) {
            if (c.find("name")->as_string() != "basic_mixed") continue;
            clef::DecisionRequest req;
            std::vector<clef::RequestError> errors;
            clef::parse_request(clef::parse_json_or_throw(c.find("request_body")->as_string(), "basic_mixed"),
                                req, errors);
            clef::DecideOptions opt;
            opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
            prepared = engine->prepare(req, opt);
        }
    }
    static std::string read(const std::string& path) {
        std::FILE* f = std::fopen(path.c_str(), "rb");
        std::string s;
        if (!f) return s;
        char buf[65536];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
        std::fclose(f);
        return s;
    }
};

Setup& setup() {
    static Setup s;
    return s;
}

// range(0): prefill chunk (0 = whole prompt); range(1): 0 fast Exact, 1 fast BF16, 2 reference.
void BM_Decide(benchmark::State& state) {
    Setup& s = setup();
    clef::DecideOptions opt;
    opt.backbone.prefill_chunk = state.range(0);
    opt.backbone.precision = state.range(1) == 1 ? clef::ops::Precision::BF16 : clef::ops::Precision::Exact;
    opt.backbone.reference = state.range(1) == 2;
    for (auto _ : state) benchmark::DoNotOptimize(s.engine->run(s.prepared, opt));
    state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(s.prepared.prompt.input_ids.size()));
}
BENCHMARK(BM_Decide)
    ->ArgNames({"chunk", "path"})
    ->Args({512, 0})
    ->Args({0, 0})
    ->Args({64, 0})
    ->Args({512, 1})
    ->Args({512, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
