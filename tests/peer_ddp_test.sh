#!/usr/bin/env bash
# The peers' distributed modes on CPU (fp32, gloo, torchrun --standalone on loopback, 2 processes) and
# gpt_peer's pipelines (1F1B, interleaved 1F1B, interleaved zero-bubble); and
# bench/bench_pipeline's argument checks and skipped rows, without a GPU: gpt_peer.py's and
# llama_peer.py's ddp mode, bare and over a compiled module (backend aot_eager: Dynamo and AOTAutograd,
# forward and backward, without Inductor's C++ code generation, which takes over a minute here), end
# with the one-process run's last loss within 1e-5 relative (the same global batch: gradients averaged
# right); wrong launches refused in one line; bench_pipeline refuses unknown rows before making anything,
# lists each family's rows, and prints "skipped: needs N GPUs" rows on a host without GPUs.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs transformers).
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
gpt=$PWD/tools/peer/gpt_peer.py
llama=$PWD/tools/peer/llama_peer.py
bench=$PWD/bench/bench_pipeline
checkout=$(dirname "$(dirname "$(readlink -f tests/peer_ddp_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
if [ ! -f "$gpt" ] || [ ! -f "$llama" ] || [ ! -x "$bench" ]; then
  echo "peer_ddp_test: the peers or bench_pipeline not found in $PWD"; exit 1
fi
"$py" -c "import transformers, torch" 2>/dev/null \
  || { echo "peer_ddp_test: $py has no transformers or torch: run tools/setup (or set STAGEHAND_PYTHON)"; exit 1; }

t=$(mktemp -d "${TEST_TMPDIR:-/tmp}/peer_ddp_test.XXXXXX")
trap 'rm -rf "$t"' EXIT
# Whatever torch caches goes under $t (removed with it); one thread per process on a shared machine.
export TORCHINDUCTOR_CACHE_DIR=$t/inductor TRITON_CACHE_DIR=$t/triton XDG_CACHE_HOME=$t/cache OMP_NUM_THREADS=1
fail() { echo "peer_ddp_test: FAILED: $*"; exit 1; }
passed=0
ok() { echo "peer_ddp_test: ok: $*"; passed=$((passed + 1)); }

# show_log NAME: a failed run's whole log, the workers' own output (their tracebacks, a C++ abort's
# message) included, not only torchrun's summary at its end (bounded: the last 400 lines).
show_log() {
  echo "---- $1: its output ($(wc -l <"$t/$1.log") lines, the last 400 shown) ----"
  tail -n 400 "$t/$1.log"
  echo "---- end of $1's output ----"
}
small=(--device cpu --preset tiny --global-batch 8 --warmup 1 --steps 2)
# run NAME PEER ARGS...: one process; torchrun NAME PEER ARGS...: two. Each bounded; the log kept in $t.
run() {
  local name=$1 rc=0; shift
  timeout -k 10 180 "$py" "$@" >"$t/$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { show_log "$name"; fail "$name exited $rc"; }
}
torchrun2() {
  local name=$1 rc=0; shift
  timeout -k 10 240 "$py" -m torch.distributed.run --standalone --nproc_per_node=2 "$@" >"$t/$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { show_log "$name"; fail "$name exited $rc"; }
}
# field NAME KEY: the RESULT line's KEY (JSON).
field() {
  "$py" - "$t/$1.log" "$2" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")]
assert len(lines) == 1, f"{len(lines)} RESULT lines in {sys.argv[1]}"
print(json.dumps(json.loads(lines[0][len("RESULT "):])[sys.argv[2]]))
EOF
}
# same_loss A B: the last losses agree within 1e-5 relative.
same_loss() {
  local a b
  a=$(field "$1" loss) b=$(field "$2" loss)
  "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(a))" "$a" "$b" \
    || fail "$2's last loss $b is not $1's $a"
  echo "$b"
}
# ddp_checks NAME COMPILED: world 2, two peaks (null on CPU), 2 micro-batches of 2 per rank, compiled or not.
ddp_checks() {
  [ "$(field "$1" world)" = 2 ] || fail "$1: world $(field "$1" world)"
  [ "$(field "$1" peak_gib)" = "[null, null]" ] || fail "$1: peak_gib $(field "$1" peak_gib)"
  [ "$(field "$1" microbatches)" = 2 ] || fail "$1: microbatches $(field "$1" microbatches)"
  [ "$(field "$1" compile)" = "$2" ] || fail "$1: compile $(field "$1" compile)"
  local graphs
  graphs=$(field "$1" graphs)
  if [ "$2" = true ]; then
    [ "$(field "$1" compile_backend)" = '"aot_eager"' ] || fail "$1: compile_backend $(field "$1" compile_backend)"
    [ "$graphs" -ge 1 ] || fail "$1: --compile compiled no graph"
  else
    [ "$graphs" = 0 ] || fail "$1: $graphs graphs compiled without --compile"
  fi
}
# refused NAME WANT COMMAND...: a non-zero exit (not a timeout) and WANT in the last line (under
# torchrun, whose own failure report comes last: in a line of each rank's).
refused() {
  local name=$1 want=$2; shift 2
  local out rc=0 line
  out=$(timeout -k 10 120 "$@" 2>&1) || rc=$?
  case "$rc" in 0 | 124 | 137) fail "$name: expected a refusal, got exit $rc: $out" ;; esac
  if [[ "$*" == *torch.distributed.run* ]]; then
    line=$(printf '%s\n' "$out" | grep -F -- "$want" | head -n 1)
  else
    line=$(printf '%s\n' "$out" | tail -n 1)
  fi
  [[ "$line" == *"$want"* ]] || fail "$name: expected '$want' in: $out"
  ok "$name refused: $line"
}

# 1. gpt_peer: one process (4 micro-batches of 2) against DDP on 2 ranks (2 micro-batches of 2 each).
run gpt_eager "$gpt" --mode eager "${small[@]}"
torchrun2 gpt_ddp "$gpt" --mode ddp --ddp-microbatch 2 "${small[@]}"
ddp_checks gpt_ddp false
ok "gpt_peer ddp on 2 ranks: last loss $(same_loss gpt_eager gpt_ddp), as one process"
torchrun2 gpt_ddp_compile "$gpt" --mode ddp --ddp-microbatch 2 --compile --compile-backend aot_eager "${small[@]}"
ddp_checks gpt_ddp_compile true
ok "gpt_peer ddp over the compiled module: $(field gpt_ddp_compile graphs) graph(s), last loss $(same_loss gpt_eager gpt_ddp_compile)"

# 1b. gpt_peer's torch.distributed.pipelining on 2 ranks, 4 micro-batches of 2: one stage per rank (1F1B)
# and two per rank (interleaved 1F1B, interleaved zero-bubble), each with one process's last loss.
# (zbv is not run here: its middle rank passes activations to itself, which gloo has no pair for.)
for sch in 1f1b interleaved-1f1b zb-interleaved; do
  torchrun2 "gpt_pipe_$sch" "$gpt" --mode pipeline --schedule "$sch" --microbatches 4 "${small[@]}"
  ok "gpt_peer pipeline $sch on 2 ranks, split $(field "gpt_pipe_$sch" split): last loss $(same_loss gpt_eager "gpt_pipe_$sch"), as one process"
done

# 2. llama_peer (Hugging Face's LlamaForCausalLM): the same.
run llama_train "$llama" --mode train "${small[@]}"
torchrun2 llama_ddp "$llama" --mode ddp --ddp-microbatch 2 "${small[@]}"
ddp_checks llama_ddp false
ok "llama_peer ddp on 2 ranks: last loss $(same_loss llama_train llama_ddp), as one process"
torchrun2 llama_ddp_compile "$llama" --mode ddp --ddp-microbatch 2 --compile --compile-backend aot_eager "${small[@]}"
ddp_checks llama_ddp_compile true
ok "llama_peer ddp over the compiled module: $(field llama_ddp_compile graphs) graph(s), last loss $(same_loss llama_train llama_ddp_compile)"

# 3. Wrong launches, each in one line.
refused "llama ddp without torchrun" "needs torchrun" "$py" "$llama" --mode ddp "${small[@]}"
refused "llama train under torchrun" "single-process" env WORLD_SIZE=2 "$py" "$llama" --mode train "${small[@]}"
refused "gpt pipeline --compile" "--compile applies to --mode eager, infer and ddp" "$py" "$gpt" --mode pipeline --compile "${small[@]}"
refused "gpt pipeline interleaved-1f1b, one count per rank" "must have 4 block counts (one per stage, two per rank)" \
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 "$gpt" --mode pipeline --schedule interleaved-1f1b \
  --split 2,2 "${small[@]}"
refused "llama ddp, batch 6 on 2 ranks in micro-batches of 2" "3 sequences per rank are not divisible by --ddp-microbatch 2" \
  "$py" -m torch.distributed.run --standalone --nproc_per_node=2 "$llama" --mode ddp --ddp-microbatch 2 \
  --device cpu --preset tiny --global-batch 6 --steps 1

# 4. bench_pipeline: syntax (and shellcheck where installed), the rows, refusals before anything is made.
bash -n "$bench" || fail "bash -n bench/bench_pipeline"
if command -v shellcheck >/dev/null; then
  shellcheck "$bench" || fail "shellcheck bench/bench_pipeline"
  ok "shellcheck bench/bench_pipeline"
fi
for fam in gpt llama; do
  OUT=$t/list "$bench" $fam --list >"$t/$fam.rows" || fail "$fam --list"
  for r in train_1gpu train_1gpu_eager train_1gpu_compile train_2gpu_ddp train_2gpu_ddp_compile train_4gpu_ddp \
      train_4gpu_ddp_compile train_4gpu_1f1b_m8 infer_1gpu_compile train_2gpu_zbv_m32 train_4gpu_i1f1b_m8 \
      train_2gpu_dp2_zero1; do
    grep -q "^$r	" "$t/$fam.rows" || fail "$fam has no row $r: $(cat "$t/$fam.rows")"
  done
  [ "$(cut -f1 "$t/$fam.rows" | sort | uniq -d)" = "" ] || fail "$fam: a row name twice: $(cut -f1 "$t/$fam.rows" | sort | uniq -d)"
done
grep -q "^train_4gpu_pp_zbv_m8	4	peer" "$t/gpt.rows" || fail "gpt has no peer row train_4gpu_pp_zbv_m8"
[ "$("$bench" --list 'train_2gpu_ddp*' | cut -f1 | tr '\n' ' ')" = "train_2gpu_ddp train_2gpu_ddp_compile " ] \
  || fail "a pattern's rows: $("$bench" --list 'train_2gpu_ddp*')"
[ ! -e "$t/list" ] || fail "--list made its output directory"
ok "bench_pipeline rows: gpt $(wc -l <"$t/gpt.rows"), llama $(wc -l <"$t/llama.rows")"
refused "bench_pipeline, an unknown row" "train_9gpu matches no llama row" env OUT="$t/b1" "$bench" llama train_1gpu train_9gpu
refused "bench_pipeline, the family last" "the family (llama) goes first" env OUT="$t/b1" "$bench" train_1gpu llama
refused "bench_pipeline, an unknown option" "unknown option --gpus=2" env OUT="$t/b1" "$bench" --gpus=2
[ ! -e "$t/b1" ] || fail "a refused bench_pipeline made its output directory"

# 5. No GPU visible: every row is skipped with its reason, nothing runs, the table still comes.
CUDA_VISIBLE_DEVICES='' OUT=$t/b2 timeout 60 "$bench" llama 'train_1gpu*' train_2gpu_ddp_compile train_4gpu_ddp \
  >"$t/b2.log" 2>&1 || { cat "$t/b2.log"; fail "bench_pipeline without GPUs exited $?"; }
for want in "| train_1gpu | ours | skipped: needs 1 GPU, the host has 0 |" \
    "| train_1gpu_compile | peer | skipped: needs 1 GPU, the host has 0 |" \
    "| train_2gpu_ddp_compile | peer | skipped: needs 2 GPUs, the host has 0 |" \
    "| train_4gpu_ddp | peer | skipped: needs 4 GPUs, the host has 0 |"; do
  grep -qF "$want" "$t/b2.log" || fail "no '$want' in: $(cat "$t/b2.log")"
done
[ "$(grep -c '^| train_' "$t/b2/llama/table.md")" = 5 ] || fail "table: $(cat "$t/b2/llama/table.md")"
[ "$(ls "$t/b2/llama")" = "$(printf 'rows.tsv\ntable.md')" ] || fail "a skipped row left files: $(ls "$t/b2/llama")"
ok "bench_pipeline without GPUs: 5 rows skipped, each saying why"

echo "$passed passed, 0 failed"
