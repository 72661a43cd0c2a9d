#!/bin/sh
# fuzz_daily.sh FUSION_JIT K ARGS...: `FUSION_JIT fuzz ARGS` with a seed that changes daily (issue 64): the
# day's number (days since 1970-01-01, UTC), or FJ_TEST_SEED when set, times 8 plus K (each batch of the
# suite its own K). The fuzzer prints its seed first: `fusion-jit fuzz --seed N` runs that batch again.
set -eu
cli=$1
k=$2
shift 2
day=${FJ_TEST_SEED:-$(($(date +%s) / 86400))}
exec "$cli" fuzz --seed $((day * 8 + k)) "$@"
