#include "io/gguf.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <cstring>
#include <limits>

#include "quant/quant.h"
#include "util/error.h"

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace clef {

namespace {

constexpr uint32_t kNumTypes = 13;

bool valid_type(uint32_t t) {
    return t < kNumTypes;
}

template <class T>
T load_le(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Smallest encoding of one value of type t (used to bound counts by the bytes left in the file).
uint64_t min_encoded_size(GgufType t) {
    switch (t) {
        case GgufType::kString:
            return 8;  // u64 length, possibly 0 bytes of text
        case GgufType::kArray:
            return 12;  // u32 element type + u64 count
        default:
            return gguf_type_size(t);
    }
}

}  // namespace

std::string gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::kUint8:
            return "uint8";
        case GgufType::kInt8:
            return "int8";
        case GgufType::kUint16:
            return "uint16";
        case GgufType::kInt16:
            return "int16";
        case GgufType::kUint32:
            return "uint32";
        case GgufType::kInt32:
            return "int32";
        case GgufType::kFloat32:
            return "float32";
        case GgufType::kBool:
            return "bool";
        case GgufType::kString:
            return "string";
        case GgufType::kArray:
            return "array";
        case GgufType::kUint64:
            return "uint64";
        case GgufType::kInt64:
            return "int64";
        case GgufType::kFloat64:
            return "float64";
    }
    return fmt::format("type {}", static_cast<uint32_t>(t));
}

bool gguf_type_is_integer(GgufType t) {
    switch (t) {
        case GgufType::kUint8:
        case GgufType::kInt8:
        case GgufType::kUint16:
        case GgufType::kInt16:
        case GgufType::kUint32:
        case GgufType::kInt32:
        case GgufType::kUint64:
        case GgufType::kInt64:
            return true;
        default:
            return false;
    }
}

size_t gguf_type_size(GgufType t) {
    switch (t) {
        case GgufType::kUint8:
        case GgufType::kInt8:
        case GgufType::kBool:
            return 1;
        case GgufType::kUint16:
        case GgufType::kInt16:
            return 2;
        case GgufType::kUint32:
        case GgufType::kInt32:
        case GgufType::kFloat32:
            return 4;
        case GgufType::kUint64:
        case GgufType::kInt64:
        case GgufType::kFloat64:
            return 8;
        default:
            return 0;
    }
}

// ---------------------------------------------------------------------------------------------------------
// GgufValue

namespace {

// Reads one fixed-size scalar of type t at p as a signed or unsigned 64-bit integer.
// Returns false for a non-integer type.
bool decode_integer(GgufType t, const unsigned char* p, bool& negative, uint64_t& magnitude_or_value) {
    int64_t s = 0;
    switch (t) {
        case GgufType::kUint8:
            magnitude_or_value = load_le<uint8_t>(p);
            negative = false;
            return true;
        case GgufType::kUint16:
            magnitude_or_value = load_le<uint16_t>(p);
            negative = false;
            return true;
        case GgufType::kUint32:
            magnitude_or_value = load_le<uint32_t>(p);
            negative = false;
            return true;
        case GgufType::kUint64:
            magnitude_or_value = load_le<uint64_t>(p);
            negative = false;
            return true;
        case GgufType::kInt8:
            s = load_le<int8_t>(p);
            break;
        case GgufType::kInt16:
            s = load_le<int16_t>(p);
            break;
        case GgufType::kInt32:
            s = load_le<int32_t>(p);
            break;
        case GgufType::kInt64:
            s = load_le<int64_t>(p);
            break;
        default:
            return false;
    }
    negative = s < 0;
    magnitude_or_value = static_cast<uint64_t>(s);  // two's complement bits when negative
    return true;
}

int64_t integer_as_int(GgufType t, const unsigned char* p) {
    bool neg = false;
    uint64_t v = 0;
    if (!decode_integer(t, p, neg, v)) throw Error("GGUF value is " + gguf_type_name(t) + ", not an integer");
    if (!neg && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw Error(fmt::format("GGUF integer {} does not fit in int64", v));
    return static_cast<int64_t>(v);
}

uint64_t integer_as_uint(GgufType t, const unsigned char* p) {
    bool neg = false;
    uint64_t v = 0;
    if (!decode_integer(t, p, neg, v)) throw Error("GGUF value is " + gguf_type_name(t) + ", not an integer");
    if (neg) throw Error(fmt::format("GGUF integer {} is negative", static_cast<int64_t>(v)));
    return v;
}

double float_value(GgufType t, const unsigned char* p) {
    if (t == GgufType::kFloat32) return load_le<float>(p);
    if (t == GgufType::kFloat64) return load_le<double>(p);
    throw Error("GGUF value is " + gguf_type_name(t) + ", not a float");
}

}  // namespace

std::string GgufValue::type_name() const {
    if (type_ != GgufType::kArray) return gguf_type_name(type_);
    if (elem_type_ == GgufType::kArray && !children_.empty())
        return "array[" + children_.front().type_name() + "]";
    return "array[" + gguf_type_name(elem_type_) + "]";
}

int64_t GgufValue::as_int() const {
    if (!gguf_type_is_integer(type_)) throw Error("GGUF value is " + type_name() + ", not an integer");
    unsigned char buf[8];
    std::memcpy(buf, &scalar_.u, 8);
    return integer_as_int(type_, buf);
}

uint64_t GgufValue::as_uint() const {
    if (!gguf_type_is_integer(type_)) throw Error("GGUF value is " + type_name() + ", not an integer");
    unsigned char buf[8];
    std::memcpy(buf, &scalar_.u, 8);
    return integer_as_uint(type_, buf);
}

double GgufValue::as_float() const {
    if (type_ != GgufType::kFloat32 && type_ != GgufType::kFloat64)
        throw Error("GGUF value is " + type_name() + ", not a float");
    return scalar_.f;
}

bool GgufValue::as_bool() const {
    if (type_ != GgufType::kBool) throw Error("GGUF value is " + type_name() + ", not a bool");
    return scalar_.u != 0;
}

std::string_view GgufValue::as_string() const {
    if (type_ != GgufType::kString) throw Error("GGUF value is " + type_name() + ", not a string");
    return {reinterpret_cast<const char*>(data_), static_cast<size_t>(count_)};
}

GgufType GgufValue::element_type() const {
    if (type_ != GgufType::kArray) throw Error("GGUF value is " + type_name() + ", not an array");
    return elem_type_;
}

size_t GgufValue::size() const {
    if (type_ != GgufType::kArray) throw Error("GGUF value is " + type_name() + ", not an array");
    return static_cast<size_t>(count_);
}

void GgufValue::check_index(size_t i) const {
    if (type_ != GgufType::kArray) throw Error("GGUF value is " + type_name() + ", not an array");
    if (i >= count_) throw Error(fmt::format("GGUF array index {} out of range (size {})", i, count_));
}

void GgufValue::need_array(GgufType elem, const char* what) const {
    if (type_ != GgufType::kArray || elem_type_ != elem)
        throw Error("GGUF value is " + type_name() + ", not " + what);
}

int64_t GgufValue::int_at(size_t i) const {
    check_index(i);
    if (!gguf_type_is_integer(elem_type_))
        throw Error("GGUF value is " + type_name() + ", not an integer array");
    return integer_as_int(elem_type_, data_ + i * gguf_type_size(elem_type_));
}

uint64_t GgufValue::uint_at(size_t i) const {
    check_index(i);
    if (!gguf_type_is_integer(elem_type_))
        throw Error("GGUF value is " + type_name() + ", not an integer array");
    return integer_as_uint(elem_type_, data_ + i * gguf_type_size(elem_type_));
}

double GgufValue::float_at(size_t i) const {
    check_index(i);
    return float_value(elem_type_, data_ + i * gguf_type_size(elem_type_));
}

bool GgufValue::bool_at(size_t i) const {
    check_index(i);
    need_array(GgufType::kBool, "a bool array");
    return data_[i] != 0;
}

std::string_view GgufValue::string_at(size_t i) const {
    check_index(i);
    need_array(GgufType::kString, "a string array");
    return strings_[i];
}

const GgufValue& GgufValue::array_at(size_t i) const {
    check_index(i);
    need_array(GgufType::kArray, "an array of arrays");
    return children_[i];
}

const unsigned char* GgufValue::raw_data() const {
    if (type_ != GgufType::kArray || gguf_type_size(elem_type_) == 0)
        throw Error("GGUF value is " + type_name() + ", not a numeric array");
    return data_;
}

std::vector<int64_t> GgufValue::ints() const {
    if (type_ != GgufType::kArray || !gguf_type_is_integer(elem_type_))
        throw Error("GGUF value is " + type_name() + ", not an integer array");
    std::vector<int64_t> out(static_cast<size_t>(count_));
    const size_t es = gguf_type_size(elem_type_);
    for (size_t i = 0; i < out.size(); ++i) out[i] = integer_as_int(elem_type_, data_ + i * es);
    return out;
}

std::vector<double> GgufValue::floats() const {
    if (type_ != GgufType::kArray || (elem_type_ != GgufType::kFloat32 && elem_type_ != GgufType::kFloat64))
        throw Error("GGUF value is " + type_name() + ", not a float array");
    std::vector<double> out(static_cast<size_t>(count_));
    const size_t es = gguf_type_size(elem_type_);
    for (size_t i = 0; i < out.size(); ++i) out[i] = float_value(elem_type_, data_ + i * es);
    return out;
}

const std::vector<std::string_view>& GgufValue::strings() const {
    need_array(GgufType::kString, "a string array");
    return strings_;
}

uint64_t GgufTensorInfo::n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    return n;
}

std::vector<int64_t> GgufTensorInfo::torch_shape() const {
    return std::vector<int64_t>(dims.rbegin(), dims.rend());
}

// ---------------------------------------------------------------------------------------------------------
// Parser

class GgufParser {
public:
    explicit GgufParser(GgufFile& f) : f_(f), p_(f.file_->data()), size_(f.file_->size()) {}

    void parse() {
        if (size_ < 4 || std::memcmp(p_, "GGUF", 4) != 0) {
            if (size_ < 4) fail(fmt::format("not a GGUF file: only {} bytes", size_));
            fail(fmt::format("not a GGUF file: bad magic {:02x} {:02x} {:02x} {:02x} (expected \"GGUF\")",
                             p_[0], p_[1], p_[2], p_[3]));
        }
        pos_ = 4;
        const uint32_t version = read<uint32_t>("the version");
        if (version == 1) fail("GGUF version 1 is not supported (only versions 2 and 3)");
        if (version == 0x02000000u || version == 0x03000000u) fail("big-endian GGUF files are not supported");
        if (version != 2 && version != 3) fail(fmt::format("unsupported GGUF version {}", version));
        f_.version_ = version;

        const uint64_t n_tensors = read<uint64_t>("the tensor count");
        const uint64_t n_kv = read<uint64_t>("the metadata count");
        // Each key/value needs at least 13 bytes (key length, type, 1-byte value).
        if (n_kv > remaining() / 13)
            fail(fmt::format("metadata count {} is impossible: only {} bytes follow the header", n_kv,
                             remaining()));

        f_.kv_.reserve(static_cast<size_t>(n_kv));
        for (uint64_t i = 0; i < n_kv; ++i) read_kv(i);

        // Alignment.
        if (const GgufValue* a = f_.find(gguf_general::kAlignment)) {
            if (a->type() != GgufType::kUint32)
                fail("metadata key 'general.alignment' is " + a->type_name() + ", expected uint32");
            const uint64_t al = a->as_uint();
            if (al == 0 || (al & (al - 1)) != 0)
                fail(fmt::format("metadata key 'general.alignment' = {} is not a power of two", al));
            f_.alignment_ = static_cast<uint32_t>(al);
        }

        // Each tensor info needs at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
        if (n_tensors > remaining() / 32)
            fail(fmt::format("tensor count {} is impossible: only {} bytes follow the metadata", n_tensors,
                             remaining()));
        f_.tensors_.reserve(static_cast<size_t>(n_tensors));
        for (uint64_t i = 0; i < n_tensors; ++i) read_tensor_info(i);

        const uint64_t al = f_.alignment_;
        const uint64_t data_offset = (pos_ + al - 1) / al * al;  // pos_ <= size_, no overflow for sane sizes
        f_.data_offset_ = data_offset;
        if (n_tensors > 0) {
            if (data_offset > size_)
                fail(fmt::format(
                    "tensor data section would start at offset {}, past the end of the file ({} bytes)",
                    data_offset, size_));
            const uint64_t data_size = size_ - data_offset;
            for (GgufTensorInfo& t : f_.tensors_) {
                if (t.offset > data_size)
                    fail(fmt::format(
                        "tensor '{}': data offset {} is past the end of the data section ({} bytes)", t.name,
                        t.offset, data_size));
                if (t.nbytes > data_size - t.offset)
                    fail(fmt::format("tensor '{}': {} bytes of {} data at offset {} run past the end of the data "
                                     "section ({} bytes; file truncated?)",
                                     t.name, t.nbytes, ggml_type_name(t.ggml_type), t.offset, data_size));
                t.data = p_ + data_offset + t.offset;
            }
            // No two tensors may share bytes.
            std::vector<const GgufTensorInfo*> by_offset;
            by_offset.reserve(f_.tensors_.size());
            for (const GgufTensorInfo& t : f_.tensors_) by_offset.push_back(&t);
            std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
                return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
            });
            for (size_t i = 1; i < by_offset.size(); ++i) {
                const GgufTensorInfo& a = *by_offset[i - 1];
                const GgufTensorInfo& b = *by_offset[i];
                if (a.nbytes > 0 && b.nbytes > 0 && a.offset + a.nbytes > b.offset)
                    fail(fmt::format("tensors '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap", a.name,
                                     a.offset, a.offset + a.nbytes, b.name, b.offset, b.offset + b.nbytes));
            }
        }
    }

private:
    [[noreturn]] void fail(const std::string& msg) const { throw Error(f_.path() + ": " + msg); }

    uint64_t remaining() const { return size_ - pos_; }

    // Where we are, for messages: "metadata key 'k'[3][1]" or "tensor info 5".
    std::string context() const {
        std::string s = ctx_;
        for (uint64_t i : index_path_) s += fmt::format("[{}]", i);
        return s;
    }

    void need(uint64_t n, const char* what) const {
        if (n > remaining()) {
            std::string c = context();
            fail(fmt::format("{}{}truncated: {} needs {} bytes at offset {}, but the file ends at {}", c,
                             c.empty() ? "" : ": ", what, n, pos_, size_));
        }
    }

    template <class T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v = load_le<T>(p_ + pos_);
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_string(const char* what) {
        const uint64_t start = pos_;
        need(8, what);
        const uint64_t len = load_le<uint64_t>(p_ + pos_);
        pos_ += 8;
        if (len > remaining()) {
            std::string c = context();
            fail(fmt::format(
                "{}{}{} at offset {} has length {}, which runs past the end of the file ({} bytes)", c,
                c.empty() ? "" : ": ", what, start, len, size_));
        }
        std::string_view s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

    GgufType read_type(const char* what) {
        const uint64_t at = pos_;
        const uint32_t t = read<uint32_t>(what);
        if (!valid_type(t)) {
            std::string c = context();
            fail(fmt::format("{}{}unknown value type {} at offset {}", c, c.empty() ? "" : ": ", t, at));
        }
        return static_cast<GgufType>(t);
    }

    void read_kv(uint64_t i) {
        ctx_ = fmt::format("metadata entry {}", i);
        const std::string_view key = read_string("the key");
        ctx_ = fmt::format("metadata key '{}'", key);
        if (f_.kv_index_.count(key)) fail(fmt::format("duplicate metadata key '{}'", key));
        GgufKeyValue kv;
        kv.key = key;
        const GgufType t = read_type("the value type");
        read_value(kv.value, t, 0);
        f_.kv_index_.emplace(key, f_.kv_.size());
        f_.kv_.push_back(std::move(kv));
        ctx_.clear();
    }

    void read_value(GgufValue& v, GgufType t, size_t depth) {
        v.type_ = t;
        switch (t) {
            case GgufType::kString: {
                std::string_view s = read_string("the string");
                v.data_ = reinterpret_cast<const unsigned char*>(s.data());
                v.count_ = s.size();
                return;
            }
            case GgufType::kArray:
                read_array(v, depth + 1);
                return;
            case GgufType::kBool: {
                const uint64_t at = pos_;
                const uint8_t b = read<uint8_t>("the bool");
                if (b > 1) fail(fmt::format("{}: invalid bool value {} at offset {}", context(), b, at));
                v.scalar_.u = b;
                return;
            }
            case GgufType::kFloat32:
                v.scalar_.f = read<float>("the float32");
                return;
            case GgufType::kFloat64:
                v.scalar_.f = read<double>("the float64");
                return;
            default: {
                const size_t n = gguf_type_size(t);
                need(n, "the integer");
                v.scalar_.u = 0;
                std::memcpy(&v.scalar_.u, p_ + pos_, n);  // raw little-endian bits; decoded on access
                pos_ += n;
                return;
            }
        }
    }

    void read_array(GgufValue& v, size_t depth) {
        if (depth > GgufFile::kMaxArrayDepth)
            fail(fmt::format("{}: arrays nested more than {} deep", context(), GgufFile::kMaxArrayDepth));
        const GgufType et = read_type("the array element type");
        const uint64_t count = read<uint64_t>("the array length");
        const uint64_t min_size = min_encoded_size(et);
        if (count > remaining() / min_size)
            fail(fmt::format(
                "{}: array of {} {} elements at offset {} cannot fit in the {} bytes left in the file",
                context(), count, gguf_type_name(et), pos_ - 12, remaining()));
        v.elem_type_ = et;
        v.count_ = count;
        v.data_ = p_ + pos_;
        if (et == GgufType::kString) {
            v.strings_.reserve(static_cast<size_t>(count));
            for (uint64_t i = 0; i < count; ++i) {
                index_path_.push_back(i);
                v.strings_.push_back(read_string("the string"));
                index_path_.pop_back();
            }
        } else if (et == GgufType::kArray) {
            v.children_.resize(static_cast<size_t>(count));
            for (uint64_t i = 0; i < count; ++i) {
                index_path_.push_back(i);
                v.children_[i].type_ = GgufType::kArray;
                read_array(v.children_[i], depth + 1);
                index_path_.pop_back();
            }
        } else {
            const uint64_t nbytes = count * min_size;  // bounded by remaining() above
            if (et == GgufType::kBool) {
                for (uint64_t i = 0; i < count; ++i) {
                    if (p_[pos_ + i] > 1)
                        fail(fmt::format("{}[{}]: invalid bool value {} at offset {}", context(), i,
                                         p_[pos_ + i], pos_ + i));
                }
            }
            pos_ += nbytes;
        }
    }

    void read_tensor_info(uint64_t i) {
        ctx_ = fmt::format("tensor info {}", i);
        GgufTensorInfo t;
        t.info_offset = pos_;
        t.name = std::string(read_string("the tensor name"));
        ctx_ = fmt::format("tensor '{}'", t.name);
        if (f_.tensor_index_.count(t.name)) fail(fmt::format("duplicate tensor name '{}'", t.name));
        const uint32_t n_dims = read<uint32_t>("the dimension count");
        if (n_dims == 0 || n_dims > GgufFile::kMaxDims)
            fail(fmt::format("{}: {} dimensions (must be 1..{})", context(), n_dims, GgufFile::kMaxDims));
        t.dims.resize(n_dims);
        uint64_t product = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t dim = read<uint64_t>("a dimension");
            if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                fail(fmt::format("{}: dimension {} = {} is too large", context(), d, dim));
            if (dim != 0 && product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)
                fail(fmt::format("{}: element count overflows int64", context()));
            product *= dim;
            t.dims[d] = dim;
        }
        t.ggml_type = read<uint32_t>("the tensor type");
        const GgmlTypeTraits tt = ggml_type_traits(t.ggml_type);
        if (!tt.name) fail(fmt::format("{}: unknown ggml type {}", context(), t.ggml_type));
        if (t.dims[0] % tt.block_size != 0)
            fail(fmt::format("{}: row length {} is not a multiple of the {} block size {}", context(), t.dims[0],
                             tt.name, tt.block_size));
        {
            const uint64_t rows = t.dims[0] ? product / t.dims[0] : 0;
            const uint64_t row_bytes = t.dims[0] / tt.block_size * tt.type_size;
            if (row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / row_bytes)
                fail(fmt::format("{}: byte size overflows", context()));
            t.nbytes = rows * row_bytes;
        }
        t.offset = read<uint64_t>("the tensor data offset");
        if (t.offset % f_.alignment_ != 0)
            fail(fmt::format("{}: data offset {} is not a multiple of the alignment {}", context(), t.offset,
                             f_.alignment_));
        f_.tensor_index_.emplace(t.name, f_.tensors_.size());
        f_.tensors_.push_back(std::move(t));
        ctx_.clear();
    }

    GgufFile& f_;
    const unsigned char* p_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::string ctx_;
    std::vector<uint64_t> index_path_;
};

// ---------------------------------------------------------------------------------------------------------
// GgufFile

GgufFile GgufFile::open(const std::string& path) {
    GgufFile f;
    f.file_ = std::make_shared<MappedFile>(MappedFile::open(path));
    GgufParser(f).parse();
    return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::key_error(std::string_view key, const std::string& problem) const {
    throw Error(fmt::format("{}: metadata key '{}' {}", path(), key, problem));
}

const GgufValue& GgufFile::at(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) key_error(key, "is missing");
    return *v;
}

namespace {
template <class F>
decltype(auto) with_key(const GgufFile& f, std::string_view key, const char* expected, F&& fn) {
    const GgufValue& v = f.at(key);
    try {
        return fn(v);
    } catch (const Error& e) {
        throw Error(fmt::format("{}: metadata key '{}' ({}): {}; expected {}", f.path(), key, v.type_name(),
                                e.what(), expected));
    }
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
    return with_key(*this, key, "a string", [](const GgufValue& v) { return std::string(v.as_string()); });
}

std::string GgufFile::get_string(std::string_view key, std::string_view fallback) const {
    if (!find(key)) return std::string(fallback);
    return get_string(key);
}

int64_t GgufFile::get_int(std::string_view key) const {
    return with_key(*this, key, "an integer", [](const GgufValue& v) { return v.as_int(); });
}

uint64_t GgufFile::get_uint(std::string_view key) const {
    return with_key(*this, key, "an unsigned integer", [](const GgufValue& v) { return v.as_uint(); });
}

double GgufFile::get_float(std::string_view key) const {
    return with_key(*this, key, "a float", [](const GgufValue& v) { return v.as_float(); });
}

bool GgufFile::get_bool(std::string_view key) const {
    return with_key(*this, key, "a bool", [](const GgufValue& v) { return v.as_bool(); });
}

const std::vector<std::string_view>& GgufFile::get_string_array(std::string_view key) const {
    return with_key(*this, key, "an array of strings",
                    [](const GgufValue& v) -> const std::vector<std::string_view>& { return v.strings(); });
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    return with_key(*this, key, "an array of integers", [](const GgufValue& v) { return v.ints(); });
}

// ---------------------------------------------------------------------------------------------------------
// GgufWriter

namespace {
template <class T>
void put(std::vector<unsigned char>& b, T v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
}
void put_str(std::vector<unsigned char>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}
}  // namespace

void GgufWriter::add_string(const std::string& key, const std::string& v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kString));
    put_str(b, v);
    kv_.emplace_back(key, std::move(b));
}
void GgufWriter::add_uint32(const std::string& key, uint32_t v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kUint32));
    put<uint32_t>(b, v);
    kv_.emplace_back(key, std::move(b));
}
void GgufWriter::add_int32(const std::string& key, int32_t v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kInt32));
    put<int32_t>(b, v);
    kv_.emplace_back(key, std::move(b));
}
void GgufWriter::add_float32(const std::string& key, float v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kFloat32));
    put<float>(b, v);
    kv_.emplace_back(key, std::move(b));
}
void GgufWriter::add_bool(const std::string& key, bool v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kBool));
    put<uint8_t>(b, v ? 1 : 0);
    kv_.emplace_back(key, std::move(b));
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kArray));
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kString));
    put<uint64_t>(b, v.size());
    for (const std::string& s : v) put_str(b, s);
    kv_.emplace_back(key, std::move(b));
}
namespace {
// A numeric array: type id, element type, count, then each element as Stored.
template <class Stored, class Vec>
std::vector<unsigned char> numeric_array(GgufType element, const Vec& v) {
    std::vector<unsigned char> b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kArray));
    put<uint32_t>(b, static_cast<uint32_t>(element));
    put<uint64_t>(b, v.size());
    for (auto x : v) put<Stored>(b, static_cast<Stored>(x));
    return b;
}
}  // namespace

void GgufWriter::add_int32_array(const std::string& key, const std::vector<int32_t>& v) {
    kv_.emplace_back(key, numeric_array<int32_t>(GgufType::kInt32, v));
}
void GgufWriter::add_float32_array(const std::string& key, const std::vector<float>& v) {
    kv_.emplace_back(key, numeric_array<float>(GgufType::kFloat32, v));
}
void GgufWriter::add_bool_array(const std::string& key, const std::vector<bool>& v) {
    kv_.emplace_back(key, numeric_array<uint8_t>(GgufType::kBool, v));  // true -> 1, false -> 0
}

namespace {
// The type id and value of v, as the file encodes them (arrays: element type, count, elements).
void put_value(std::vector<unsigned char>& b, const GgufValue& v, bool with_type) {
    if (with_type) put<uint32_t>(b, static_cast<uint32_t>(v.type()));
    switch (v.type()) {
        case GgufType::kString:
            put_str(b, std::string(v.as_string()));
            return;
        case GgufType::kArray: {
            const GgufType et = v.element_type();
            put<uint32_t>(b, static_cast<uint32_t>(et));
            put<uint64_t>(b, v.size());
            if (et == GgufType::kString) {
                for (std::string_view s : v.strings()) put_str(b, std::string(s));
            } else if (et == GgufType::kArray) {
                for (size_t i = 0; i < v.size(); ++i) put_value(b, v.array_at(i), false);
            } else {
                const unsigned char* p = v.raw_data();
                b.insert(b.end(), p, p + v.size() * gguf_type_size(et));
            }
            return;
        }
        case GgufType::kFloat32:
            put<float>(b, static_cast<float>(v.as_float()));
            return;
        case GgufType::kFloat64:
            put<double>(b, v.as_float());
            return;
        case GgufType::kBool:
            put<uint8_t>(b, v.as_bool() ? 1 : 0);
            return;
        default: {  // integers: the low bytes of the value, two's complement
            const GgufType t = v.type();
            const bool is_signed = t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
                                   t == GgufType::kInt64;
            const uint64_t u = is_signed ? static_cast<uint64_t>(v.as_int()) : v.as_uint();
            const unsigned char* p = reinterpret_cast<const unsigned char*>(&u);
            b.insert(b.end(), p, p + gguf_type_size(v.type()));
        }
    }
}
}  // namespace

void GgufWriter::add_value(const std::string& key, const GgufValue& v) {
    std::vector<unsigned char> b;
    put_value(b, v, true);
    kv_.emplace_back(key, std::move(b));
}

void GgufWriter::add_tensor(const std::string& name, uint32_t ggml_type, std::vector<uint64_t> dims,
                            uint64_t nbytes, Fill fill) {
    tensors_.push_back({name, ggml_type, std::move(dims), nbytes, std::move(fill)});
}

void GgufWriter::write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress) const {
    constexpr uint64_t kAlign = GgufFile::kDefaultAlignment;
    auto pad = [](uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
    std::vector<unsigned char> head;
    head.insert(head.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(head, 3);
    put<uint64_t>(head, tensors_.size());
    put<uint64_t>(head, kv_.size());
    for (const auto& [key, value] : kv_) {
        put_str(head, key);
        head.insert(head.end(), value.begin(), value.end());
    }
    uint64_t offset = 0, total = 0;
    for (const Tensor& t : tensors_) {
        put_str(head, t.name);
        put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
        for (uint64_t d : t.dims) put<uint64_t>(head, d);
        put<uint32_t>(head, t.type);
        put<uint64_t>(head, offset);
        offset = pad(offset + t.nbytes);
    }
    total = offset;
    head.resize(pad(head.size()), 0);

    const std::string partial = path + ".partial";
    std::FILE* fp = std::fopen(partial.c_str(), "wb");
    if (!fp) throw Error(path + ": cannot create " + partial);
    auto fail = [&](const std::string& what) {
        std::fclose(fp);
        std::remove(partial.c_str());
        throw Error(path + ": " + what);
    };
    if (std::fwrite(head.data(), 1, head.size(), fp) != head.size()) fail("write failed");
    std::vector<unsigned char> buf;
    uint64_t done = 0;
    for (const Tensor& t : tensors_) {
        buf.assign(pad(t.nbytes), 0);
        try {
            t.fill(buf.data());
        } catch (const Error& e) {
            fail(std::string("tensor ") + t.name + ": " + e.what());
        }
        if (std::fwrite(buf.data(), 1, buf.size(), fp) != buf.size()) fail("write failed (disk full?)");
        done += buf.size();
        if (progress) progress(done, total);
    }
    if (std::fclose(fp) != 0) {
        std::remove(partial.c_str());
        throw Error(path + ": write failed");
    }
    std::error_code ec;
    std::filesystem::rename(partial, path, ec);
    if (ec) {
        std::remove(partial.c_str());
        throw Error(path + ": cannot rename " + partial + ": " + ec.message());
    }
}

bool is_gguf_file(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return false;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char m[4] = {};
    const size_t n = std::fread(m, 1, 4, f);
    std::fclose(f);
    return n == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

}  // namespace clef
