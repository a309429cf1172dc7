# Multi-stage build of the weir binary. Runs as non-root and starts on the example overrides.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin weir

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home weir
COPY --from=build /src/target/release/weir /usr/local/bin/weir
COPY runtime-config/overrides.yaml /etc/weir/overrides.yaml
# A fleet also needs gossip reachable from the other replicas, e.g.
#   -e WEIR_GOSSIP_ADDR=0.0.0.0:7946 -e WEIR_GOSSIP_ADVERTISE_ADDR=<pod IP>:7946 \
#   -e WEIR_JOIN=<peer>:7946,... ; alone, the replica is a ring of one.
ENV WEIR_HTTP_ADDR=0.0.0.0:8080 \
    WEIR_GRPC_ADDR=0.0.0.0:9095 \
    WEIR_RUNTIME_CONFIG=/etc/weir/overrides.yaml
EXPOSE 8080/tcp 9095/tcp 7946/udp
USER 10001
ENTRYPOINT ["/usr/local/bin/weir"]
