// safetensors reader: memory-mapped, header fully validated, zero-copy tensor views.
// Format: u64 little-endian header length N, N bytes of JSON header, then the data section. The header maps
// tensor names to {dtype, shape, data_offsets:[begin,end)} (offsets relative to the data section) plus an
// optional "__metadata__" object of string -> string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/mmap.h"

namespace clef {

enum class DType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F32", ...); returns false when unknown.
bool parse_dtype(std::string_view s, DType& out);
// Converts n elements of type t at src (unaligned, little-endian) to fp32: float and integer types; returns
// false (writing nothing) for BOOL.
bool convert_to_f32(DType t, const unsigned char* src, size_t n, float* dst);

struct TensorView {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const unsigned char* data = nullptr;  // points into the mapped file (or memory of its owner's)
    size_t nbytes = 0;
    // data lies in a read-only file mapping, so a consumer that has copied it may drop its pages
    // (util/mmap.h drop_mapped_pages: re-read from the file on use); false for memory an owner filled.
    bool mapped = false;
    std::string file;  // the file it lives in (for error messages)

    int64_t numel() const;
    // Copies the tensor into fp32 (BF16/F16/F32/F64 and integer types); throws for BOOL.
    std::vector<float> to_f32() const;
    // Same, into a caller buffer of numel() floats.
    void copy_to_f32(float* dst) const;
};

class SafetensorsFile {
public:
    // Maps and validates the file; throws clef::Error("<path>: <problem>") on any malformed header.
    static SafetensorsFile open(const std::string& path);

    const std::string& path() const { return file_->path(); }
    const std::vector<TensorView>& tensors() const { return tensors_; }
    const TensorView* find(std::string_view name) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    size_t file_size() const { return file_->size(); }

private:
    std::shared_ptr<MappedFile> file_;
    std::vector<TensorView> tensors_;
    std::map<std::string, std::string> metadata_;
};

// A checkpoint made of one or more safetensors files: a directory with model.safetensors.index.json
// (sharded), or with model.safetensors, or a single .safetensors path.
// It keeps no name index of its own: a lookup asks each file (SafetensorsFile::find); the loaders' index of
// the tensors is WeightSource's (io/weight_source.h). Copies share the mappings.
class Checkpoint {
public:
    static Checkpoint open(const std::string& path);
    // Opens exactly these files as one checkpoint (duplicate tensor names are an error).
    static Checkpoint open_files(const std::vector<std::string>& files);

    const TensorView* find(std::string_view name) const;
    // Throws clef::Error("<checkpoint>: missing tensor <name>") when absent.
    const TensorView& get(std::string_view name) const;
    // Every tensor, sorted by name.
    std::vector<const TensorView*> all() const;
    const std::vector<SafetensorsFile>& files() const { return files_; }
    const std::string& description() const { return description_; }

private:
    void check_unique_names() const;

    std::vector<SafetensorsFile> files_;
    std::string description_;
};

}  // namespace clef
