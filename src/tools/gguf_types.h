// The ggml type each tensor gets under a GGUF file type (quant/file_type.h, llama.h's llama_ftype): the
// per-tensor rules of llama.cpp's quantiser (llama-quant.cpp,
// llama_tensor_get_type) for a dense model like Qwen3.5, the joint head's own rule, and llama.cpp's fallback
// for rows that are not a whole number of blocks. docs/GGUF.md lists them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quant/file_type.h"

namespace clef {

enum class GgufQuant;  // model/tensors.h

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
