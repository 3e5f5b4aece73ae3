// `clef convert`: a model directory in the publisher layout -> one GGUF file in llama.cpp's `clef` / `qwen35`
// naming and layouts (model/tensors.h's table, model/gguf_model.h's layout transforms), optionally quantised.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "model/tensors.h"
#include "tools/gguf_types.h"

namespace clef {

struct ConvertOptions {
    GgufFileType type = GgufFileType::BF16;
    std::string imatrix;        // llama.cpp importance-matrix file (tools/imatrix.h); "" for none
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

// Adds the table's tensor s (its GGUF name and dims) to w in ggml type `type` and counts it in sum; `make`
// gives its values in the GGUF layout, run (and the rows quantised, weighted by the nullable per-column
// importance) only when the file is written.
void add_quantised_tensor(GgufWriter& w, const TensorSpec& s, uint32_t type, const float* importance,
                          std::function<std::vector<float>()> make, ConvertSummary& sum);

// Writes w to out_path (progress as it goes) and completes sum: its tensor count and the file's size.
ConvertSummary write_gguf(const GgufWriter& w, const std::string& out_path,
                          const std::function<void(uint64_t, uint64_t)>& progress, ConvertSummary sum);

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
