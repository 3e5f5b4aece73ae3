// llama.cpp's importance-matrix files (what llama-imatrix writes), read for `clef convert --imatrix FILE`:
// per weight tensor (GGUF name) the mean square of each input column over the calibration text, which the
// low-bit quantisers use as per-column weights of the error (quant/quant.h's quantize_row `importance`).
//
// Two formats, told apart by the GGUF magic:
//   GGUF: tensors "<name>.in_sum2" (f32, the summed squares) and "<name>.counts" (f32, how many were summed);
//         the importance is in_sum2 / counts (1 where a count is 0), metadata imatrix.datasets and
//         imatrix.chunk_count.
//   legacy (.dat): i32 n_entries, then per entry i32 name length, name, i32 ncall, i32 nval, f32 values[nval]
//         (already averaged, times ncall); then optionally i32 chunk count and a dataset name. The importance
//         is values / ncall (as they are when ncall is 0).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace clef {

struct ImportanceMatrix {
    std::map<std::string, std::vector<float>, std::less<>> columns;  // tensor name -> one weight per column
    std::vector<std::string> datasets;
    int chunks = 0;

    // The weights of tensor `name`, which has `cols` columns; nullptr when the file has none for it. Throws
    // clef::Error when it has them for another width.
    const float* find(const std::string& name, size_t cols) const;
};

// Reads either format; throws clef::Error("<path>: <problem>") on anything malformed (sizes, negative or
// non-finite values, a truncated file).
ImportanceMatrix load_imatrix(const std::string& path);

}  // namespace clef
