# weir's container image: a stripped release binary on a distroless base, as non-root, starting
# on the example overrides file. Build and run:
#   docker build -t weir .
#   docker run --rm -p 8080:8080 -p 9095:9095 weir
#
# Targets (`--target`):
#   runtime (the default, last)  compiles weir in the `build` stage, then the runtime image
#   prebuilt                     the runtime image around target/image/weir from the build
#                                context, a binary built outside (scripts/image-test puts one
#                                there); no Rust toolchain, no compile
#   symbols                      only weir.debug, the debug info stripped from the image's
#                                binary, for profiling: `--target symbols --output out/`
#
# The bases are build arguments so that a machine without a registry can point them at local
# images (scripts/image-test does); the defaults are the public ones.
ARG BUILD_IMAGE=docker.io/library/rust:1-bookworm
# distroless/cc: glibc and libgcc_s, what the binary links against (ldd), and nothing else:
# no shell, no package manager. Upstream TLS uses the compiled-in webpki-roots, so the image
# needs no CA bundle.
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
# The release profile keeps debug info (profiling); the image ships the binary without it and
# keeps it in weir.debug (the `symbols` target), matched to the binary by its build id.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin weir \
    && mkdir /out \
    && objcopy --only-keep-debug target/release/weir /out/weir.debug \
    && objcopy --strip-all target/release/weir /out/weir

FROM scratch AS symbols
COPY --from=build /out/weir.debug /weir.debug

# What both runtime targets share: everything but the binary.
FROM ${RUNTIME_IMAGE} AS runtime-base
COPY runtime-config/overrides.yaml /etc/weir/overrides.yaml
# A fleet also needs gossip reachable from the other replicas, e.g.
#   -e WEIR_GOSSIP_ADDR=0.0.0.0:7946 -e WEIR_GOSSIP_ADVERTISE_ADDR=<pod IP>:7946 \
#   -e WEIR_JOIN=<peer>:7946,... ; alone, the replica is a ring of one.
ENV WEIR_HTTP_ADDR=0.0.0.0:8080 \
    WEIR_GRPC_ADDR=0.0.0.0:9095 \
    WEIR_RUNTIME_CONFIG=/etc/weir/overrides.yaml
EXPOSE 8080/tcp 9095/tcp 7946/udp
# Numeric, so it needs no /etc/passwd entry; deploy/kubernetes/deployment.yaml runs as the same.
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/weir"]

FROM runtime-base AS prebuilt
COPY target/image/weir /usr/local/bin/weir

FROM runtime-base AS runtime
COPY --from=build /out/weir /usr/local/bin/weir
