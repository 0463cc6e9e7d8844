# Tessera container image: tessera-server (entrypoint), the tessera CLI and tessera-pool.
#
#   podman build --format docker -t tessera .            (or: docker build -t tessera .)
#   podman run -p 50051:50051 -p 9464:9464 -v tessera-data:/data tessera
#
# Where no registry is reachable, deploy/build-image.sh makes the Debian base image locally
# (debootstrap) and passes it as BASE_IMAGE. Build with `--format docker` under podman/buildah:
# the OCI image format has no HEALTHCHECK.
#
# Extra arguments after the image name are appended to the server's flags and win over the
# defaults below, e.g. `... tessera --threads 8` or `... tessera --config /etc/tessera/tessera.yaml`
# (a YAML file is applied first, every flag after it).

ARG BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
# Builder: the Debian -dev packages of scripts/setup, a CPU-only Release build of the binaries.
FROM ${BASE_IMAGE} AS builder
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# Installed before the sources are copied, so that this layer survives source changes.
COPY scripts/setup /src/scripts/setup
RUN /src/scripts/setup && rm -rf /var/lib/apt/lists/*

COPY . /src
# BUILD_JOBS limits the compile parallelism (empty: Ninja's default, cores + 2).
ARG BUILD_JOBS=
# The ccache directory is a build cache mount: rebuilding after a source change recompiles only
# what changed. The CLI target `tessera` is built when the tree has it.
RUN --mount=type=cache,target=/root/.cache/ccache \
    set -eu; \
    export CCACHE_DIR=/root/.cache/ccache; \
    cmake -S /src -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DTESSERA_ENABLE_CUDA=OFF \
      -DTESSERA_BUILD_TESTS=OFF \
      -DTESSERA_BUILD_BENCHMARKS=OFF; \
    targets="tessera-server tessera-pool"; \
    if ninja -C /build -t targets all | grep -q '^tessera:'; then \
      targets="$targets tessera"; \
    else \
      echo "Dockerfile: this tree has no 'tessera' CLI target yet; building $targets" >&2; \
    fi; \
    cmake --build /build --target $targets ${BUILD_JOBS:+--parallel "$BUILD_JOBS"}; \
    strip --strip-unneeded /build/bin/*; \
    ls -l /build/bin

# ---------------------------------------------------------------------------------------------
# Runtime: the same base, only the shared libraries the binaries load (found with ldd + dpkg -S
# on the built binaries; RocksDB and FAISS are linked statically, their compression and BLAS
# libraries are not). libopenblas0-pthread also provides libblas.so.3/liblapack.so.3 for FAISS.
FROM ${BASE_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
      libabsl20220623 \
      libbrotli1 \
      libbz2-1.0 \
      libc-ares2 \
      libcpp-httplib0.11 \
      libgcc-s1 \
      libgfortran5 \
      libgomp1 \
      libgrpc++1.51 \
      libgrpc29 \
      liblz4-1 \
      libopenblas0-pthread \
      libprotobuf32 \
      libre2-9 \
      libsnappy1v5 \
      libssl3 \
      libstdc++6 \
      libyaml-cpp0.7 \
      libzip4 \
      libzstd1 \
      zlib1g \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt/* /var/log/dpkg.log

# A fixed non-root uid/gid (10001), so that Kubernetes securityContext and host bind mounts can
# name it.
RUN groupadd --system --gid 10001 tessera \
 && useradd --system --uid 10001 --gid tessera --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin tessera \
 && mkdir -p /data /etc/tessera \
 && chown tessera:tessera /data \
 && chmod 0750 /data

COPY --from=builder /build/bin/ /usr/local/bin/
COPY deploy/config/tessera.yaml /etc/tessera/tessera.yaml
# Fail the build, not the first start, if a shared library is missing.
RUN set -e; for binary in /usr/local/bin/*; do \
      if ldd "$binary" | grep 'not found'; then echo "missing libraries for $binary" >&2; exit 1; fi; \
    done; \
    tessera-server --help >/dev/null

USER tessera:tessera
WORKDIR /data
VOLUME /data
# gRPC (IngestService, QueryService, AdminService, grpc.health.v1, reflection) and
# Prometheus /metrics + /healthz over HTTP. The REST API is off by default: add
# `--http_listen 0.0.0.0:8080` (with --tls_cert/--tls_key, or --insecure) and publish that port.
EXPOSE 50051 9464
# tessera-server drains in-flight calls on SIGTERM (up to shutdown_grace_seconds, default 10 s),
# flushes and exits 0: give `docker/podman stop -t` (and Kubernetes' grace period) more than that.
STOPSIGNAL SIGTERM
# tessera-server has no client mode and the image carries no curl: an HTTP/1.0 GET over bash's
# /dev/tcp, healthy when the status line says 200. Assumes the default metrics port 9464.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /healthz HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3 && IFS= read -r -t 2 line <&3 && [[ $line == *' 200 '* ]]"]
ENTRYPOINT ["tessera-server", "--data_dir", "/data", "--listen", "0.0.0.0:50051", "--metrics_listen", "0.0.0.0:9464"]
CMD []
