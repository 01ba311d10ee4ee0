#!/usr/bin/env bash
# Submits a sharded tessel dataset to Slurm: an array of N shards, then a merge that waits
# for all of them (afterok). Prints the two job ids.
#
#   deploy/slurm/submit.sh N OUT_DIR MERGED_FILE -- DATASET_ARGS...
#
# e.g. deploy/slurm/submit.sh 16 /shared/ds /shared/resnet50.jsonl.gz -- \
#        --network resnet50 --platform avx2-fma --per-task 200
# TESSEL_XTASK (default: target/release/xtask next to this script's repository) must be on a
# file system every node sees, as must OUT_DIR. Extra sbatch options: SBATCH_EXTRA.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage() { echo "usage: $0 N OUT_DIR MERGED_FILE -- DATASET_ARGS..." >&2; exit 2; }
[ $# -ge 4 ] || usage
shards="$1"; out="$2"; merged="$3"; shift 3
[ "$1" = "--" ] || usage
shift
case "$shards" in ''|*[!0-9]*) echo "N must be a positive integer, not '$shards'" >&2; exit 2;; esac
[ "$shards" -ge 1 ] || { echo "N must be at least 1" >&2; exit 2; }
if [ -e "$merged" ]; then
  echo "$merged exists: merge never overwrites; choose another name" >&2
  exit 2
fi
xtask="${TESSEL_XTASK:-$here/../../target/release/xtask}"
[ -x "$xtask" ] || { echo "no xtask binary at $xtask (cargo build --release -p xtask, or set TESSEL_XTASK)" >&2; exit 2; }
xtask="$(cd "$(dirname "$xtask")" && pwd)/$(basename "$xtask")"
mkdir -p "$out" "$(dirname "$merged")"
out="$(cd "$out" && pwd)"
merged="$(cd "$(dirname "$merged")" && pwd)/$(basename "$merged")"

export TESSEL_XTASK="$xtask" TESSEL_OUT="$out" TESSEL_MERGED="$merged" TESSEL_ARGS="$*"
# shellcheck disable=SC2086
array=$(sbatch --parsable ${SBATCH_EXTRA:-} --chdir="$out" --export=ALL \
  --array="0-$((shards - 1))" "$here/dataset-array.sbatch")
array="${array%%;*}"
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_EXTRA:-} --chdir="$out" --export=ALL \
  --dependency="afterok:$array" "$here/merge.sbatch")
merge="${merge%%;*}"
echo "$array $merge"
