// The vision tower (patch embedding, blocks, merger) for one image, on the fp32 reference path.
//
//   bench_vision [--model DIR] [--size HxW] [benchmark flags]
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
#include "io/model_dir.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/vision.h"

namespace {

std::string g_model = std::string(CLEF_TEST_DATA) + "/tiny-clef";
int g_height = 448, g_width = 448;

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
        x.tower = std::make_unique<clef::VisionTower>(x.cfg, ckpt);
        return x;
    }();
    return l;
}

clef::RgbImage synthetic_image(int h, int w) {
    clef::RgbImage img(w, h);
    uint64_t s = 20261008;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t* p = img.row(y) + 3 * x;
            p[0] = static_cast<uint8_t>((x * 255) / w);
            p[1] = static_cast<uint8_t>((y * 255) / h);
            p[2] = static_cast<uint8_t>(s >> 56);
        }
    return img;
}

double tower_flops(const clef::VisionConfig& c, int64_t n, int dim) {
    const double H = c.hidden_size, I = c.intermediate_size, N = static_cast<double>(n);
    const double m2 = c.spatial_merge_size * c.spatial_merge_size;
    const double per_block = 2 * N * H * 3 * H + 2 * N * H * H + 4 * N * N * H + 4 * N * H * I;
    const double merger = 2 * (N / m2) * (m2 * H) * (m2 * H) + 2 * (N / m2) * (m2 * H) * c.out_hidden_size;
    return 2 * N * dim * H + c.depth * per_block + merger;
}

void BM_VisionTower(benchmark::State& state) {
    const Loaded& l = loaded();
    const clef::ProcessedImage img = clef::process_image(synthetic_image(g_height, g_width), l.processor);
    const std::vector<float> pv = clef::pixel_values(img, l.processor);
    for (auto _ : state) {
        std::vector<float> out = l.tower->forward(pv.data(), img.grid_t, img.grid_h, img.grid_w);
        benchmark::DoNotOptimize(out.data());
    }
    const double flops = tower_flops(l.cfg, img.num_patches(), l.tower->patch_dim());
    state.counters["patches"] = img.num_patches();
    state.counters["tokens"] = img.num_tokens();
    state.counters["GFLOP"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
    state.SetLabel(std::to_string(img.resized.height) + "x" + std::to_string(img.resized.width) + " depth " +
                   std::to_string(l.cfg.depth) + " hidden " + std::to_string(l.cfg.hidden_size));
}

void BM_ImagePreprocess(benchmark::State& state) {
    const Loaded& l = loaded();
    const clef::RgbImage rgb = synthetic_image(g_height, g_width);
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
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
