// The small model (clef make-model --preset small: 4 layers of 256-wide rows, so the K-quant and i-quant GGUF
// types apply) and its GGUF files, made once per test program under a directory the program owns.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "tools/gguf_convert.h"
#include "tools/make_model.h"

namespace clef::testing {

// The model directory, made under dir on the first call.
inline const std::string& small_model(const std::string& dir) {
    static const std::string made = [&dir] {
        MakeModelOptions o;
        o.preset = "small";
        o.vision = false;
        const std::string d = dir + "/small";
        make_model(o, d);
        return d;
    }();
    return made;
}

// An importance matrix of ones for every matrix of a GGUF file (llama.cpp's legacy format: count, then per
// entry name, calls, values; then chunks and a dataset name): the i-quants need one to be written at all.
inline std::string uniform_imatrix(const std::string& gguf) {
    std::string b;
    auto i32 = [&b](int32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); };
    auto str = [&](const std::string& s) {
        i32(static_cast<int32_t>(s.size()));
        b += s;
    };
    const GgufFile f = GgufFile::open(gguf);
    int32_t n = 0;
    for (const auto& t : f.tensors()) n += t.dims.size() == 2;
    i32(n);
    for (const auto& t : f.tensors()) {
        if (t.dims.size() != 2) continue;
        str(t.name);
        i32(1);
        i32(static_cast<int32_t>(t.dims[0]));
        const std::vector<float> ones(t.dims[0], 1.f);
        b.append(reinterpret_cast<const char*>(ones.data()), ones.size() * 4);
    }
    i32(1);
    str("uniform");
    const std::string path = gguf + ".imatrix";
    std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return path;
}

// The small model as a GGUF file of `type` (a clef convert --type name), made once under dir.
inline std::string small_gguf(const std::string& dir, const std::string& type) {
    const std::string path = dir + "/small-" + type + ".gguf";
    if (std::filesystem::exists(path)) return path;
    ConvertOptions o;
    EXPECT_TRUE(parse_gguf_file_type(type, o.type));
    if (type.starts_with("iq")) o.imatrix = uniform_imatrix(small_gguf(dir, "bf16"));
    convert_to_gguf(small_model(dir), path, o);
    return path;
}

}  // namespace clef::testing
