#!/usr/bin/env bash
# gpt_peer's pipelines with two stages per rank (interleaved 1F1B,
# interleaved zero-bubble, ZBV) under torchrun on NCCL, world 1 (every hand-off goes to the same rank;
# gloo cannot do that for ZBV, so the CPU test leaves it out), gpt-1.3b's sizes at 8 blocks, beside the
# one-stage 1F1B and the eager run: each exits 0 and has the same last loss (bf16). Then
# multi_gpu_faults.sh's one-GPU refusals. `OUT=DIR bash bench/probes/peer_pipeline_schedules_one_gpu.sh`.
set -uo pipefail
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--layers 8 --steps 4 --warmup 2)
fields() { grep -o '"step_s": [^,]*\|"loss": [^,]*\|"split": [^]]*]' "$1" | tr '\n' ' '; }
for sch in 1f1b interleaved-1f1b zb-interleaved zbv; do
  timeout 180 python3 -m torch.distributed.run --standalone --nproc_per_node=1 tools/peer/gpt_peer.py \
    --mode pipeline --schedule "$sch" --microbatches 8 "${common[@]}" >"$out/pp_$sch.log" 2>&1
  echo "$sch: exit $? $(fields "$out/pp_$sch.log") $(grep -m1 -o '[A-Za-z]*Error.*' "$out/pp_$sch.log" | cut -c1-200)"
done
timeout 180 python3 tools/peer/gpt_peer.py --mode eager --eager-microbatches 8 "${common[@]}" >"$out/eager.log" 2>&1
echo "eager: exit $? $(fields "$out/eager.log")"
bash bench/probes/multi_gpu_faults.sh 1 2>&1 | tail -6
