// The vision tower (patch embedding, blocks, merger) for one image, on the fast path (--reference: the fp32
// reference path).
//
//   bench_vision [--model DIR] [--size HxW] [--reference] [benchmark flags]
//
// DIR is a model directory in the publisher layout (default: tests/data/tiny-clef); only config.json,
// processor_config.json and the model.visual.* weights are read. For the Clef-Flash tower (depth 27, hidden
// 1152, 16 heads, MLP 4304) without downloading the real weights, write a flash-shaped checkpoint with one
// text layer (the vision tower is full size regardless):
//
//   build/clef make-model --preset flash-shaped --layers 1 --out /tmp/flash1
//   build/bench/bench_vision --model /tmp/flash1 --size 448x448
//
// The image is a deterministic synthetic RGB picture of the given size (default 448x448); it goes through the
// model's image processor (smart resize, bicubic resize, normalisation) and the tower. Reported: time per
// image, patches, merged tokens, and the tower's arithmetic rate (GFLOP/s, multiply-adds counted as 2).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/preprocess.h"
#include "image/synthetic.h"
#include "io/model_dir.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/vision.h"

namespace {

std::string g_model = std::string(CLEF_TEST_DATA) + "/tiny-clef";
int g_height = 448, g_width = 448;
bool g_reference = false;

struct Loaded {
    clef::VisionConfig cfg;
    clef::ImageProcessorConfig processor;
    std::unique_ptr<clef::VisionTower> tower;
};

const Loaded& loaded() {
    static const Loaded l = [] {
        Loaded x;
        const clef::ModelDir dir = clef::locate_model_dir(g_model);
        const clef::ModelConfig mc = clef::load_model_config(dir.config_path);
        if (!mc.vision) throw clef::Error(g_model + ": config.json has no vision_config");
        x.cfg = *mc.vision;
        if (!dir.processor_config_path.empty())
            x.processor = clef::load_image_processor_config(dir.processor_config_path);
        const clef::Checkpoint ckpt = clef::Checkpoint::open(dir.weights_path);
        x.tower = std::make_unique<clef::VisionTower>(x.cfg, ckpt, "model.visual.", g_reference);
        return x;
    }();
    return l;
}

void BM_VisionTower(benchmark::State& state) {
    const Loaded& l = loaded();
    const clef::ProcessedImage img =
        clef::process_image(clef::synthetic_image(g_width, g_height), l.processor);
    const std::vector<float> pv = clef::pixel_values(img, l.processor);
    for (auto _ : state) {
        std::vector<float> out = l.tower->forward(pv.data(), img.grid_t, img.grid_h, img.grid_w);
        benchmark::DoNotOptimize(out.data());
    }
    const double flops = clef::vision_flops(l.cfg, img.grid_t, img.grid_h, img.grid_w);
    state.counters["patches"] = img.num_patches();
    state.counters["tokens"] = img.num_tokens();
    state.counters["GFLOP"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
    state.SetLabel(std::to_string(img.resized.height) + "x" + std::to_string(img.resized.width) + " depth " +
                   std::to_string(l.cfg.depth) + " hidden " + std::to_string(l.cfg.hidden_size));
}

void BM_ImagePreprocess(benchmark::State& state) {
    const Loaded& l = loaded();
    const clef::RgbImage rgb = clef::synthetic_image(g_width, g_height);
    for (auto _ : state) {
        const clef::ProcessedImage img = clef::process_image(rgb, l.processor);
        std::vector<float> pv = clef::pixel_values(img, l.processor);
        benchmark::DoNotOptimize(pv.data());
    }
}

}  // namespace

BENCHMARK(BM_ImagePreprocess)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_VisionTower)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
    // Our flags first; the rest goes to Google Benchmark.
    std::vector<char*> rest = {argv[0]};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--model" && i + 1 < argc) {
            g_model = argv[++i];
        } else if (a == "--reference") {
            g_reference = true;
        } else if (a == "--size" && i + 1 < argc) {
            if (std::sscanf(argv[++i], "%dx%d", &g_height, &g_width) != 2 || g_height < 1 || g_width < 1) {
                std::fprintf(stderr, "--size: expected HxW, e.g. 448x448\n");
                return 2;
            }
        } else {
            rest.push_back(argv[i]);
        }
    }
    int n = static_cast<int>(rest.size());
    benchmark::Initialize(&n, rest.data());
    try {
        loaded();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_vision: %s\n", e.what());
        return 1;
    }
    benchmark::AddCustomContext("model", g_model);
    benchmark::AddCustomContext("image", std::to_string(g_height) + "x" + std::to_string(g_width));
    benchmark::AddCustomContext("path", g_reference ? "reference" : "fast");
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
