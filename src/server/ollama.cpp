// Ollama's discovery API (docs/API.md, "Ollama clients"): /api/tags and /api/show in Ollama's shapes.
#include <string_view>
#include <utility>
#include <variant>

#include "io/gguf.h"
#include "model/gguf_keys.h"
#include "server/server_impl.h"
#include "util/text.h"

namespace clef {

std::string ollama_error(const std::string& message) {
    return write_json(JsonValue::object({{"error", JsonValue::string(message)}}));
}

namespace {

// Ollama's `details` of a model (/api/tags, /api/show).
JsonValue ollama_details(const ModelCard& m) {
    const std::string level = ascii_upper(m.quantization);
    return JsonValue::object({{"parent_model", str("")},
                              {"format", str(m.format)},
                              {"family", str("clef")},
                              {"families", JsonValue::array({str("clef")})},
                              {"parameter_size", str(parameter_size_text(m.parameter_count))},
                              {"quantization_level", str(level)}});
}

// Ollama's `model_info`: the GGUF metadata keys of llama.cpp's clef architecture that the card lists
// (model/gguf_keys.h, as clef convert writes them), from the loaded configs.
JsonValue ollama_model_info(const ModelCard& m) {
    auto i = [](int64_t v) { return JsonValue::integer(v); };
    JsonValue info = JsonValue::object({{gguf_general::kArchitecture, str("clef")},
                                        {gguf_general::kBasename, str(m.name)},
                                        {gguf_general::kParameterCount, i(m.parameter_count)}});
    if (m.file_type >= 0) info.set(gguf_general::kFileType, i(m.file_type));
    if (m.quantization_version >= 0) info.set(gguf_general::kQuantizationVersion, i(m.quantization_version));
    auto show = [&](const auto& keys, const auto& config) {
        for (const auto& k : keys) {
            if (!(k.uses & kGgufShown)) continue;
            // The context a RoPE scaling reaches (TextConfig::context_length), as the card's context_length.
            const bool context = std::string_view(k.name) == gguf_key::kContextLength;
            info.set(std::string("clef.") + k.name,
                     i(context ? m.context_length : std::get<int64_t>(*k.value(config))));
        }
    };
    show(gguf_text_keys(), m.config.text);
    if (m.head) show(gguf_head_keys(), *m.head);
    return info;
}

}  // namespace

// GET /api/tags (Ollama's model list): the loaded model under its canonical name; nothing while it loads.
void Server::Impl::handle_ollama_tags(httplib::Response& res) {
    std::vector<JsonValue> models;
    if (ready) {
        const ModelCard& m = loaded_card;
        models.push_back(JsonValue::object({{"name", str(m.name)},
                                            {"model", str(m.name)},
                                            {"modified_at", str(m.modified_at)},
                                            {"size", JsonValue::integer(static_cast<int64_t>(m.size_bytes))},
                                            {"digest", str(m.digest)},
                                            {"details", ollama_details(m)}}));
    }
    respond(res, 200, write_json(JsonValue::object({{"models", JsonValue::array(std::move(models))}})));
}

// POST /api/show {"model": NAME} (or "name"): Ollama's model details; 404 for a name the model does not
// answer to. Any Content-Type but multipart is read as JSON (Ollama's own examples send `curl -d`, a form
// type).
void Server::Impl::handle_ollama_show(const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& read) {
    if (req.is_multipart_form_data()) {
        HardenedHttpServer::close_after_response(res);
        respond(res, 415, ollama_error("the body must be JSON"));
        return;
    }
    std::string text;
    if (!read_body(res, read, text)) return;
    JsonValue body;
    JsonParseError perr;
    JsonParseOptions popt;
    popt.max_depth = opt.max_json_depth;
    if (!parse_json(text, body, perr, popt) || !body.is_object()) {
        respond(res, 400, ollama_error("invalid JSON body"));
        return;
    }
    const JsonValue* name = body.find("model");
    if (!name || !name->is_string()) name = body.find("name");
    if (!name || !name->is_string() || name->as_string().empty()) {
        respond(res, 400, ollama_error("model is required"));
        return;
    }
    if (!ready) {
        res.set_header("retry-after", "1");
        respond(res, 503, ollama_error(load_failed ? "the model failed to load" : "the model is loading"));
        return;
    }
    if (!known_model(name->as_string())) {
        respond(res, 404, ollama_error("model '" + name->as_string() + "' not found"));
        return;
    }
    const ModelCard& m = loaded_card;
    respond(res, 200,
            write_json(JsonValue::object({{"details", ollama_details(m)},
                                          {"model_info", ollama_model_info(m)},
                                          {"capabilities", capabilities_json(m)},
                                          {"modified_at", str(m.modified_at)}})));
}

}  // namespace clef
