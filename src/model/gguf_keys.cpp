#include "model/gguf_keys.h"

#include "ops/rope.h"

namespace clef {

namespace {

using Value = std::optional<GgufMetaValue>;
using T = GgufKeyType;

template <class M>
struct MemberOf;
template <class C, class V>
struct MemberOf<V C::*> {
    using type = C;
};

// The value of an int field of the config (TextConfig or HeadConfig).
template <auto M>
Value integer(const typename MemberOf<decltype(M)>::type& c) {
    return int64_t{c.*M};
}

bool scaled(const TextConfig& c) {
    return c.rope_scaling.type != ops::RopeType::Default;
}
bool yarn(const TextConfig& c) {
    return c.rope_scaling.type == ops::RopeType::Yarn;
}

constexpr unsigned kRead = kGgufWritten | kGgufRequired;  // written, and the reader needs it
constexpr unsigned kReadShown = kRead | kGgufShown;
constexpr unsigned kScaling = kGgufWritten | kGgufScaling;

// llama.cpp's qwen35 hyperparameters (llama-arch.cpp's LLM_KV_*), the order clef convert writes them in.
const GgufMetaKey<TextConfig> kTextKeys[] = {
    {gguf_key::kBlockCount, T::UInt32, "/num_hidden_layers", kReadShown, integer<&TextConfig::num_layers>},
    // Optional to the reader (a file without it: 262,144, model/gguf_model.cpp); the card shows the context
    // a RoPE scaling reaches (server/ollama.cpp).
    {gguf_key::kContextLength, T::UInt32, "/max_position_embeddings", kGgufWritten | kGgufShown,
     integer<&TextConfig::max_position_embeddings>},
    {"embedding_length", T::UInt32, "/hidden_size", kReadShown, integer<&TextConfig::hidden_size>},
    {"feed_forward_length", T::UInt32, "/intermediate_size", kReadShown,
     integer<&TextConfig::intermediate_size>},
    {gguf_key::kHeadCount, T::UInt32, "/num_attention_heads", kReadShown, integer<&TextConfig::num_heads>},
    {gguf_key::kHeadCountKv, T::UInt32, "/num_key_value_heads", kReadShown,
     integer<&TextConfig::num_kv_heads>},
    {"attention.key_length", T::UInt32, "/head_dim", kReadShown, integer<&TextConfig::head_dim>},
    {"attention.value_length", T::UInt32, nullptr, kGgufWritten, integer<&TextConfig::head_dim>},
    {"attention.layer_norm_rms_epsilon", T::Float32, "/rms_norm_eps", kRead,
     [](const TextConfig& c) -> Value { return double{c.rms_norm_eps}; }},
    {"rope.freq_base", T::Float32, "/rope_parameters/rope_theta", kRead,
     [](const TextConfig& c) -> Value { return c.rope_theta; }},
    // Read by hand (model/gguf_model.cpp): partial_rotary_factor is it over the key length.
    {gguf_key::kRopeDimensionCount, T::UInt32, nullptr, kGgufWritten, integer<&TextConfig::rotary_dim>},
    // Four sections, as llama.cpp reads them; read by hand, the first three are mrope_section.
    {gguf_key::kRopeDimensionSections, T::Int32Array, nullptr, kGgufWritten,
     [](const TextConfig& c) -> Value {
         std::vector<int32_t> sections(c.mrope_section.begin(), c.mrope_section.end());
         sections.resize(4, 0);
         return sections;
     }},
    // RoPE scaling: none, linear or yarn (llama.cpp describes no other); an attention factor other than
    // yarn's default goes to yarn_attn_factor, where llama.cpp's converter puts transformers'.
    {gguf_key::kRopeScalingType, T::String, "/rope_parameters/rope_type", kScaling,
     [](const TextConfig& c) -> Value {
         if (!scaled(c)) return std::nullopt;
         return std::string(ops::rope_type_name(c.rope_scaling.type));
     }},
    {"rope.scaling.factor", T::Float32, "/rope_parameters/factor", kScaling,
     [](const TextConfig& c) -> Value { return scaled(c) ? Value(c.rope_scaling.factor) : std::nullopt; }},
    {"rope.scaling.original_context_length", T::UInt32, "/rope_parameters/original_max_position_embeddings",
     kScaling,
     [](const TextConfig& c) -> Value {
         return yarn(c) ? Value(c.rope_scaling.original_max) : std::nullopt;
     }},
    {"rope.scaling.yarn_beta_fast", T::Float32, "/rope_parameters/beta_fast", kScaling,
     [](const TextConfig& c) -> Value { return yarn(c) ? Value(c.rope_scaling.beta_fast) : std::nullopt; }},
    {"rope.scaling.yarn_beta_slow", T::Float32, "/rope_parameters/beta_slow", kScaling,
     [](const TextConfig& c) -> Value { return yarn(c) ? Value(c.rope_scaling.beta_slow) : std::nullopt; }},
    {"rope.scaling.yarn_attn_factor", T::Float32, "/rope_parameters/attention_factor", kScaling,
     [](const TextConfig& c) -> Value {
         const ops::RopeScaling& s = c.rope_scaling;
         if (!yarn(c) || s.attention_factor == ops::yarn_get_mscale(s.factor)) return std::nullopt;
         return s.attention_factor;
     }},
    // 0 where the layer types are not periodic, which clef convert refuses.
    {"full_attention_interval", T::UInt32, "/full_attention_interval", kReadShown,
     [](const TextConfig& c) -> Value { return int64_t{full_attention_interval_of(c.layer_types)}; }},
    {"ssm.conv_kernel", T::UInt32, "/linear_conv_kernel_dim", kReadShown,
     integer<&TextConfig::linear_conv_kernel>},
    {"ssm.state_size", T::UInt32, "/linear_key_head_dim", kReadShown,
     integer<&TextConfig::linear_key_head_dim>},
    {"ssm.group_count", T::UInt32, "/linear_num_key_heads", kReadShown,
     integer<&TextConfig::linear_num_key_heads>},
    {"ssm.time_step_rank", T::UInt32, "/linear_num_value_heads", kReadShown,
     integer<&TextConfig::linear_num_value_heads>},
    // Read by hand: linear_value_head_dim is it over the value heads.
    {gguf_key::kSsmInnerSize, T::UInt32, nullptr, kGgufWritten,
     [](const TextConfig& c) -> Value {
         return int64_t{c.linear_num_value_heads} * c.linear_value_head_dim;
     }},
    // clef's own key (llama.cpp's qwen35 has none: clef convert refuses a sigmoid gate there); absent: silu.
    {"ssm.norm_gate", T::String, "/output_gate_type", kGgufWritten,
     [](const TextConfig& c) -> Value {
         if (c.gdn_norm_gate != ops::NormGate::Sigmoid) return std::nullopt;
         return std::string("sigmoid");
     }},
    // Shown only: a GGUF's vocabulary is its embedding table's rows.
    {"vocab_size", T::UInt32, nullptr, kGgufShown, integer<&TextConfig::vocab_size>},
};

// The joint head's (clef only); its width and feed-forward width are read back from its tensors' shapes.
const GgufMetaKey<HeadConfig> kHeadKeys[] = {
    {"decision.type", T::String, nullptr, kGgufWritten,
     [](const HeadConfig&) -> Value { return std::string("clef"); }},
    {"decision.routing_block_count", T::UInt32, "/routing_layers", kReadShown,
     integer<&HeadConfig::routing_layers>},
    {"decision.block_count", T::UInt32, "/layers", kReadShown, integer<&HeadConfig::layers>},
    {"decision.head_count", T::UInt32, "/heads", kReadShown, integer<&HeadConfig::heads>},
    {"decision.embedding_length", T::UInt32, nullptr, kGgufWritten | kGgufShown, integer<&HeadConfig::width>},
    {"decision.feed_forward_length", T::UInt32, nullptr, kGgufWritten | kGgufShown,
     integer<&HeadConfig::feedforward>},
    // torch.nn.LayerNorm's default, which every norm of the head uses.
    {"attention.layer_norm_epsilon", T::Float32, nullptr, kGgufWritten,
     [](const HeadConfig&) -> Value { return double{1e-5f}; }},
};

}  // namespace

std::span<const GgufMetaKey<TextConfig>> gguf_text_keys() {
    return kTextKeys;
}

std::span<const GgufMetaKey<HeadConfig>> gguf_head_keys() {
    return kHeadKeys;
}

}  // namespace clef
