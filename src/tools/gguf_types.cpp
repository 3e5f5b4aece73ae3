#include "tools/gguf_types.h"

#include <cctype>
#include <map>

#include "model/tensors.h"
#include "quant/quant.h"

namespace clef {

namespace {

using FT = GgufFileType;

constexpr uint32_t T(GgmlType t) {
    return static_cast<uint32_t>(t);
}

using Q = GgufQuant;

bool any_of(FT t, std::initializer_list<FT> set) {
    for (FT s : set)
        if (s == t) return true;
    return false;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third one between.
bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The output matrix (and token_embd when it doubles as it).
GgmlType output_type(FT ft, GgmlType base, uint64_t row) {
    if (row % ggml_type_traits(T(base)).block_size != 0) return GgmlType::Q8_0;
    if (any_of(ft, {FT::IQ2_XXS, FT::IQ2_XS, FT::IQ3_XXS, FT::IQ1_S, FT::IQ2_S, FT::IQ2_M, FT::IQ1_M}))
        return GgmlType::Q5_K;
    return base == GgmlType::Q8_0 ? base : GgmlType::Q6_K;
}

// The 1-2 bit i-quant mixes (IQ1_S/M, IQ2_XXS/XS/S/M).
GgmlType tiny_mix(Q c, FT ft, GgmlType t, int layer, const GgufMixContext& ctx) {
    const bool s_or_m = any_of(ft, {FT::IQ2_S, FT::IQ2_M});
    if (c == Q::AttnV) return ctx.n_gqa >= 4 ? GgmlType::Q4_K : s_or_m ? GgmlType::IQ3_S : GgmlType::Q2_K;
    if (c == Q::FfnDown && layer < ctx.n_layers / 8) return s_or_m ? GgmlType::IQ3_S : GgmlType::Q2_K;
    if (c == Q::AttnOutput) {
        if (any_of(ft, {FT::IQ1_S, FT::IQ1_M})) return GgmlType::IQ2_XXS;
        if (s_or_m) return GgmlType::IQ3_S;
    }
    return t;
}

GgmlType attn_v_type(FT ft, GgmlType t, int layer, const GgufMixContext& ctx) {
    const bool gqa4 = ctx.n_gqa >= 4;
    switch (ft) {
        case FT::Q2_K:
            return gqa4 ? GgmlType::Q4_K : GgmlType::Q3_K;
        case FT::IQ3_XXS:
            return gqa4 ? GgmlType::Q4_K : ctx.has_imatrix ? GgmlType::IQ3_XXS : GgmlType::IQ3_S;
        case FT::IQ3_XS:
        case FT::IQ3_S:
            return gqa4 ? GgmlType::Q4_K : t;
        case FT::IQ3_M:
            return GgmlType::Q4_K;
        case FT::Q3_K_M:
            return layer < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
        case FT::Q3_K_L:
            return GgmlType::Q5_K;
        case FT::IQ4_NL:
        case FT::IQ4_XS:
            return gqa4 ? GgmlType::Q5_K : t;
        case FT::Q4_K_M:
        case FT::Q5_K_M:
            return use_more_bits(layer, ctx.n_layers) ? GgmlType::Q6_K : t;
        case FT::Q4_K_S:
            return layer < 4 ? GgmlType::Q5_K : t;
        default:
            return t;
    }
}

GgmlType ffn_down_type(FT ft, GgmlType t, int layer, const GgufMixContext& ctx) {
    const int n = ctx.n_layers;
    switch (ft) {
        case FT::Q2_K:
            return GgmlType::Q3_K;
        case FT::IQ3_XXS:
            return ctx.has_imatrix ? t : layer < n / 8 ? GgmlType::Q4_K : GgmlType::Q3_K;
        case FT::Q3_K_M:
            return layer < n / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
        case FT::IQ3_M:
            return layer < n / 8 ? GgmlType::Q4_K : t;
        case FT::Q3_K_L:
            return GgmlType::Q5_K;
        case FT::Q4_K_M:
        case FT::Q5_K_M:
            return use_more_bits(layer, n) ? GgmlType::Q6_K : t;
        case FT::IQ4_NL:
        case FT::IQ4_XS:
            return layer < n / 8 && !ctx.has_imatrix ? GgmlType::Q5_K : t;
        case FT::Q4_K_S:
            return layer < n / 8 ? GgmlType::Q5_K : t;
        case FT::Q4_0:
            return ctx.has_imatrix && layer < n / 8 ? GgmlType::Q4_1 : t;
        case FT::Q5_0:
            return ctx.has_imatrix && layer < n / 8 ? GgmlType::Q5_1 : t;
        default:
            return t;
    }
}

GgmlType attn_output_type(FT ft, GgmlType t) {
    switch (ft) {
        case FT::Q2_K:
            return GgmlType::Q3_K;
        case FT::IQ3_XXS:
            return GgmlType::IQ3_S;
        case FT::Q3_K_M:
        case FT::IQ3_M:
            return GgmlType::Q4_K;
        case FT::Q3_K_L:
            return GgmlType::Q5_K;
        default:
            return t;
    }
}

// llama_tensor_get_type's mix for a backbone tensor of class c in layer `layer` (-1 outside layers).
GgmlType mix_type(Q c, FT ft, GgmlType base, int layer, uint64_t row, const GgufMixContext& ctx) {
    if (c == Q::Output || (c == Q::TokenEmbd && !ctx.has_output)) return output_type(ft, base, row);
    if (c == Q::TokenEmbd) {
        if (any_of(ft, {FT::IQ2_XXS, FT::IQ2_XS, FT::IQ1_S, FT::IQ1_M})) return GgmlType::Q2_K;
        if (any_of(ft, {FT::IQ2_S, FT::IQ2_M, FT::IQ3_XXS})) return GgmlType::IQ3_S;
        return base;
    }
    if (any_of(ft, {FT::IQ2_XXS, FT::IQ2_XS, FT::IQ1_S, FT::IQ2_S, FT::IQ2_M, FT::IQ1_M}))
        return tiny_mix(c, ft, base, layer, ctx);
    switch (c) {
        case Q::AttnV:
            return attn_v_type(ft, base, layer, ctx);
        case Q::AttnK:
        case Q::AttnQ:
            return ft == FT::IQ3_XS ? GgmlType::IQ3_XXS : ft == FT::IQ3_XXS ? GgmlType::IQ2_S : base;
        case Q::FfnDown:
            return ffn_down_type(ft, base, layer, ctx);
        case Q::AttnOutput:
            return attn_output_type(ft, base);
        case Q::FfnUp:
        case Q::FfnGate: {
            const int n = ctx.n_layers;
            return ft == FT::IQ3_XS && layer >= n / 8 && layer < 7 * n / 8 ? GgmlType::IQ3_XXS : base;
        }
        default:
            return base;
    }
}

// llama.cpp's fallback for a row of `row` values that is not a whole number of t's blocks.
GgmlType fallback(GgmlType t, uint64_t row) {
    if (row % ggml_type_traits(T(t)).block_size == 0) return t;
    switch (t) {
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ4_XS:
            t = GgmlType::IQ4_NL;
            break;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
            t = GgmlType::Q4_0;
            break;
        case GgmlType::Q4_K:
            t = GgmlType::Q5_0;
            break;
        case GgmlType::Q5_K:
            t = GgmlType::Q5_1;
            break;
        case GgmlType::Q6_K:
            t = GgmlType::Q8_0;
            break;
        default:
            break;
    }
    return row % ggml_type_traits(T(t)).block_size == 0 ? t : GgmlType::F16;
}

}  // namespace

uint32_t gguf_tensor_type(GgufQuant q, int layer, const std::vector<uint64_t>& dims, GgufFileType ft,
                          const GgufMixContext& ctx) {
    const bool matrix = dims.size() >= 2 && dims[1] > 1;
    if (q == Q::PatchEmbd) return ft == FT::F16 ? T(GgmlType::F16) : T(GgmlType::F32);
    if (!matrix || q == Q::F32) return T(GgmlType::F32);
    const GgmlType base = static_cast<GgmlType>(gguf_file_base_type(ft));
    if (ggml_type_traits(T(base)).block_size == 1) return T(base);  // f32, f16, bf16 files
    GgmlType t;
    if (q == Q::HeadQ8 || q == Q::HeadBF16)
        t = q == Q::HeadBF16 ? GgmlType::BF16 : GgmlType::Q8_0;
    else
        t = mix_type(q, ft, base, layer, dims[0], ctx);
    return T(fallback(t, dims[0]));
}

uint32_t gguf_tensor_type(const std::string& name, const std::vector<uint64_t>& dims, GgufFileType ft,
                          const GgufMixContext& ctx) {
    const GgufNameInfo row = gguf_name_info(name);
    return gguf_tensor_type(row.quant, row.layer, dims, ft, ctx);
}

bool gguf_type_needs_imatrix(const std::string& name, uint32_t ggml_type) {
    const GgufQuant q = gguf_name_info(name).quant;
    if (q == Q::TokenEmbd || q == Q::Output) return false;
    switch (static_cast<GgmlType>(ggml_type)) {
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_M:
        case GgmlType::IQ1_S:
            return true;
        default:
            return false;
    }
}

}  // namespace clef
