// Fuzz target: a safetensors file (header length, JSON header, data section) -> SafetensorsFile::open, then
// every tensor view is read back (numel/nbytes agree, fp32 conversion stays inside the mapping).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"
#include "util/error.h"

using namespace clef;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::MemFile file(data, size);
    try {
        SafetensorsFile st = SafetensorsFile::open(file.path());
        for (const TensorView& t : st.tensors()) {
            if (static_cast<size_t>(t.numel()) * dtype_size(t.dtype) != t.nbytes) std::abort();
            if (st.find(t.name) == nullptr) std::abort();
            if (t.dtype == DType::BOOL || t.nbytes > (size_t{1} << 20)) continue;
            std::vector<float> v = t.to_f32();
            if (v.size() != static_cast<size_t>(t.numel())) std::abort();
        }
    } catch (const Error&) {
    }
    return 0;
}
