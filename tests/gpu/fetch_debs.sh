#!/usr/bin/env bash
# Downloads the Debian packages tests/gpu/run.sh needs to build on a GPU machine that lacks them (that
# machine reaches no package registry) into .debs/ of the checkout, ignored by git; carry .debs there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$ROOT/.debs"
cd "$ROOT/.debs"
apt-get download libfmt-dev libfmt9 libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1 nlohmann-json3-dev \
  libssl-dev libxxhash-dev
ls -la
