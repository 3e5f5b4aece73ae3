// The joint schema head in fp32: turns the backbone's last hidden states into one logit per allowed option of
// every question (docs/ARCHITECTURE.md "The joint head").
//
// The work is split in two stages so that a chunked prefill can feed it later without keeping the hidden
// states:
//   1. features: per position LN_hidden(H)·W_memᵀ (the memory rows), running sums of LN_hidden(H) over the
//      question and option spans, and the last normalised row (HeadFeatureBuilder, fed block by block);
//   2. decide: option queries, evidence routing, option summaries, field layers and scoring
//      (JointHead::decide).
// Memory use is O(T × width) for the memory rows and the attention keys/values; nothing is T × T.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "device/device.h"
#include "io/weight_source.h"
#include "model/config.h"
#include "quant/quant.h"

namespace clef {

struct HeadQuestion {
    int type = 0;                      // 0 noul, 1 choice, 2 score (type_embedding row)
    int span_begin = 0, span_end = 0;  // question (instruction) span [begin, end) in token positions
    std::vector<std::pair<int, int>> option_spans;  // one [begin, end) per option, in encoded option order
};

// Intermediate outputs of the head's submodules, named as in the reference state dict (head_probe.json).
// All row-major fp32. Q = questions, N = options of all questions together, W = width.
struct HeadTrace {
    std::vector<float> memory_projection;             // [T][W]
    std::vector<float> question_projection;           // [Q][W]
    std::vector<float> global_projection;             // [W]
    std::vector<std::vector<float>> evidence_layers;  // per routing layer: [N][W] after that layer
    std::vector<float> option_summary_norm;           // [Q][W]
    std::vector<std::vector<float>> layers;           // per field (decoder) layer: [Q][W] after that layer
    std::vector<float> field_norm;                    // [Q][W]
    std::vector<std::vector<float>> option_norm;      // per question: [n_options][W]
    std::vector<std::vector<float>> residual_scorer;  // per question: [n_options]
};

// What the decide stage needs from the backbone output (stage 1). Means are over the span positions.
struct HeadFeatures {
    int64_t length = 0;                 // T
    std::vector<float> memory;     // [T][W]: LN_hidden(H_t)·W_memᵀ (empty where memory_on_device holds it)
    dev::Tensor memory_on_device;  // the same on the head's device, where it was made there
    std::vector<float> global;          // [hidden]: LN_hidden(H_{T-1})
    std::vector<float> question_mean;   // [Q][hidden]: mean of LN_hidden(H) over each question span
    std::vector<float> option_context;  // [N][hidden]: mean of LN_hidden(H) over each option span
    std::vector<float> option_lexical;  // [N][hidden]: mean of lm_head rows of the option span's ids
};

class JointHead {
public:
    // head_weights: joint_head.safetensors; lm_head: the untied lm_head.weight [vocab][hidden]
    // (BF16/F16/F32/F64). The lm_head rows stay where they are (memory-mapped) and only the rows of
    // option-span ids are read, so the file behind lm_head must outlive this object. Every head tensor is
    // checked by name and shape against cfg (unknown tensors are refused, as a strict state-dict load would),
    // converted to fp32, and the scalars are clamped at ln(100) before exp. Throws clef::Error naming the
    // file and tensor. The projections run as ops::PackedLinear (packed once here, fp32-exact); reference =
    // true keeps the scalar ops::linear instead (the oracle).
    // The matrices and vectors live on `device`, and both stages run on streams of it.
    JointHead(const HeadConfig& cfg, const WeightSource& head_weights, const TensorView& lm_head,
              bool reference = false, dev::Device& device = dev::cpu());
    // The same with the lm_head as a QuantMatrix (a GGUF model's quantised output / token_embd table): the
    // rows of option-span ids are dequantised when needed; lm_head's owner keeps its storage alive.
    JointHead(const HeadConfig& cfg, const WeightSource& head_weights, const QuantMatrix& lm_head,
              bool reference = false, dev::Device& device = dev::cpu());

    const HeadConfig& config() const;
    dev::Device& device() const;  // where the head's weights live and both stages run
    int64_t vocab_size() const;
    float prior_scale() const;    // P = exp(min(prior_logit_scale, ln 100))
    float joint_scale() const;    // J = exp(min(joint_logit_scale, ln 100))
    float residual_gate() const;  // sigmoid(residual_gate)

    // hidden: last_hidden_state [T][hidden_size] (row-major fp32); ids: the T input ids.
    // Returns one logit vector per question (one logit per option). Throws clef::Error on empty/out-of-range
    // spans, questions without options, unknown types, or ids outside the lm_head vocabulary.
    std::vector<std::vector<float>> logits(const float* hidden, int64_t T, const std::vector<int32_t>& ids,
                                           const std::vector<HeadQuestion>& questions,
                                           HeadTrace* trace = nullptr) const;

    // Stage 2 on features built for exactly these questions.
    std::vector<std::vector<float>> decide(const HeadFeatures& features,
                                           const std::vector<HeadQuestion>& questions,
                                           HeadTrace* trace = nullptr) const;

    // Throws clef::Error unless the questions are usable with a sequence of T tokens.
    static void check_questions(int64_t T, const std::vector<HeadQuestion>& questions);

    struct Weights;  // defined in head.cpp

private:
    // Checks cfg, lets set_lexical validate and store the lm_head (Weights::cfg is set), loads the rest.
    JointHead(const HeadConfig& cfg, const WeightSource& head_weights, bool reference, dev::Device& device,
              const std::function<void(Weights&)>& set_lexical);
    friend class HeadFeatureBuilder;
    std::shared_ptr<const Weights> w_;
};

// Stage 1, fed with consecutive blocks of last_hidden_state rows (any block sizes, in order). The lexical
// means are gathered up front from the ids. The head must outlive the builder.
class HeadFeatureBuilder {
public:
    HeadFeatureBuilder(const JointHead& head, int64_t T, const std::vector<int32_t>& ids,
                       const std::vector<HeadQuestion>& questions);
    // rows: the next n positions, [n][hidden_size].
    void add_rows(const float* rows, int64_t n);
    // The same for rows on the head's device (not the CPU), queued on a stream before it runs (a chunk's:
    // Backbone::DeviceRowSink): the memory rows stay on the device, and only the normalised rows of the
    // question and option spans and the last row come back, when the stream syncs. The stream must have run
    // before the builder's next call.
    void add_device_rows(dev::Stream& s, dev::Span rows, int64_t n);
    int64_t rows_done() const { return done_; }
    // The memory rows of the next n positions computed earlier (a cached prompt prefix, [n][width]) instead
    // of their hidden rows. Throws clef::Error when a question or option span starts before done + n.
    void restore_memory(const float* memory_rows, int64_t n);
    // Memory rows [first, rows_done()) computed so far, row-major [.][width] (copied back from the device
    // where they are there).
    const float* memory_rows(int64_t first);
    // Throws clef::Error unless all T rows were added.
    HeadFeatures finish();

private:
    struct Span {
        int64_t begin, end;  // [begin, end) positions
        size_t slot;         // row of sums_: questions first, then options
    };
    // Normalised rows [first, first + n) copied back from the device, summed into the spans by settle().
    struct Fetched {
        int64_t first, n;
        std::vector<float> rows;
    };
    // The span sums and the global row of normalised rows [first, first + n) (rows [n][hidden]).
    void sum_rows(const float* rows, int64_t first, int64_t n);
    // The rows fetched by add_device_rows into the sums (their stream has run).
    void settle();
    // This builder's memory rows on the device (made at its first device rows or restored prefix).
    dev::Span device_memory();
    const JointHead::Weights* w_;
    int64_t T_ = 0;
    int64_t done_ = 0;
    size_t questions_ = 0;
    std::vector<double> sums_;  // [Q + N][hidden], running sums of LN_hidden(H) over each span
    std::vector<Span> spans_;
    std::vector<float> normed_;  // scratch: LN_hidden of the current block
    std::vector<Fetched> fetched_;
    std::vector<float> memory_copy_;  // memory_rows() of rows on the device
    HeadFeatures out_;
};

}  // namespace clef
