#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/half.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

struct DTypeInfo {
    DType t;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},     {DType::U16, "U16", 2},
    {DType::I16, "I16", 2},   {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::F32, "F32", 4}, {DType::U64, "U64", 8},   {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},
};

// Headers larger than this are refused (the real Clef-Flash shards have headers of ~100 KB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

size_t dtype_size(DType t) {
    for (const auto& d : kDTypes)
        if (d.t == t) return d.size;
    return 0;
}

std::string_view dtype_name(DType t) {
    for (const auto& d : kDTypes)
        if (d.t == t) return d.name;
    return "?";
}

bool parse_dtype(std::string_view s, DType& out) {
    for (const auto& d : kDTypes)
        if (s == d.name) {
            out = d.t;
            return true;
        }
    return false;
}

int64_t TensorView::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

bool convert_to_f32(DType t, const unsigned char* p, size_t n, float* dst) {
    switch (t) {
        case DType::F32:
            std::memcpy(dst, p, n * 4);
            return true;
        case DType::BF16:
            widen<bf16_to_f32>(p, dst, n);
            return true;
        case DType::F16:
            widen<f16_to_f32>(p, dst, n);
            return true;
        case DType::F64:
            for (size_t i = 0; i < n; ++i) {
                double v;
                std::memcpy(&v, p + 8 * i, 8);
                dst[i] = static_cast<float>(v);
            }
            return true;
#define CLEF_INT_CASE(DT, CT)                                \
    case DType::DT:                                          \
        for (size_t i = 0; i < n; ++i) {                     \
            CT v;                                            \
            std::memcpy(&v, p + sizeof(CT) * i, sizeof(CT)); \
            dst[i] = static_cast<float>(v);                  \
        }                                                    \
        return true;
            CLEF_INT_CASE(U8, uint8_t)
            CLEF_INT_CASE(I8, int8_t)
            CLEF_INT_CASE(U16, uint16_t)
            CLEF_INT_CASE(I16, int16_t)
            CLEF_INT_CASE(U32, uint32_t)
            CLEF_INT_CASE(I32, int32_t)
            CLEF_INT_CASE(U64, uint64_t)
            CLEF_INT_CASE(I64, int64_t)
#undef CLEF_INT_CASE
        case DType::BOOL:
            break;
    }
    return false;
}

void TensorView::copy_to_f32(float* dst) const {
    if (!convert_to_f32(dtype, data, static_cast<size_t>(numel()), dst))
        throw Error(file + ": tensor " + name + ": cannot convert dtype " + std::string(dtype_name(dtype)) +
                    " to F32");
}

std::vector<float> TensorView::to_f32() const {
    std::vector<float> out(static_cast<size_t>(numel()));
    copy_to_f32(out.data());
    return out;
}

namespace {

// Header validation for SafetensorsFile::open: every problem is a clef::Error "<path>: <problem>".
Error file_error(const std::string& path, const std::string& what) {
    return Error(path + ": " + what);
}

Error tensor_error(const std::string& path, const std::string& name, const std::string& what) {
    return file_error(path, "tensor '" + name + "': " + what);
}

// The header length from the first 8 bytes (little endian), checked against the limit and the file size.
size_t read_header_length(const std::string& path, const unsigned char* base, size_t size) {
    if (size < 8)
        throw file_error(path,
                         "file too short for a safetensors header (" + std::to_string(size) + " bytes)");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
    if (header_len > kMaxHeaderBytes)
        throw file_error(path, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                                   std::to_string(kMaxHeaderBytes) + " bytes");
    if (header_len > size - 8)
        throw file_error(path, "header length " + std::to_string(header_len) +
                                   " runs past the end of the file (" + std::to_string(size) + " bytes)");
    return static_cast<size_t>(header_len);
}

nlohmann::json parse_header(const std::string& path, const unsigned char* begin, const unsigned char* end) {
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(begin, end);
    } catch (const nlohmann::json::exception& e) {
        throw file_error(path, std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) throw file_error(path, "header is not a JSON object");
    return header;
}

void read_metadata(const std::string& path, const nlohmann::json& v,
                   std::map<std::string, std::string>& out) {
    if (!v.is_object()) throw file_error(path, "__metadata__ is not an object");
    for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
            throw file_error(path, "__metadata__ value for '" + m.key() + "' is not a string");
        out[m.key()] = m.value().get<std::string>();
    }
}

// The dimensions of tensor `name` into `shape`; returns their product, with overflow checks.
unsigned __int128 read_shape(const std::string& path, const std::string& name, const nlohmann::json& sh,
                             std::vector<int64_t>& shape) {
    unsigned __int128 numel = 1;
    for (const auto& d : sh) {
        if (!d.is_number_unsigned())
            throw tensor_error(path, name, "shape entries must be non-negative integers");
        uint64_t dim = d.get<uint64_t>();
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw tensor_error(path, name, "dimension too large");
        shape.push_back(static_cast<int64_t>(dim));
        numel *= dim;
        if (numel > (static_cast<unsigned __int128>(1) << 62))
            throw tensor_error(path, name, "shape product overflows");
    }
    return numel;
}

// The data section that the header's data_offsets are relative to.
struct DataSection {
    const std::string& path;
    const unsigned char* begin;
    size_t size;
};

// One header entry {dtype, shape, data_offsets} as a view into the data section.
TensorView read_tensor(const DataSection& data, const std::string& name, const nlohmann::json& v) {
    auto tfail = [&](const std::string& what) { return tensor_error(data.path, name, what); };
    if (!v.is_object()) throw tfail("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) throw tfail("missing or non-string dtype");
    if (sh == v.end() || !sh->is_array()) throw tfail("missing or non-array shape");
    if (off == v.end() || !off->is_array() || off->size() != 2)
        throw tfail("data_offsets must be [begin, end]");
    TensorView t;
    t.name = name;
    t.file = data.path;
    t.mapped = true;
    if (!parse_dtype(dt->get<std::string>(), t.dtype))
        throw tfail("unknown dtype '" + dt->get<std::string>() + "'");
    const unsigned __int128 numel = read_shape(data.path, name, *sh, t.shape);
    for (const auto& o : *off)
        if (!o.is_number_unsigned()) throw tfail("data_offsets must be non-negative integers");
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) throw tfail("data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    if (e > data.size)
        throw tfail("data_offsets end " + std::to_string(e) + " is past the data section (" +
                    std::to_string(data.size) + " bytes)");
    unsigned __int128 expect = numel * dtype_size(t.dtype);
    if (expect != static_cast<unsigned __int128>(e - b))
        throw tfail("byte range " + std::to_string(e - b) + " does not match shape x dtype size (" +
                    std::to_string(static_cast<uint64_t>(expect)) + ")");
    t.data = data.begin + b;
    t.nbytes = static_cast<size_t>(e - b);
    return t;
}

// Empty tensors occupy no bytes and never overlap; they are left out so that they cannot hide an overlap
// between their neighbours. Sorted by begin, non-empty ranges are disjoint iff each adjacent pair is.
void check_no_overlap(const std::string& path, const std::vector<TensorView>& tensors,
                      const unsigned char* data) {
    struct Range {
        size_t begin, end;
        const std::string* name;
    };
    std::vector<Range> ranges;
    for (const auto& t : tensors) {
        if (t.nbytes == 0) continue;
        size_t b = static_cast<size_t>(t.data - data);
        ranges.push_back({b, b + t.nbytes, &t.name});
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].begin < ranges[i - 1].end)
            throw file_error(path,
                             "tensors '" + *ranges[i - 1].name + "' and '" + *ranges[i].name + "' overlap");
    }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    SafetensorsFile f;
    f.file_ = std::make_shared<MappedFile>(MappedFile::open(path));
    const size_t size = f.file_->size();
    const unsigned char* base = f.file_->data();
    const size_t data_start = 8 + read_header_length(path, base, size);
    const DataSection data{path, base + data_start, size - data_start};
    const nlohmann::json header = parse_header(path, base + 8, base + data_start);
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__")
            read_metadata(path, it.value(), f.metadata_);
        else
            f.tensors_.push_back(read_tensor(data, it.key(), it.value()));
    }
    check_no_overlap(path, f.tensors_, data.begin);
    std::sort(f.tensors_.begin(), f.tensors_.end(),
              [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
    return f;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                               [](const TensorView& t, std::string_view n) { return t.name < n; });
    if (it != tensors_.end() && it->name == name) return &*it;
    return nullptr;
}

// A name in two files is an error (reported for the first such pair in file order).
void Checkpoint::check_unique_names() const {
    for (size_t j = 1; j < files_.size(); ++j)
        for (const TensorView& t : files_[j].tensors())
            for (size_t i = 0; i < j; ++i)
                if (const TensorView* earlier = files_[i].find(t.name))
                    throw Error("tensor '" + t.name + "' appears in both " + earlier->file + " and " +
                                t.file);
}

Checkpoint Checkpoint::open_files(const std::vector<std::string>& files) {
    if (files.empty()) throw Error("checkpoint: no safetensors files given");
    Checkpoint c;
    c.files_.reserve(files.size());
    for (const auto& p : files) c.files_.push_back(SafetensorsFile::open(p));
    c.check_unique_names();
    c.description_ =
        files.size() == 1 ? files[0] : files[0] + " (+" + std::to_string(files.size() - 1) + " shards)";
    return c;
}

Checkpoint Checkpoint::open(const std::string& path) {
    std::error_code ec;
    if (!fs::is_directory(path, ec)) return open_files({path});
    fs::path dir(path);
    fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
        nlohmann::json j;
        try {
            MappedFile m = MappedFile::open(index.string());
            j = nlohmann::json::parse(m.data(), m.data() + m.size());
        } catch (const nlohmann::json::exception& e) {
            throw Error(index.string() + ": not valid JSON: " + e.what());
        }
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            throw Error(index.string() + ": missing weight_map object");
        std::vector<std::string> shards;
        std::map<std::string, std::string> expected;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string())
                throw Error(index.string() + ": weight_map['" + it.key() + "'] is not a string");
            std::string shard = it.value().get<std::string>();
            if (shard.find('/') != std::string::npos || shard == ".." || shard.empty())
                throw Error(index.string() + ": shard name '" + shard + "' is not a plain file name");
            expected[it.key()] = shard;
            if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
        }
        if (shards.empty()) throw Error(index.string() + ": weight_map is empty");
        std::sort(shards.begin(), shards.end());
        std::vector<std::string> paths;
        for (const auto& s : shards) paths.push_back((dir / s).string());
        Checkpoint c = open_files(paths);
        for (const auto& [name, shard] : expected) {
            const TensorView* t = c.find(name);
            if (!t)
                throw Error(index.string() + ": tensor '" + name + "' listed for " + shard +
                            " is not in any shard");
            if (fs::path(t->file).filename() != shard)
                throw Error(index.string() + ": tensor '" + name + "' is listed for " + shard +
                            " but found in " + t->file);
        }
        c.description_ = dir.string() + " (" + std::to_string(shards.size()) + " shards)";
        return c;
    }
    fs::path single = dir / "model.safetensors";
    if (fs::exists(single)) return open_files({single.string()});
    // Publisher layout without an index: model-00001-of-0000N.safetensors.
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        auto n = e.path().filename().string();
        if (n.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors")
            shards.push_back(e.path().string());
    }
    if (shards.empty())
        throw Error(path + ": no model.safetensors, model.safetensors.index.json or model-*.safetensors");
    std::sort(shards.begin(), shards.end());
    return open_files(shards);
}

const TensorView* Checkpoint::find(std::string_view name) const {
    for (const SafetensorsFile& f : files_)
        if (const TensorView* t = f.find(name)) return t;
    return nullptr;
}

const TensorView& Checkpoint::get(std::string_view name) const {
    const TensorView* t = find(name);
    if (!t) throw Error(description_ + ": missing tensor " + std::string(name));
    return *t;
}

std::vector<const TensorView*> Checkpoint::all() const {
    std::vector<const TensorView*> v;
    for (const SafetensorsFile& f : files_)
        for (const TensorView& t : f.tensors()) v.push_back(&t);
    std::sort(v.begin(), v.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
    return v;
}

}  // namespace clef
