#include "io/weight_source.h"

#include <cstring>

#include "util/error.h"

namespace clef {

WeightSource::WeightSource(const Checkpoint& ckpt) : description_(ckpt.description()) {
    auto shared = std::make_shared<Checkpoint>(ckpt);  // shares the mappings
    for (const TensorView* t : shared->all()) add_view(*t);
    keep_alive(std::move(shared));
}

WeightSource::WeightSource(const SafetensorsFile& file) : description_(file.path()) {
    auto shared = std::make_shared<SafetensorsFile>(file);
    for (const TensorView& t : shared->tensors()) add_view(t);
    keep_alive(std::move(shared));
}

const TensorView* WeightSource::find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
}

const TensorView& WeightSource::get(std::string_view name) const {
    const TensorView* t = find(name);
    if (!t) throw Error(description_ + ": missing tensor " + std::string(name));
    return *t;
}

const QuantMatrix* WeightSource::find_matrix(std::string_view name) const {
    auto it = matrices_.find(name);
    return it == matrices_.end() ? nullptr : &it->second;
}

std::vector<std::string> WeightSource::names() const {
    std::vector<std::string> out;
    auto a = by_name_.begin();
    auto b = matrices_.begin();
    while (a != by_name_.end() || b != matrices_.end()) {
        if (b == matrices_.end() || (a != by_name_.end() && a->first < b->first))
            out.push_back((a++)->first);
        else
            out.push_back((b++)->first);
    }
    return out;
}

void WeightSource::add_name(const std::string& name) {
    if (by_name_.count(name) || matrices_.count(name))
        throw Error(description_ + ": tensor " + name + " appears twice");
}

void WeightSource::add_view(TensorView view) {
    add_name(view.name);
    views_.push_back(std::move(view));
    by_name_.emplace(views_.back().name, &views_.back());
}

void WeightSource::add_f32(std::string name, std::vector<int64_t> shape, std::vector<float> values) {
    owned_.push_back(std::move(values));
    TensorView v;
    v.name = std::move(name);
    v.dtype = DType::F32;
    v.shape = std::move(shape);
    v.data = reinterpret_cast<const unsigned char*>(owned_.back().data());
    v.nbytes = owned_.back().size() * sizeof(float);
    v.file = description_;
    if (static_cast<size_t>(v.numel()) != owned_.back().size())
        throw Error(description_ + ": tensor " + v.name + ": value count does not match its shape");
    add_view(std::move(v));
}

void WeightSource::add_matrix(std::string name, QuantMatrix m) {
    add_name(name);
    matrices_.emplace(std::move(name), std::move(m));
}

}  // namespace clef
