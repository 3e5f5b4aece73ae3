// Fuzz target: a GGUF file -> GgufFile::open, then every metadata value and tensor info is walked through the
// public accessors (which may refuse with clef::Error, never crash).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "io/gguf.h"
#include "util/error.h"

using namespace clef;

namespace {

void walk(const GgufValue& v, int depth) {
    (void)v.type_name();
    try {
        if (!v.is_array()) {
            switch (v.type()) {
                case GgufType::kString:
                    (void)v.as_string();
                    break;
                case GgufType::kFloat32:
                case GgufType::kFloat64:
                    (void)v.as_float();
                    break;
                case GgufType::kBool:
                    (void)v.as_bool();
                    break;
                default:
                    (void)v.as_int();
                    (void)v.as_uint();
                    break;
            }
            return;
        }
        size_t n = v.size();
        GgufType e = v.element_type();
        if (e == GgufType::kArray) {
            for (size_t i = 0; i < n && i < 64; ++i) walk(v.array_at(i), depth + 1);
        } else if (e == GgufType::kString) {
            if (v.strings().size() != n) std::abort();
            for (size_t i = 0; i < n && i < 64; ++i) (void)v.string_at(i);
        } else if (n > 0) {
            (void)v.raw_data();
            if (gguf_type_is_integer(e)) {
                (void)v.int_at(n - 1);
                (void)v.ints();
            } else if (e == GgufType::kBool) {
                (void)v.bool_at(n - 1);
            } else {
                (void)v.float_at(n - 1);
                (void)v.floats();
            }
        }
        (void)v.int_at(n);  // out of range: must throw
        std::abort();
    } catch (const Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::MemFile file(data, size);
    try {
        GgufFile g = GgufFile::open(file.path());
        if (g.data_offset() > g.file_size() + g.alignment()) std::abort();
        for (const GgufKeyValue& kv : g.metadata()) {
            if (g.find(kv.key) == nullptr) std::abort();
            walk(kv.value, 0);
        }
        for (const GgufTensorInfo& t : g.tensors()) {
            (void)t.n_elements();
            if (t.dims.size() > GgufFile::kMaxDims) std::abort();
            if (g.find_tensor(t.name) == nullptr) std::abort();
        }
        (void)g.get_string("general.architecture", "");
    } catch (const Error&) {
    }
    return 0;
}
