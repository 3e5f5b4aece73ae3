// Writes tests/data/gguf/ggml-blocks.gguf: one 8 x 512 tensor "<type>.weight" per ggml block type, quantised
// by llama.cpp's own quantisers (ggml_quantize_chunk, with an importance matrix for the types that need one),
// so that clef's dequantisation is checked on blocks it did not write (tests/gguf/run_gguf_py_check.sh).
//
// Not part of the build or of CI: compiled once against the ggml of the llama.cpp source that the npm package
// node-llama-cpp 3.22.1 ships (package/llama/gitRelease.bundle), e.g.
//   cmake -S llama.cpp -B b -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF && cmake --build b --target ggml
//   cc -O2 make_ggml_blocks.c -Illama.cpp/ggml/include -Lb/bin -lggml -lggml-base -lm -o make_ggml_blocks
//   LD_LIBRARY_PATH=b/bin ./make_ggml_blocks tests/data/gguf/ggml-blocks.gguf
// The values are a fixed pseudo-random sequence (the same file every time).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

enum { kRows = 8, kCols = 512 };

static uint64_t g_state = 0x9E3779B97F4A7C15ull;

static double uniform(void) {  // xorshift64*, in (0, 1)
    g_state ^= g_state >> 12;
    g_state ^= g_state << 25;
    g_state ^= g_state >> 27;
    return ((g_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}

static float normal(void) {
    return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_ggml_blocks OUT.gguf\n");
        return 2;
    }
    const enum ggml_type types[] = {
        GGML_TYPE_F16,     GGML_TYPE_BF16,  GGML_TYPE_Q4_0,    GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1,    GGML_TYPE_Q8_0,  GGML_TYPE_Q2_K,    GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,
        GGML_TYPE_Q5_K,    GGML_TYPE_Q6_K,  GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
        GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S,   GGML_TYPE_IQ1_M,  GGML_TYPE_IQ4_NL,
        GGML_TYPE_IQ4_XS,
    };
    const size_t n_types = sizeof types / sizeof types[0];
    static float x[kRows * kCols], imatrix[kCols];
    for (int r = 0; r < kRows; ++r) {
        const float scale = powf(10.f, -3.f + 4.f * (float)r / (kRows - 1));  // 1e-3 .. 10 across rows
        for (int c = 0; c < kCols; ++c) x[r * kCols + c] = scale * normal();
    }
    for (int c = 0; c < kCols; ++c) imatrix[c] = 0.1f + (float)uniform() * (c % 7 == 0 ? 20.f : 1.f);

    struct ggml_init_params params = {.mem_size = 8u << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context* ctx = ggml_init(params);
    struct gguf_context* out = gguf_init_empty();
    gguf_set_val_str(out, "general.architecture", "ggml-blocks");
    gguf_set_val_str(
        out, "general.description",
        "8 x 512 values per ggml type, quantised by ggml_quantize_chunk (llama.cpp, node-llama-cpp 3.22.1)");
    for (size_t i = 0; i < n_types; ++i) {
        const enum ggml_type t = types[i];
        struct ggml_tensor* tensor = ggml_new_tensor_2d(ctx, t, kCols, kRows);
        ggml_format_name(tensor, "%s.weight", ggml_type_name(t));  // quantisable by name (llama.cpp's rule)
        ggml_quantize_init(t);
        const float* imat = ggml_quantize_requires_imatrix(t) || t == GGML_TYPE_IQ3_XXS ? imatrix : NULL;
        ggml_quantize_chunk(t, x, tensor->data, 0, kRows, kCols, imat);
        gguf_add_tensor(out, tensor);
    }
    if (!gguf_write_to_file(out, argv[1], false)) {
        fprintf(stderr, "cannot write %s\n", argv[1]);
        return 1;
    }
    gguf_free(out);
    ggml_free(ctx);
    ggml_quantize_free();
    printf("%s: %zu tensors\n", argv[1], n_types);
    return 0;
}
