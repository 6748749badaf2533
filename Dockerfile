# Dockerfile: attnd in two stages. The build stage only runs `make` (the Makefile is the one place
# that knows how to build); the runtime stage holds the daemon, its four runtime libraries and
# curl for the HEALTHCHECK, and runs as an unprivileged user. Configure it with ATTND_* env vars
# (`docker run --rm attnd --help` lists them); mount Hugging Face model folders under /models.
#
#   docker build -t attnd .          (or: make docker)
#   docker run --rm -p 8080:8080 attnd
#   docker run --rm -p 8080:8080 -v /srv/llama:/models/llama:ro -e ATTND_MODEL=/models/llama attnd

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential pkg-config libmicrohttpd-dev libcjson-dev libopenblas-dev libuv1-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make -j"$(nproc)" WERROR=1 all

FROM debian:bookworm-slim
# libopenblas0-pthread is the threaded OpenBLAS the build stage linked against (libopenblas-dev's
# default); the others are the exact sonames attnd needs (libmicrohttpd.so.12, libcjson.so.1,
# libuv.so.1). curl serves only the HEALTHCHECK below.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libmicrohttpd12 libcjson1 libopenblas0-pthread libuv1 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin attnd \
 && mkdir -p /models
COPY --from=build /src/build/attnd /usr/local/bin/attnd
COPY docker/entrypoint.sh /usr/local/bin/attnd-entrypoint

# Inside a container the daemon must listen on every interface to be reachable through -p;
# outside, its default stays 127.0.0.1.
ENV ATTND_HOST=0.0.0.0 \
    ATTND_PORT=8080
VOLUME ["/models"]
EXPOSE 8080
USER attnd:attnd
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
  CMD curl -fsS -o /dev/null "http://127.0.0.1:${ATTND_PORT}/healthz" || exit 1
ENTRYPOINT ["/usr/local/bin/attnd-entrypoint"]
