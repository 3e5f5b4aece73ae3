// GGUF (v2/v3, little-endian) reader: header, every metadata value type and the tensor infos.
//
// The file is memory-mapped; strings are views into the mapping and stay valid as long as the GgufFile (or a
// GgufFile it was moved into) lives. Everything is checked against the file size before it is used: counts,
// string and array lengths, nesting depth, alignment, tensor dims. Any malformed input throws
// clef::Error("<path>: <problem>"); a lying count can never make the reader allocate more than a small
// multiple of the file size.
//
// Layout (all integers little-endian):
//   "GGUF" u32 version u64 n_tensors u64 n_kv
//   n_kv  x { string key, u32 type, value }           string = u64 length + bytes (no NUL)
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset }
//   padding to general.alignment (default 32), then the tensor data section.
// Tensor data is validated at open: every tensor has a known ggml type, a row length (dims[0]) that is a whole
// number of that type's blocks, and its bytes (rows x row bytes) lie inside the data section without
// overlapping another tensor's. Whether clef can dequantise the type is checked later, by whoever reads it.
//
// GgufWriter writes v3 files (metadata in insertion order, tensors 32-byte aligned in insertion order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/mmap.h"

namespace clef {

// llama.cpp's general.* metadata keys (gguf-py's Keys.General) that clef reads or writes; the architectures'
// own keys are model/gguf_keys.h's (a clef / qwen35 model) and model/gguf_mmproj.h's (a vision tower).
namespace gguf_general {
inline constexpr const char* kArchitecture = "general.architecture";
inline constexpr const char* kType = "general.type";
inline constexpr const char* kName = "general.name";
inline constexpr const char* kBasename = "general.basename";
inline constexpr const char* kAlignment = "general.alignment";
inline constexpr const char* kFileType = "general.file_type";
inline constexpr const char* kQuantizationVersion = "general.quantization_version";
inline constexpr const char* kParameterCount = "general.parameter_count";
// The quantisation version of the block layouts llama.cpp writes (ggml's GGML_QNT_VERSION).
inline constexpr uint32_t kQuantizationVersionValue = 2;
}  // namespace gguf_general

enum class GgufType : uint32_t {
    kUint8 = 0,
    kInt8 = 1,
    kUint16 = 2,
    kInt16 = 3,
    kUint32 = 4,
    kInt32 = 5,
    kFloat32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kUint64 = 10,
    kInt64 = 11,
    kFloat64 = 12,
};

// "uint8", "int32", "string", "array", ... ; "type N" for an unknown id.
std::string gguf_type_name(GgufType t);
bool gguf_type_is_integer(GgufType t);
// Size in bytes of a fixed-size scalar type; 0 for string and array.
size_t gguf_type_size(GgufType t);

// One metadata value. Scalars carry their value; strings and numeric arrays point into the mapping; string
// arrays keep one view per element; arrays of arrays keep child values. Accessors throw clef::Error (without
// a file name; GgufFile's getters add file and key) when the value has another type or an index is out of
// range.
class GgufValue {
public:
    GgufType type() const { return type_; }
    bool is_array() const { return type_ == GgufType::kArray; }
    std::string type_name() const;  // "uint32", "array[string]", "array[array[int32]]", ...

    // Scalars. as_int / as_uint accept every integer type (range-checked); as_float accepts float32/float64.
    int64_t as_int() const;
    uint64_t as_uint() const;
    double as_float() const;
    bool as_bool() const;
    std::string_view as_string() const;

    // Arrays.
    GgufType element_type() const;  // throws when not an array
    size_t size() const;            // element count; throws when not an array
    int64_t int_at(size_t i) const;
    uint64_t uint_at(size_t i) const;
    double float_at(size_t i) const;
    bool bool_at(size_t i) const;
    std::string_view string_at(size_t i) const;
    const GgufValue& array_at(size_t i) const;  // arrays of arrays
    // Raw little-endian element bytes of a numeric/bool array (size() * gguf_type_size(element_type())).
    const unsigned char* raw_data() const;
    // Whole-array conversions (element type must fit: integers for ints(), any string array for strings()).
    std::vector<int64_t> ints() const;
    std::vector<double> floats() const;
    const std::vector<std::string_view>& strings() const;

private:
    friend class GgufParser;
    void need_array(GgufType elem, const char* what) const;
    void check_index(size_t i) const;

    GgufType type_ = GgufType::kUint8;
    GgufType elem_type_ = GgufType::kUint8;  // arrays only
    union {
        uint64_t u;
        int64_t i;
        double f;
    } scalar_{};
    const unsigned char* data_ = nullptr;  // string bytes or first array element
    uint64_t count_ = 0;                   // string length or array element count
    std::vector<std::string_view> strings_;
    std::vector<GgufValue> children_;
};

struct GgufKeyValue {
    std::string_view key;  // view into the mapping
    GgufValue value;
};

struct GgufTensorInfo {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order: dims[0] is the fastest-varying (row length)
    uint32_t ggml_type = 0;      // raw ggml type id (a type ggml defines; see quant/quant.h)
    uint64_t offset = 0;         // relative to the data section, a multiple of the alignment
    uint64_t info_offset = 0;    // file offset where this tensor info starts (for error messages)
    uint64_t nbytes = 0;         // bytes of tensor data (validated against the file)
    const unsigned char* data = nullptr;  // the tensor's bytes inside the mapping

    uint64_t n_elements() const;  // product of dims (dims are validated not to overflow int64)
    uint64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
    uint64_t n_rows() const { return row_length() ? n_elements() / row_length() : 0; }
    // Shape in torch order (reversed dims), e.g. "[4096, 248320]" -> {248320, 4096}.
    std::vector<int64_t> torch_shape() const;
};

class GgufFile {
public:
    GgufFile() = default;
    static constexpr uint32_t kDefaultAlignment = 32;
    static constexpr size_t kMaxArrayDepth = 8;  // arrays of arrays nested deeper than this are refused
    static constexpr uint32_t kMaxDims = 4;      // GGML_MAX_DIMS

    // Maps and parses the file; throws clef::Error("<path>: <problem>") on anything malformed.
    static GgufFile open(const std::string& path);

    const std::string& path() const { return file_->path(); }
    size_t file_size() const { return file_->size(); }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    // File offset of the tensor data section (end of the tensor infos rounded up to alignment()).
    uint64_t data_offset() const { return data_offset_; }
    const unsigned char* file_data() const { return file_->data(); }

    // Metadata in file order.
    const std::vector<GgufKeyValue>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent
    bool contains(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters: throw clef::Error("<path>: metadata key '<key>' ...") when absent or of another type.
    std::string get_string(std::string_view key) const;
    std::string get_string(std::string_view key, std::string_view fallback) const;  // fallback when absent
    int64_t get_int(std::string_view key) const;
    uint64_t get_uint(std::string_view key) const;
    double get_float(std::string_view key) const;
    bool get_bool(std::string_view key) const;
    // Views into the mapping; valid while this GgufFile lives.
    const std::vector<std::string_view>& get_string_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    // The value, or throws the "missing key" error.
    const GgufValue& at(std::string_view key) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(std::string_view name) const;

private:
    friend class GgufParser;
    [[noreturn]] void key_error(std::string_view key, const std::string& problem) const;

    std::shared_ptr<MappedFile> file_;
    uint32_t version_ = 0;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<GgufKeyValue> kv_;
    std::unordered_map<std::string_view, size_t> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

// Writes a GGUF v3 file. Metadata keys and tensors are written in the order they are added. Tensor bytes are
// produced at write time by a callback (so a converter can stream), and must be exactly nbytes long.
class GgufWriter {
public:
    void add_string(const std::string& key, const std::string& v);
    void add_uint32(const std::string& key, uint32_t v);
    void add_int32(const std::string& key, int32_t v);
    void add_float32(const std::string& key, float v);
    void add_bool(const std::string& key, bool v);
    void add_string_array(const std::string& key, const std::vector<std::string>& v);
    void add_int32_array(const std::string& key, const std::vector<int32_t>& v);
    void add_float32_array(const std::string& key, const std::vector<float>& v);
    void add_bool_array(const std::string& key, const std::vector<bool>& v);
    // Any value read from a GgufFile, re-encoded as it is (GGUF -> GGUF conversion copies the metadata).
    void add_value(const std::string& key, const GgufValue& v);

    using Fill = std::function<void(unsigned char* dst)>;  // writes the tensor's nbytes
    // dims in ggml order (dims[0] = row length).
    void add_tensor(const std::string& name, uint32_t ggml_type, std::vector<uint64_t> dims, uint64_t nbytes,
                    Fill fill);

    // Writes to "<path>.partial" then renames; progress(done, total) after each tensor. Throws clef::Error.
    void write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

private:
    struct Tensor {
        std::string name;
        uint32_t type;
        std::vector<uint64_t> dims;
        uint64_t nbytes;
        Fill fill;
    };
    std::vector<std::pair<std::string, std::vector<unsigned char>>> kv_;  // key, encoded type + value
    std::vector<Tensor> tensors_;
};

// True when the path names a GGUF file (by its magic; false for directories and unreadable paths).
bool is_gguf_file(const std::string& path);

}  // namespace clef
