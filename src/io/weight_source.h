// One weight source: the tensors of a model part by their Hugging Face names, whatever file they come from.
// A safetensors checkpoint (single or sharded) serves its mapped tensors as they are; a GGUF model
// (model/gguf_model.cpp) serves its block-quantised matrices as row panels (QuantMatrix, dequantised row by
// row by their consumer) and its small tensors, converted to the publisher's layout, from memory it owns. The
// loaders of the backbone, the vision tower and the joint head read only this interface.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "quant/quant.h"

namespace clef {

class WeightSource {
public:
    WeightSource() = default;
    // The tensors of a checkpoint / of one safetensors file (shared mappings; the source keeps them alive).
    WeightSource(const Checkpoint& ckpt);       // NOLINT: implicit, a checkpoint is a weight source
    WeightSource(const SafetensorsFile& file);  // NOLINT: implicit, a file is a weight source
    WeightSource(const WeightSource&) = delete;
    WeightSource& operator=(const WeightSource&) = delete;
    WeightSource(WeightSource&&) noexcept = default;
    WeightSource& operator=(WeightSource&&) noexcept = default;

    // Where the tensors come from, for error messages ("<path>" or "<path> (N files)").
    const std::string& description() const { return description_; }
    void set_description(std::string d) { description_ = std::move(d); }

    // A tensor in a float or integer dtype (nullptr when absent or held as a QuantMatrix only).
    const TensorView* find(std::string_view name) const;
    // Throws clef::Error("<description>: missing tensor <name>") when absent.
    const TensorView& get(std::string_view name) const;
    // A matrix held in a ggml block format (or with a row / column map); nullptr when absent.
    const QuantMatrix* find_matrix(std::string_view name) const;
    // Whether the name is served in either form.
    bool has(std::string_view name) const { return find(name) || find_matrix(name); }
    // Every name served, sorted.
    std::vector<std::string> names() const;

    // Building a source (the GGUF reader): a view into memory some `owner` keeps alive, an fp32 tensor the
    // source owns, a quantised matrix. Names must be new.
    void add_view(TensorView view);
    void add_f32(std::string name, std::vector<int64_t> shape, std::vector<float> values);
    void add_matrix(std::string name, QuantMatrix m);
    void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }

private:
    void add_name(const std::string& name);

    std::deque<TensorView> views_;  // stable addresses
    std::deque<std::vector<float>> owned_;
    std::map<std::string, const TensorView*, std::less<>> by_name_;
    std::map<std::string, QuantMatrix, std::less<>> matrices_;
    std::vector<std::shared_ptr<const void>> owners_;
    std::string description_;
};

}  // namespace clef
