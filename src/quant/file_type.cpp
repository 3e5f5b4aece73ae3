#include "quant/file_type.h"

#include <map>

#include "quant/quant.h"
#include "util/text.h"

namespace clef {

namespace {

using FT = GgufFileType;

struct FileTypeInfo {
    FT type;
    const char* name;   // ours, lower case
    const char* llama;  // llama.cpp's (LLAMA_FTYPE_MOSTLY_*)
    GgmlType base;      // llama.cpp's default ggml type
};

constexpr FileTypeInfo kFileTypes[] = {
    {FT::F32, "f32", "F32", GgmlType::F32},
    {FT::F16, "f16", "F16", GgmlType::F16},
    {FT::BF16, "bf16", "BF16", GgmlType::BF16},
    {FT::Q8_0, "q8_0", "Q8_0", GgmlType::Q8_0},
    {FT::Q4_0, "q4_0", "Q4_0", GgmlType::Q4_0},
    {FT::Q4_1, "q4_1", "Q4_1", GgmlType::Q4_1},
    {FT::Q5_0, "q5_0", "Q5_0", GgmlType::Q5_0},
    {FT::Q5_1, "q5_1", "Q5_1", GgmlType::Q5_1},
    {FT::Q2_K, "q2_k", "Q2_K", GgmlType::Q2_K},
    {FT::Q3_K_S, "q3_k_s", "Q3_K_S", GgmlType::Q3_K},
    {FT::Q3_K_M, "q3_k_m", "Q3_K_M", GgmlType::Q3_K},
    {FT::Q3_K_L, "q3_k_l", "Q3_K_L", GgmlType::Q3_K},
    {FT::Q4_K_S, "q4_k_s", "Q4_K_S", GgmlType::Q4_K},
    {FT::Q4_K_M, "q4_k_m", "Q4_K_M", GgmlType::Q4_K},
    {FT::Q5_K_S, "q5_k_s", "Q5_K_S", GgmlType::Q5_K},
    {FT::Q5_K_M, "q5_k_m", "Q5_K_M", GgmlType::Q5_K},
    {FT::Q6_K, "q6_k", "Q6_K", GgmlType::Q6_K},
    {FT::IQ1_S, "iq1_s", "IQ1_S", GgmlType::IQ1_S},
    {FT::IQ1_M, "iq1_m", "IQ1_M", GgmlType::IQ1_M},
    {FT::IQ2_XXS, "iq2_xxs", "IQ2_XXS", GgmlType::IQ2_XXS},
    {FT::IQ2_XS, "iq2_xs", "IQ2_XS", GgmlType::IQ2_XS},
    {FT::IQ2_S, "iq2_s", "IQ2_S", GgmlType::IQ2_XS},
    {FT::IQ2_M, "iq2_m", "IQ2_M", GgmlType::IQ2_S},
    {FT::IQ3_XXS, "iq3_xxs", "IQ3_XXS", GgmlType::IQ3_XXS},
    {FT::IQ3_XS, "iq3_xs", "IQ3_XS", GgmlType::IQ3_S},
    {FT::IQ3_S, "iq3_s", "IQ3_S", GgmlType::IQ3_S},
    {FT::IQ3_M, "iq3_m", "IQ3_M", GgmlType::IQ3_S},
    {FT::IQ4_NL, "iq4_nl", "IQ4_NL", GgmlType::IQ4_NL},
    {FT::IQ4_XS, "iq4_xs", "IQ4_XS", GgmlType::IQ4_XS},
};

const FileTypeInfo& info_of(FT t) {
    for (const FileTypeInfo& i : kFileTypes)
        if (i.type == t) return i;
    return kFileTypes[0];
}

}  // namespace

bool parse_gguf_file_type(std::string_view s, GgufFileType& out) {
    const std::string l = ascii_lower(s);
    for (const FileTypeInfo& i : kFileTypes)
        if (l == i.name) {
            out = i.type;
            return true;
        }
    return false;
}

const char* gguf_file_type_name(GgufFileType t) {
    return info_of(t).name;
}

std::string gguf_file_type_names() {
    std::string out;
    for (const FileTypeInfo& i : kFileTypes) out += (out.empty() ? "" : ", ") + std::string(i.name);
    return out;
}

std::string llama_file_type_name(int64_t ftype) {
    for (const FileTypeInfo& i : kFileTypes)
        if (static_cast<int64_t>(i.type) == ftype) return i.llama;
    // llama_ftype values clef does not write; 4-6 and 33-35 are retired.
    static const std::map<int64_t, const char*> kOthers = {
        {21, "Q2_K_S"}, {36, "TQ1_0"}, {37, "TQ2_0"}, {38, "MXFP4_MOE"}};
    auto it = kOthers.find(ftype);
    return it != kOthers.end() ? it->second : "unknown (" + std::to_string(ftype) + ")";
}

uint32_t gguf_file_base_type(GgufFileType t) {
    return static_cast<uint32_t>(info_of(t).base);
}

}  // namespace clef
