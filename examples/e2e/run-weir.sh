#!/usr/bin/env bash
# Three weir replicas in one ring, forwarding to Prometheus B on 127.0.0.1:9091.
set -euo pipefail
cd "$(dirname "$0")/../.."
weir=target/release/weir
seeds=127.0.0.1:7946,127.0.0.1:7947,127.0.0.1:7948
for i in 1 2 3; do
  "$weir" --http-addr 127.0.0.1:808$i --grpc-addr 127.0.0.1:909$((4 + i)) --gossip-addr 127.0.0.1:794$((5 + i)) --join "$seeds" \
    --runtime-config examples/e2e/overrides.yaml --upstream http://127.0.0.1:9091/api/v1/write &
done
wait
