# clef.cpp server image (docs/DEPLOY.md). Build:  docker build -t clef .
# Run:    docker run -p 8080:8080 -v /srv/models:/models:ro -e CLEF_API_KEYS=KEY clef
#         (serves /models/clef-flash; another model: append `serve --host 0.0.0.0 --model /models/FILE.gguf ...`,
#         or `--model ORG/NAME` from the Hugging Face Hub, cached in the /data volume)
# The kernels pick the CPU's instruction set at run time (Highway, oneDNN), so one image fits every x86-64 host.

# ---- build: the Debian 12 packages of scripts/setup that the `clef` binary needs (no test or bench tools) ----
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev libspdlog-dev libfmt-dev \
      libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev \
      libdnnl-dev libhwy-dev \
      libpng-dev libjpeg62-turbo-dev libwebp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLEF_BUILD_TESTS=OFF -DCLEF_BUILD_BENCH=OFF \
 && cmake --build build --target clef \
 && strip build/clef

# ---- runtime: the shared libraries `ldd build/clef` lists, and the CA certificates of `clef pull`'s HTTPS ----
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
      libcpp-httplib0.11 libdnnl2 libhwy1 libgomp1 libfmt9 libpcre2-8-0 libutf8proc2 \
      libpng16-16 libjpeg62-turbo libwebp7 libwebpdemux2 libssl3 libbrotli1 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home --shell /usr/sbin/nologin clef \
 && mkdir -p /models /data/huggingface \
 && chown -R clef:clef /data
COPY --from=build /src/build/clef /usr/local/bin/clef

# Weights are mounted at /models (read-only is enough); /data holds the Hugging Face cache (`clef pull`).
ENV HF_HOME=/data/huggingface
VOLUME ["/models", "/data"]
USER clef
EXPOSE 8080
# GET /ready answers 200 once the model is loaded and warmed up (503 before). bash's /dev/tcp does the request,
# so the image needs no curl; CLEF_HEALTH_PORT follows a changed --port. Loading a 9B model takes minutes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${CLEF_HEALTH_PORT:-8080} && printf 'GET /ready HTTP/1.0\\r\\n\\r\\n' >&3 && read -r _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["clef"]
# --cache-mib: the state cache's budget is set explicitly because clef sizes its default from the host's
# MemAvailable, which a container's memory limit does not lower.
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--model", "/models/clef-flash", "--cache-mib", "2048"]
