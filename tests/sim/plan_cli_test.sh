#!/usr/bin/env bash
# `kvroute-sim plan` as an operator runs it: the seed's figures in its output, clear errors with exit status 2.
#   usage: plan_cli_test.sh PATH/TO/kvroute-sim
set -euo pipefail
sim="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {  # expect NEEDLE OUTPUT
  grep -qF -- "$1" <<<"$2" || { echo "$2" >&2; fail "expected '$1'"; }
}

out=$("$sim" plan llama-3.1-8b --gpu h100-80gb --context 32K --concurrency 14 --allowance-gib 8)
expect "left for KV                         56.7 GiB" "$out"
expect "verdict: fits" "$out"
expect "--worker-max-seqs 14" "$out"

out=$("$sim" plan llama-3.1-70b --gpu h200-141gb --context 8K --concurrency 45 --kv-dtype fp8 --weights-dtype fp8)
expect "one worker holds 44 of the 45 sequences" "$out"
expect "GPUs needed: 2" "$out"

out=$("$sim" plan llama-3.1-8b --context 20K --concurrency 32 --shared-prefix 16K --sharing-users 32)
expect "1. shared prefix: 147,456 cached tokens" "$out"
expect "4.4x fewer cached tokens" "$out"

# A config.json file works as well as a built-in name (the 70B's shape: 320 KiB per token at 16 bits).
cfg=$(mktemp --suffix=.json)
trap 'rm -f "$cfg"' EXIT
printf '{"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
  "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16"}' >"$cfg"
out=$("$sim" plan "$cfg" --context 8K --concurrency 16 --gpus-per-worker 4)
expect "KV of all sequences                 40.0 GiB" "$out"

for bad in "--context 0" "--kv-dtype int4" "--shared-prefix 8K --context 8K" "--bogus 1" "--gpu tpu"; do
  # shellcheck disable=SC2086
  if err=$("$sim" plan llama-3.1-8b $bad 2>&1); then fail "accepted: $bad"; fi
  rc=0; "$sim" plan llama-3.1-8b $bad >/dev/null 2>&1 || rc=$?
  [[ $rc -eq 2 && "$err" == plan:* ]] || fail "'$bad': exit $rc, message '$err'"
done
echo "ok: kvroute-sim plan"
