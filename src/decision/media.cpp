#include "decision/media.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/tokenizer.h"

namespace clef {

ImageTokenMismatch::ImageTokenMismatch(int64_t t, int64_t f)
    : ImageError(
          "Image features and image tokens do not match, tokens: " + std::to_string(t) +
          ", features: " + std::to_string(f) +
          (t > f
               ? " (the request text contains the literal <|image_pad|> token, which is reserved for images)"
               : "")),
      tokens(t),
      features(f) {}

MediaBlock build_media_block(const Tokenizer& tok, const std::vector<ProcessedImage>& images) {
    MediaBlock m;
    for (const ProcessedImage& img : images) {
        m.text += "<|vision_start|>";
        for (int i = 0; i < img.num_tokens(); ++i) m.text += "<|image_pad|>";
        m.text += "<|vision_end|>";
    }
    m.text += "\n";
    m.ids = tok.encode(m.text);
    return m;
}

std::vector<int32_t> media_token_type_ids(const EncodedPrompt& prompt, const MediaBlock& media,
                                          int32_t image_token_id) {
    std::vector<int32_t> types(prompt.input_ids.size(), 0);
    if (prompt.media_token_offset < 0) return types;
    const size_t begin = static_cast<size_t>(prompt.media_token_offset);
    const size_t end = std::min(types.size(), begin + media.ids.size());
    for (size_t t = begin; t < end; ++t) types[t] = prompt.input_ids[t] == image_token_id ? 1 : 0;
    return types;
}

void check_image_tokens(const std::vector<int32_t>& input_ids, int32_t image_token_id, int64_t features) {
    const int64_t tokens = std::count(input_ids.begin(), input_ids.end(), image_token_id);
    if (tokens != features) throw ImageTokenMismatch(tokens, features);
}

void substitute_image_embeddings(std::vector<float>& x, int64_t hidden, const std::vector<int32_t>& types,
                                 const std::vector<std::vector<float>>& features) {
    int64_t rows = 0, slots = 0;
    for (const auto& f : features) rows += static_cast<int64_t>(f.size()) / hidden;
    for (int32_t v : types) slots += v == 1;
    if (rows != slots) throw ImageTokenMismatch(slots, rows);
    size_t img = 0;
    int64_t row = 0;
    for (size_t t = 0; t < types.size(); ++t) {
        if (types[t] != 1) continue;
        while (row * hidden >= static_cast<int64_t>(features[img].size())) {
            ++img;
            row = 0;
        }
        std::memcpy(x.data() + t * static_cast<size_t>(hidden), features[img].data() + row * hidden,
                    sizeof(float) * static_cast<size_t>(hidden));
        ++row;
    }
}

}  // namespace clef
