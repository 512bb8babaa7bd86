#!/usr/bin/env bash
# Issue 16, session 5's last call on one H200 (merged main): launch to first step on a dropped page
# cache with and without the library readahead, the CUDA tests and loss checks of this session's
# mechanisms, gpt-1.3b and tinyllama-1.1b training beside torch.compile (bench/bench_pipeline, same
# call), and gpt-1.3b with this session's training mechanisms off. One tarball; tables last.
set -uo pipefail
out=${OUT:-/tmp/s5f}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s5f_logs work=/tmp/s5f_runs
export XDG_CACHE_HOME=/tmp/s5f_cache
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s5f.tgz" --exclude="*.pt" --exclude="trace.json" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"' EXIT
run=dist/bundle/run
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "== launch to first step (gpt-1.3b, --steps=3): warm0 writes the readahead list; then dropped caches"
cold() {  # NAME [FLAGS...]
  local name=$1; shift
  timeout 120 $run launcher --gpus=1 --model=gpt-1.3b --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 \
    --global_batch=32 --overwrite --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  printf "| %s | %s |\n" "$name" "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('launch_to_first_step_seconds'))" "$work/$name/report.json" 2>/dev/null)" | tee -a "$logs/cold.md"
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null; rm -rf "$work/$name"
}
cold warm0
for i in 1 2; do
  sync; echo 3 >/proc/sys/vm/drop_caches; cold cold_on$i
  sync; echo 3 >/proc/sys/vm/drop_caches; cold cold_off$i --prefetch_libraries=false
done
echo "== CUDA tests"
for t in adamw_test embedding_grad_test bias_grad_test; do
  timeout 90 $run $t >"$logs/$t.log" 2>&1; echo "$t rc $?"
done
timeout 150 $run gpt_stage_test --gtest_filter='*Cuda*' >"$logs/gpt_stage_test.log" 2>&1; echo "gpt_stage_test *Cuda* rc $?"
timeout 120 $run llama_stage_test --gtest_filter='*Cuda*' >"$logs/llama_stage_test.log" 2>&1; echo "llama_stage_test *Cuda* rc $?"
grep -hE "^\[  FAILED|Failure|worst difference" "$logs"/*_test.log | head -12
echo "== losses, mechanisms on and off"
PIPELINE_CHECK_ONLY='^(train_1gpu|fused_optimizer_1gpu|llama_fused_optimizer_1gpu|fused_bias_grad_1gpu|fused_norm_backward_1gpu|llama_fused_norm_backward_1gpu|fused_gelu_1gpu) ' \
  OUT="$logs/check" timeout 200 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$logs/check.log"
echo "== gpt-1.3b with this session's training mechanisms off (same call)"
OUT="$logs/off" bash bench/probes/rows.sh gpt_on:gpt-1.3b:train gpt_optimizer_off:gpt-1.3b:train:--model_option=fused_optimizer=false \
  gpt_s5_off:gpt-1.3b:train:--model_option=fused_optimizer=false,fused_embedding_grad=false 2>&1 | tail -5
for fam in gpt llama; do
  BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 250 bench/bench_pipeline $fam train_1gpu train_1gpu_compile >"$logs/bench_$fam.txt" 2>&1
done
echo "| cold-start run | launch to first step s |"; cat "$logs/cold.md"
for fam in gpt llama; do echo "== $fam"; sed -n '/^| run/,$p' "$logs/bench_$fam.txt"; done
