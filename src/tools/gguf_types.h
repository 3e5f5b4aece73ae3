// llama.cpp's GGUF file types (llama.h's llama_ftype: the general.file_type values) and the ggml type each
// tensor gets under one: the per-tensor rules of llama.cpp's quantiser (llama-quant.cpp,
// llama_tensor_get_type) for a dense model like Qwen3.5, the joint head's own rule, and llama.cpp's fallback
// for rows that are not a whole number of blocks. docs/GGUF.md lists them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace clef {

enum class GgufQuant;  // model/tensors.h

// Values are llama_ftype's.
enum class GgufFileType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    IQ2_XXS = 19,
    IQ2_XS = 20,
    IQ3_XS = 22,
    IQ3_XXS = 23,
    IQ1_S = 24,
    IQ4_NL = 25,
    IQ3_S = 26,
    IQ3_M = 27,
    IQ2_S = 28,
    IQ2_M = 29,
    IQ4_XS = 30,
    IQ1_M = 31,
    BF16 = 32,
};

// "q4_k_m", "iq2_xxs", "bf16", ... (case-insensitive); false when unknown.
bool parse_gguf_file_type(std::string_view s, GgufFileType& out);
// Lower-case name ("q4_k_m").
const char* gguf_file_type_name(GgufFileType t);
// Every file type's name, comma-separated (for help and errors).
std::string gguf_file_type_names();
// llama.cpp's name of a general.file_type value ("Q4_K_M", "BF16", ...); "unknown (N)" otherwise.
std::string llama_file_type_name(int64_t ftype);
// The ggml type most tensors of a file type take (llama.cpp's default type).
uint32_t gguf_file_base_type(GgufFileType t);

// What the rules read beside a tensor's name and dims.
struct GgufMixContext {
    int n_layers = 0;          // backbone layers (the layer-dependent rules)
    int n_gqa = 0;             // query heads per KV head of the attention layers
    bool has_output = true;    // an output.weight exists (otherwise token_embd doubles as it)
    bool has_imatrix = false;  // an importance matrix is given
};

// The ggml type of a tensor of class q (model/tensors.h's GgufQuant column; layer: its backbone layer, -1
// outside the backbone's layers) with ggml dims `dims` under file type ft.
uint32_t gguf_tensor_type(GgufQuant q, int layer, const std::vector<uint64_t>& dims, GgufFileType ft,
                          const GgufMixContext& ctx);
// The same for a tensor of the tables by GGUF name (model/tensors.h's gguf_name_info; a name the tables do
// not hold takes the base type's rules).
uint32_t gguf_tensor_type(const std::string& name, const std::vector<uint64_t>& dims, GgufFileType ft,
                          const GgufMixContext& ctx);
// llama.cpp's rule: these tensor types need an importance matrix (except for the embedding table and the
// output matrix; by GGUF name, as gguf_tensor_type reads it).
bool gguf_type_needs_imatrix(const std::string& name, uint32_t ggml_type);

}  // namespace clef
