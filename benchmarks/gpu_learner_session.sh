#!/usr/bin/env bash
# Part 22's Ray-free learner checks on a lent GPU, in one device call, most important first:
#   1. weight_sync: the host path before and after the reused pinned staging buffer (target >= 5x)
#   2. fsdp_1p5b,fsdp_7b_cut on ragged rows (--ragged 0.5), four ways: padded, packed (sdpa, dense
#      mask), packed sdpa_varlen (jagged flash), packed flex_attention: MFU on real tokens
#      (targets 0.35 for the 1.5B, 0.40 for the 7B shape)
#   3. fsdp_1p5b,fsdp_offload with one micro-batch per update (--budget 65536): the offload
#      grad-norm gap (docs/design.md "On an H200")
# Each step has its own timeout and writes its JSON lines to $OUT as it goes, so a call cut short
# keeps what finished. No Ray, no vLLM (benchmarks/gpu_learner_check.py).
#
#   run (device): bash benchmarks/gpu_learner_session.sh            (timeout_s 580: the steps take at most 540 s; $OUT set by the tool)
#   smoke (here): OUT=/tmp/x bash benchmarks/gpu_learner_session.sh --cpu-smoke
set -uo pipefail
OUT=${OUT:-/tmp/gpu_learner_session}
mkdir -p "$OUT"
SMOKE=()
[[ "${1:-}" == "--cpu-smoke" ]] && SMOKE=(--cpu-smoke)
export PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
PY=${PYTHON:-python3}
CHECK=(benchmarks/gpu_learner_check.py "${SMOKE[@]}")

step() {  # step NAME SECONDS ARGS...: one gpu_learner_check call, its lines in $OUT/NAME.jsonl
  local name=$1 secs=$2
  shift 2
  echo "=== $(date +%T) $name (timeout ${secs}s)"
  timeout "$secs" "$PY" "${CHECK[@]}" --out "$OUT/$name.jsonl" --time-budget-s $((secs - 10)) "$@" \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -h '"stage": "summary"' "$OUT/$name.jsonl" 2>/dev/null | cut -c1-300
  echo "=== $name rc=$rc"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
step weight_sync 60 --stages weight_sync
step padded 90 --stages fsdp_1p5b,fsdp_7b_cut --ragged 0.5
step packed_sdpa 90 --stages fsdp_1p5b,fsdp_7b_cut --ragged 0.5 --packed
step packed_varlen 90 --stages fsdp_1p5b,fsdp_7b_cut --ragged 0.5 --packed --attn-implementation sdpa_varlen
if [[ ${#SMOKE[@]} -eq 0 ]]; then  # torch has no CPU backward for flex_attention: GPU only
  step packed_flex 90 --stages fsdp_1p5b,fsdp_7b_cut --ragged 0.5 --packed --attn-implementation flex_attention
fi
step offload_one_microbatch 120 --stages fsdp_1p5b,fsdp_offload --steps 1 --budget 65536
echo "=== $(date +%T) done"
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("weight_sync", "padded", "packed_sdpa", "packed_varlen", "packed_flex", "offload_one_microbatch"):
    f = out / f"{name}.jsonl"
    for line in (f.read_text().splitlines() if f.exists() else []):
        r = json.loads(line)
        if r.get("stage") in ("environment", "summary"):
            continue
        keys = ("ok", "tokens_per_s", "mfu", "peak_reserved_gib", "planned_gib", "staging_speedup", "vs_on_device",
                "error")
        print(name, r["stage"], {k: (round(r[k], 4) if isinstance(r.get(k), float) else r[k])
                                 for k in keys if k in r and r[k] is not None})
PYEOF
