#!/usr/bin/env bash
# Pipeline checks on a GPU host, through the bundle (tools/bundle; carry dist/): CUDA graphs change
# nothing but speed, and each other mechanism with a flag to turn it off keeps the losses. The same short gpt-1.3b-shaped jobs (4 blocks, so each takes seconds) run with
# --cuda_graphs=true and =false, and every step's loss must agree: 1 GPU, 2-GPU 1F1B with 8 and 32
# micro-batches, and inference (which has no loss: both must finish); tinyllama-1.1b-shaped jobs too.
# With one GPU visible, the 2-GPU cases are skipped.
# Usage, from the repository root: tests/gpu/pipeline_gpu_check.sh; logs go to $OUT.
set -uo pipefail
out=${OUT:-/tmp/pipeline_gpu_check}
mkdir -p "$out"
run=dist/bundle/run
fail=0
check() { if eval "$2"; then echo "PASS  $1"; else echo "FAIL  $1"; fail=1; fi; }
common=(--model=gpt-1.3b --layers=4 --steps=6)

# same NAME GPUS FLAGS...: runs with and without graphs, compares steps.csv losses (worst relative diff).
same() { same_with cuda_graphs 1e-4 "$@"; }

# same_with FLAG TOL NAME GPUS FLAGS...: runs with --FLAG=true and =false, and every step's loss must agree
# within TOL (relative).
same_with() {
  local flag=$1 tol=$2 name=$3 gpus=$4
  shift 4
  # PIPELINE_CHECK_ONLY=REGEX runs only the cases whose name or flag matches it (one probe's cases).
  [[ "$name $flag" =~ ${PIPELINE_CHECK_ONLY:-} ]] || return
  for g in true false; do
    $run launcher --gpus="$gpus" "${common[@]}" --$flag=$g --overwrite --run_dir="$out/$name.$g" "$@" >"$out/$name.$g.log" 2>&1 ||
      { check "$name, --$flag=$g, exits 0" false; tail -n 5 "$out/$name.$g.log"; return; }
  done
  local worst
  worst=$(python3 - "$out/$name.true/steps.csv" "$out/$name.false/steps.csv" <<'PY'
import csv, sys
def losses(p):
    return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(p)) if r["loss"]}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and a.keys() == b.keys(), (a, b)
print(f"{max(abs(a[k] - b[k]) / abs(b[k]) for k in a):.2e}")
PY
)
  check "$name: losses with --$flag=true and =false agree (worst relative difference $worst, want < $tol)" \
    "[ -n '$worst' ] && python3 -c 'import sys; sys.exit(not float(\"$worst\") < $tol)'"
}

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
same train_1gpu 1 --pipeline_stages=1 --micro_batches=4
same llama_train_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# Parameters drawn on the device are other numbers than the CPU's (the same distributions): the losses
# agree as two draws of one initialisation do, not to rounding.
same_with init_on_device 1e-2 init_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with init_on_device 1e-2 llama_init_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# cuDNN's attention kernels built on threads of their own before step 0: the same kernels, so the
# losses agree as two runs of one job do.
same_with prebuild_attention 1e-4 prebuild_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with prebuild_attention 1e-4 llama_prebuild_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# The GPT's q, k, v gradients written in one pass: copies only, so the losses agree to rounding.
same_with model_option=fused_qkv_grad 1e-4 qkv_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4
# The norms' backward from the bf16 gradient in one kernel, and the loss without fp32 logits: fp32
# arithmetic in another order (and the loss's gradient rounded to bf16 once, as the cast did), so the
# losses agree well within bf16 tolerance (1e-3 relative over 6 steps).
same_with model_option=fused_norm_backward 1e-3 fused_norm_backward_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_norm_backward 1e-3 llama_fused_norm_backward_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
same_with model_option=fused_cross_entropy 1e-3 fused_cross_entropy_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_cross_entropy 1e-3 llama_fused_cross_entropy_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# The residual stream's gradient added inside the norm backward (an add moved: rounding only); Llama's
# rotary embeddings and SwiGLU in one kernel each way (fp32 arithmetic rounded to bf16 once, where
# eager rounds silu(gate) before the product): within bf16 tolerance.
same_with model_option=fused_residual_grad 1e-3 fused_residual_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_residual_grad 1e-3 llama_fused_residual_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
same_with model_option=fused_gelu 1e-3 fused_gelu_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_gelu_gemm 1e-3 fused_gelu_gemm_1gpu 1 --pipeline_stages=1 --micro_batches=4
# The residual adds inside the projections' GEMMs (the branch added in fp32 before rounding, where
# autocast rounds it to bf16 first): within bf16 tolerance.
same_with model_option=fused_residual_gemm 1e-3 fused_residual_gemm_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_residual_gemm 1e-3 llama_fused_residual_gemm_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# Our CUTLASS residual GEMM against cuBLASLt's (the same fp32 sum, another summation order):
# within bf16 tolerance.
same_with model_option=cutlass_residual_gemm 1e-3 cutlass_residual_gemm_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=cutlass_residual_gemm 1e-3 llama_cutlass_residual_gemm_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# The GPT's bias gradients summed in the pass that makes dy (the cast, the q, k, v assembly): fp32 sums
# of the same bf16 values in another order, so within bf16 tolerance.
same_with model_option=fused_bias_grad 1e-3 fused_bias_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4
# The embedding's gradient added into .grad in place, each token's rows summed in position order:
# fp32 sums in another order than ATen's, so within bf16 tolerance.
same_with model_option=fused_embedding_grad 1e-3 fused_embedding_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_embedding_grad 1e-3 llama_fused_embedding_grad_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# AdamW in our one-launch kernel that writes the bf16 copies and zeroes the gradients (ATen's arithmetic
# written out: equal up to rounding).
same_with model_option=fused_optimizer 1e-3 fused_optimizer_1gpu 1 --pipeline_stages=1 --micro_batches=4
same_with model_option=fused_optimizer 1e-3 llama_fused_optimizer_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
same_with model_option=fused_rotary 1e-3 llama_fused_rotary_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
same_with model_option=fused_swiglu 1e-3 llama_fused_swiglu_1gpu 1 --pipeline_stages=1 --micro_batches=4 --model=tinyllama-1.1b
# Inference with bf16 weights only (no fp32 masters): both finish (inference reports no loss; the
# logits' equality is GptStageCuda.LowerDenseWeights_SameLogitsInBf16).
for g in true false; do
  [[ "inference_bf16_weights_$g" =~ ${PIPELINE_CHECK_ONLY:-} ]] || continue
  $run launcher --gpus=1 "${common[@]}" --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4 \
    --model_option=inference_bf16_weights=$g --overwrite --run_dir="$out/infer_bf16.$g" >"$out/infer_bf16.$g.log" 2>&1
  check "inference, 1 GPU, --model_option=inference_bf16_weights=$g, exits 0" "[ $? -eq 0 ]"
done
if [ "$gpus" -lt 2 ]; then
  echo "SKIP  the 2-GPU cases: $gpus GPU visible"
  exit $fail
fi
same train_2gpu_1f1b_m8 2 --schedule=1f1b --micro_batches=8
same train_2gpu_1f1b_m32 2 --schedule=1f1b --micro_batches=32
same llama_train_2gpu_1f1b_m8 2 --schedule=1f1b --micro_batches=8 --model=tinyllama-1.1b
for g in true false; do
  $run launcher --gpus=2 "${common[@]}" --inference --global_batch=64 --micro_batches=16 --cuda_graphs=$g \
    --overwrite --run_dir="$out/infer.$g" >"$out/infer.$g.log" 2>&1
  check "inference, 2 GPUs, 16 micro-batches, --cuda_graphs=$g, exits 0" "[ $? -eq 0 ]"
done
exit $fail
