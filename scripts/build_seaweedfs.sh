#!/usr/bin/env bash
# Build SeaweedFS's `weed` binary once into a cache and print its path (the last line of
# stdout). The tests' second S3 server (AIRFLOW_CKPT_TEST_S3=seaweedfs) runs it as
# `weed mini`. The version is pinned here and nowhere else.
#
# `go install github.com/seaweedfs/seaweedfs/weed@<version>` is refused because that
# module's go.mod has a replace directive; a wrapper module, generated in a temporary
# directory, requires it and repeats the replace. Nothing of SeaweedFS is committed here.
# Idempotent: an existing binary is reused. A cold build takes ~7 min on 2 cores, ~2 GB
# of Go build cache and leaves a ~230 MB binary; it runs under `nice`.
#
# Environment: AIRFLOW_CKPT_CACHE (default ~/.cache/airflow-ckpt), GO (default go).
set -euo pipefail
SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
cache_root="${AIRFLOW_CKPT_CACHE:-$HOME/.cache/airflow-ckpt}"
out_dir="$cache_root/seaweedfs/$SEAWEEDFS_VERSION"
binary="$out_dir/weed"
if [ "${1:-}" = "--version" ]; then echo "$SEAWEEDFS_VERSION"; exit 0; fi
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi
go="${GO:-go}"
command -v "$go" >/dev/null || { echo "ERROR: Go is required to build SeaweedFS ($go not found)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/seaweedfs-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The wrapper: `go get` adds the requirement (and raises the go line to what it needs).
printf 'module airflowckpt.local/seaweedfs-build\n\nreplace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0\n' >"$work/go.mod"
mkdir -p "$out_dir"
echo "building SeaweedFS $SEAWEEDFS_VERSION into $binary (several minutes on first use)" >&2
(cd "$work" && "$go" get "$SEAWEEDFS_MODULE/weed@$SEAWEEDFS_VERSION" >&2 \
  && nice -n 10 "$go" build -o "$binary.tmp" "$SEAWEEDFS_MODULE/weed" >&2)
mv "$binary.tmp" "$binary"
echo "$binary"
