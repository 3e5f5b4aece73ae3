// `clef convert`: a model directory in the publisher layout -> one GGUF file in llama.cpp's `clef` / `qwen35`
// naming and layouts (model/tensors.h's table, model/gguf_model.h's layout transforms), optionally quantised.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace clef {

// llama.cpp's file types that `clef convert` writes (general.file_type values in parentheses).
enum class GgufFileType {
    F32 /*0*/,
    F16 /*1*/,
    BF16 /*32*/,
    Q8_0 /*7*/,
    Q4_K_M /*15*/,
    Q5_K_M /*17*/,
    Q6_K /*18*/
};
// "f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k" (case-insensitive); false when unknown.
bool parse_gguf_file_type(std::string_view s, GgufFileType& out);
const char* gguf_file_type_name(GgufFileType t);
// llama.cpp's name of a general.file_type value ("Q4_K_M", "BF16", ...); "unknown (N)" otherwise.
std::string llama_file_type_name(int64_t ftype);

// The ggml type `clef convert` gives a tensor (GGUF name, ggml dims) under file type ft, for a backbone of
// n_layers layers, including llama.cpp's fallback for rows that are not a whole number of blocks
// (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, then f16). docs/GGUF.md lists the rules.
uint32_t gguf_tensor_type(const std::string& name, const std::vector<uint64_t>& dims, GgufFileType ft,
                          int n_layers);

struct ConvertOptions {
    GgufFileType type = GgufFileType::BF16;
    std::string arch = "clef";  // "clef" (backbone + head) or "qwen35" (backbone only)
    std::function<void(uint64_t done, uint64_t total)> progress;
    // Named chat templates written for the clef architecture as tokenizer.chat_template.<name> plus the
    // tokenizer.chat_templates list (llama.cpp's keys); `clef convert` passes the systemone template.
    std::map<std::string, std::string> chat_templates;
};

struct ConvertSummary {
    uint64_t tensors = 0;
    uint64_t bytes = 0;                                // file size
    std::map<std::string, uint64_t> tensors_per_type;  // ggml type name -> count
};

// Converts a model directory in the publisher layout to one GGUF file. Throws clef::Error.
ConvertSummary convert_to_gguf(const std::string& model_dir, const std::string& out_path,
                               const ConvertOptions& opt);
// Converts a GGUF file to another file type (opt.arch and opt.chat_templates are not used): the metadata is
// copied (general.file_type set, general.alignment dropped), fp32 tensors stay fp32, the others take
// gguf_tensor_type's type (every tensor fp32 for F32), keeping their bytes when the type does not change and
// dequantised to fp32 and quantised again otherwise. Throws clef::Error, naming any tensor of a type clef
// cannot read.
ConvertSummary convert_gguf(const std::string& in_path, const std::string& out_path,
                            const ConvertOptions& opt);

}  // namespace clef
