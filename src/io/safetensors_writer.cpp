#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"
#include "util/half.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

// The reference library orders the data section by dtype, descending in its Dtype enum order
// (BOOL < U8 < I8 < I16 < U16 < F16 < BF16 < I32 < U32 < F32 < F64 < I64 < U64), then by name.
int dtype_rank(DType t) {
    switch (t) {
        case DType::BOOL:
            return 0;
        case DType::U8:
            return 1;
        case DType::I8:
            return 2;
        case DType::I16:
            return 3;
        case DType::U16:
            return 4;
        case DType::F16:
            return 5;
        case DType::BF16:
            return 6;
        case DType::I32:
            return 7;
        case DType::U32:
            return 8;
        case DType::F32:
            return 9;
        case DType::F64:
            return 10;
        case DType::I64:
            return 11;
        case DType::U64:
            return 12;
    }
    return 0;
}

std::string errno_text() {
    return std::strerror(errno);
}

// A file written with POSIX calls, removed again unless committed.
class OutFile {
public:
    OutFile(std::string path, std::string final_path)
        : path_(std::move(path)), final_(std::move(final_path)) {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) throw Error(final_ + ": cannot create " + path_ + ": " + errno_text());
    }
    OutFile(const OutFile&) = delete;
    OutFile& operator=(const OutFile&) = delete;
    ~OutFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(path_.c_str());
    }

    void write(const void* data, size_t n) {
        const char* p = static_cast<const char*>(data);
        while (n > 0) {
            ssize_t w = ::write(fd_, p, n);
            if (w < 0) {
                if (errno == EINTR) continue;
                throw Error(final_ + ": write failed: " + errno_text());
            }
            p += w;
            n -= static_cast<size_t>(w);
        }
    }

    void commit() {
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) throw Error(final_ + ": close failed: " + errno_text());
        if (path_ != final_ && std::rename(path_.c_str(), final_.c_str()) != 0)
            throw Error(final_ + ": cannot rename " + path_ + ": " + errno_text());
        committed_ = true;
    }

private:
    std::string path_, final_;
    int fd_ = -1;
    bool committed_ = false;
};

std::string shard_name(const std::string& prefix, size_t k, size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k, n);
    return prefix + buf;
}

}  // namespace

uint64_t TensorSource::numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
}

uint64_t TensorSource::nbytes() const {
    return numel() * dtype_size(dtype);
}

TensorSource tensor_from_bytes(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::vector<unsigned char> bytes) {
    TensorSource t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    const uint64_t expect = t.nbytes();
    if (bytes.size() != expect)
        throw Error("tensor " + t.name + ": " + std::to_string(bytes.size()) +
                    " bytes given, shape x dtype size is " + std::to_string(expect));
    auto data = std::make_shared<std::vector<unsigned char>>(std::move(bytes));
    t.fill = [data](unsigned char* dst, uint64_t offset, size_t nbytes) {
        std::memcpy(dst, data->data() + offset, nbytes);
    };
    return t;
}

TensorSource tensor_from_f32(std::string name, DType dtype, std::vector<int64_t> shape,
                             const std::vector<float>& values) {
    const size_t es = dtype_size(dtype);
    if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
        throw Error("tensor " + name + ": tensor_from_f32 stores F32, BF16 or F16, not " +
                    std::string(dtype_name(dtype)));
    std::vector<unsigned char> bytes(values.size() * es);
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == DType::F32) {
            std::memcpy(&bytes[4 * i], &values[i], 4);
        } else {
            const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
            std::memcpy(&bytes[2 * i], &h, 2);
        }
    }
    return tensor_from_bytes(std::move(name), dtype, std::move(shape), std::move(bytes));
}

std::string safetensors_header(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<size_t>* order) {
    std::set<std::string_view> seen;
    for (const TensorSource& t : tensors) {
        if (t.name.empty()) throw Error("safetensors writer: empty tensor name");
        if (t.name == "__metadata__")
            throw Error("safetensors writer: a tensor may not be named __metadata__");
        if (!seen.insert(t.name).second) throw Error("safetensors writer: duplicate tensor name " + t.name);
        if (dtype_size(t.dtype) == 0) throw Error("safetensors writer: tensor " + t.name + ": bad dtype");
        for (int64_t d : t.shape)
            if (d < 0) throw Error("safetensors writer: tensor " + t.name + ": negative dimension");
    }
    std::vector<size_t> idx(tensors.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        const int ra = dtype_rank(tensors[a].dtype), rb = dtype_rank(tensors[b].dtype);
        if (ra != rb) return ra > rb;
        return tensors[a].name < tensors[b].name;
    });

    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        nlohmann::ordered_json m = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata) m[k] = v;
        h["__metadata__"] = std::move(m);
    }
    uint64_t offset = 0;
    for (size_t i : idx) {
        const TensorSource& t = tensors[i];
        nlohmann::ordered_json e = nlohmann::ordered_json::object();
        e["dtype"] = std::string(dtype_name(t.dtype));
        e["shape"] = nlohmann::ordered_json::array();
        for (int64_t d : t.shape) e["shape"].push_back(static_cast<uint64_t>(d));
        const uint64_t n = t.nbytes();
        e["data_offsets"] = {offset, offset + n};
        offset += n;
        h[t.name] = std::move(e);
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    if (order) *order = std::move(idx);
    return text;
}

uint64_t safetensors_file_size(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata) {
    uint64_t n = 8 + safetensors_header(tensors, metadata).size();
    for (const TensorSource& t : tensors) n += t.nbytes();
    return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                       const SafetensorsWriteOptions& opt) {
    std::vector<size_t> order;
    const std::string header = safetensors_header(tensors, opt.metadata, &order);
    uint64_t data_bytes = 0;
    for (const TensorSource& t : tensors) {
        if (!t.fill && t.nbytes() > 0) throw Error(path + ": tensor " + t.name + " has no data source");
        data_bytes += t.nbytes();
    }
    const uint64_t file_bytes = 8 + header.size() + data_bytes;
    const uint64_t total = opt.progress_total ? opt.progress_total : file_bytes;
    uint64_t done = 0;
    auto report = [&]() {
        if (opt.progress) opt.progress(opt.progress_base + done, total);
    };

    OutFile out(path + ".partial", path);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
        len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    out.write(len, 8);
    out.write(header.data(), header.size());
    done = 8 + header.size();
    report();

    // Two buffers: the next block is generated while the previous one is being written.
    const size_t block = std::max<size_t>(opt.block_bytes, 64);
    std::vector<unsigned char> buf[2];
    buf[0].resize(block);
    buf[1].resize(block);
    int cur = 0;
    std::future<void> pending;
    auto wait_pending = [&]() {
        if (pending.valid()) pending.get();
    };
    try {
        for (size_t i : order) {
            const TensorSource& t = tensors[i];
            const uint64_t n = t.nbytes();
            const size_t es = dtype_size(t.dtype);
            const size_t step = block / es * es;
            for (uint64_t off = 0; off < n; off += step) {
                const size_t len_now = static_cast<size_t>(std::min<uint64_t>(step, n - off));
                t.fill(buf[cur].data(), off, len_now);
                wait_pending();
                report();
                const unsigned char* p = buf[cur].data();
                pending = std::async(std::launch::async, [&out, p, len_now]() { out.write(p, len_now); });
                done += len_now;
                cur ^= 1;
            }
        }
        wait_pending();
    } catch (...) {
        if (pending.valid()) pending.wait();
        throw;
    }
    out.commit();
    report();
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<TensorSource>& tensors,
                                             uint64_t max_shard_bytes) {
    std::vector<std::vector<size_t>> shards;
    std::vector<size_t> current;
    uint64_t current_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const uint64_t n = tensors[i].nbytes();
        if (max_shard_bytes > 0 && !current.empty() && current_bytes + n > max_shard_bytes) {
            shards.push_back(std::move(current));
            current.clear();
            current_bytes = 0;
        }
        current.push_back(i);
        current_bytes += n;
    }
    if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
    return shards;
}

ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::vector<TensorSource>& tensors,
                                             const ShardedWriteOptions& opt) {
    // Validate names once over the whole set (duplicates across shards are errors too).
    (void)safetensors_header(tensors, {});
    const auto plan = plan_shards(tensors, opt.max_shard_bytes);
    std::vector<std::vector<TensorSource>> shards;
    for (const auto& s : plan) {
        std::vector<TensorSource> part;
        for (size_t i : s) part.push_back(tensors[i]);
        shards.push_back(std::move(part));
    }

    ShardedWriteResult res;
    for (const TensorSource& t : tensors) res.total_size += t.nbytes();
    const size_t n = shards.size();
    for (size_t k = 0; k < n; ++k)
        res.files.push_back(n == 1 ? opt.prefix + ".safetensors" : shard_name(opt.prefix, k + 1, n));

    SafetensorsWriteOptions fo = opt.file;
    uint64_t total = fo.progress_total;
    if (total == 0) {
        total = fo.progress_base;
        for (const auto& s : shards) total += safetensors_file_size(s, fo.metadata);
    }
    fo.progress_total = total;
    const fs::path root(dir);
    for (size_t k = 0; k < n; ++k) {
        write_safetensors((root / res.files[k]).string(), shards[k], fo);
        fo.progress_base += safetensors_file_size(shards[k], fo.metadata);
    }

    if (n > 1) {
        res.index_file = opt.prefix + ".safetensors.index.json";
        nlohmann::ordered_json wm = nlohmann::ordered_json::object();
        std::map<std::string, std::string> sorted;
        for (size_t k = 0; k < n; ++k)
            for (const TensorSource& t : shards[k]) sorted[t.name] = res.files[k];
        for (const auto& [name, file] : sorted) wm[name] = file;
        nlohmann::ordered_json index = nlohmann::ordered_json::object();
        index["metadata"] = {{"total_size", res.total_size}};
        index["weight_map"] = std::move(wm);
        const std::string text = index.dump(2) + "\n";
        const std::string path = (root / res.index_file).string();
        OutFile out(path + ".partial", path);
        out.write(text.data(), text.size());
        out.commit();
    }
    return res;
}

}  // namespace clef
