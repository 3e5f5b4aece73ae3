// llama.cpp's GGUF file types (llama.h's llama_ftype: the general.file_type values), their names and the ggml
// type most tensors of each take. The per-tensor rules under a file type are the converter's
// (tools/gguf_types.h); the names are read by everything that describes a GGUF file
// (model/model_inventory.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace clef {

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

}  // namespace clef
