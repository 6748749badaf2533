# docker/proxy.Dockerfile: the nginx in front of the attnd replicas (docker/compose.yaml), built
# from Debian bookworm's own nginx package: the same nginx that tests/topology/run.sh tests the
# configuration with, and one that builds without Docker Hub. Build context: the repository root.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx curl \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/nginx/sites-enabled/default \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
COPY docker/nginx.conf /etc/nginx/conf.d/attnd.conf
EXPOSE 8080
# SIGQUIT is nginx's graceful shutdown: in-flight requests (and streams) finish first.
STOPSIGNAL SIGQUIT
HEALTHCHECK --interval=15s --timeout=3s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8080/healthz || exit 1
CMD ["nginx", "-g", "daemon off;"]
