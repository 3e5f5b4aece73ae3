// safetensors writer: streams named tensors to disk, block by block, in the layout of the reference library
// (huggingface/safetensors): the data section is ordered by dtype (widest first: F32 before BF16 before F16),
// then by name; the header lists "__metadata__" first and then the tensors in data order, as compact JSON
// padded with spaces to a multiple of 8 bytes, so every data offset is 8-byte aligned relative to the file.
// Given the same tensors and metadata (at most one metadata key: the reference keeps several in hash order,
// we sort them), the output is byte-identical to what `safetensors.torch.save_file` writes; the tests check
// this on the tiny-clef fixture's files.
//
// Sharded checkpoints follow the Hugging Face publisher layout: model-00001-of-0000N.safetensors plus
// model.safetensors.index.json ({"metadata": {"total_size": ...}, "weight_map": {name: shard}}).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace clef {

// Produces a tensor's bytes: writes `nbytes` bytes of the tensor, starting `offset` bytes into its data, to
// `dst`. The writer calls it with consecutive ranges (offset 0 first), each a whole number of elements. It
// may run OpenMP loops of its own; it is never called from two threads at once.
using TensorFill = std::function<void(unsigned char* dst, uint64_t offset, size_t nbytes)>;

struct TensorSource {
    std::string name;
    DType dtype = DType::BF16;
    std::vector<int64_t> shape;  // [] for a scalar
    TensorFill fill;

    uint64_t numel() const;
    uint64_t nbytes() const;  // numel * dtype size
};

// A source over bytes already in memory (bytes.size() must equal numel * dtype size; checked when written).
TensorSource tensor_from_bytes(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::vector<unsigned char> bytes);
// A source over f32 values, stored as `dtype` (F32, BF16 round-to-nearest-even, or F16).
TensorSource tensor_from_f32(std::string name, DType dtype, std::vector<int64_t> shape,
                             const std::vector<float>& values);

// Called after every block with the bytes written so far (tensor data and headers) and the total to write.
using WriteProgressFn = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

struct SafetensorsWriteOptions {
    std::map<std::string, std::string> metadata;  // "__metadata__" (left out of the header when empty)
    size_t block_bytes = 8u << 20;                // the streaming buffer (two of them are allocated)
    WriteProgressFn progress;
    // Progress offset: bytes already written before this file and the grand total, for multi-file writes.
    // progress receives (progress_base + done, progress_total ? progress_total : this file's size).
    uint64_t progress_base = 0;
    uint64_t progress_total = 0;
};

// The header bytes (JSON padded with spaces to a multiple of 8, without the 8-byte length prefix) for these
// tensors; `order` receives the indices of `tensors` in data order. Throws clef::Error on duplicate or empty
// names, a name "__metadata__", or negative dimensions.
std::string safetensors_header(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<size_t>* order = nullptr);

// Total file size: 8 + header + data.
uint64_t safetensors_file_size(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Writes one safetensors file. The data is streamed through two buffers of block_bytes (generation of one
// block overlaps the write of the previous one), to "<path>.partial" first and renamed on success; on failure
// the partial file is removed and clef::Error("<path>: ...") is thrown.
void write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                       const SafetensorsWriteOptions& opt = {});

struct ShardedWriteOptions {
    uint64_t max_shard_bytes = 0;  // tensor bytes per shard; 0 = no limit (a single file)
    std::string prefix = "model";  // <prefix>.safetensors / <prefix>-00001-of-00003.safetensors
    SafetensorsWriteOptions file;  // applied to every shard (progress covers all shards together)
};

struct ShardedWriteResult {
    std::vector<std::string> files;  // file names (no directory), in shard order
    std::string index_file;          // "<prefix>.safetensors.index.json", or "" for a single file
    uint64_t total_size = 0;         // tensor data bytes over all shards (the index's metadata.total_size)
};

// Splits `tensors` in the given order into shards, Hugging Face style: a tensor that would take the current
// shard past max_shard_bytes starts a new one; a tensor larger than the limit gets a shard of its own. With
// one shard the result is a plain <prefix>.safetensors and no index (as save_pretrained does). Otherwise
// writes <prefix>-0000k-of-0000n.safetensors and the index (indent 2, keys sorted, trailing newline).
ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::vector<TensorSource>& tensors,
                                             const ShardedWriteOptions& opt = {});

// The shard assignment write_sharded_safetensors uses: for each shard, the indices of its tensors.
std::vector<std::vector<size_t>> plan_shards(const std::vector<TensorSource>& tensors,
                                             uint64_t max_shard_bytes);

}  // namespace clef
