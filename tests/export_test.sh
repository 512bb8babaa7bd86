#!/usr/bin/env bash
# --export_dir, --init_from and --inference with weights through the real launcher on CPU workers
# (fp32): a 2-stage llama-tiny export loads in transformers' LlamaForCausalLM and its logits on a fixed
# batch match our C++ stages' on the same export within 1e-4 relative; the same for a GPT export and
# tools/peer/gpt_peer.py; --init_from continues training on 3 stages; an export of a checkpoint without
# training; bad exports and directories refused with one line before anything starts.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs transformers).
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
logits=$PWD/tests/export_logits
check=$PWD/tests/export_check.py
peer=$PWD/tools/peer/gpt_peer.py
checkout=$(dirname "$(dirname "$(readlink -f tests/export_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
[ -x "$launcher" ] && [ -x "$logits" ] || { echo "export_test: launcher or export_logits not found in $PWD"; exit 1; }
"$py" -c "import transformers, torch" 2>/dev/null \
  || { echo "export_test: $py has no transformers or torch: run tools/setup (or set STAGEHAND_PYTHON)"; exit 1; }

t=$(mktemp -d "${TEST_TMPDIR:-/tmp}/export_test.XXXXXX")
trap 'rm -rf "$t"' EXIT
fail() { echo "export_test: FAILED: $*"; exit 1; }
passed=0
ok() { echo "export_test: ok: $*"; passed=$((passed + 1)); }

# Every run: 8 sequences a step in 4 micro-batches, so that runs of any stage count see the same batches.
run() { timeout 180 "$launcher" --device=cpu --global_batch=8 --micro_batches=4 "$@"; }
json() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
# A refusal: exit 2, one line naming $2, and nothing made.
refused() {
  local want=$1; shift
  local out rc=0
  out=$(run "$@" --run_dir="$t/refused" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "expected exit 2 for $* but got $rc: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "expected one line for $*, got: $out"
  [[ "$out" == *"$want"* ]] || fail "expected '$want' in: $out"
  [ ! -e "$t/refused" ] || fail "a refused job made its run directory"
  ok "refused ($want): $out"
}

# 1. llama-tiny on 2 stages: 4 steps, a checkpoint at the end, the export.
run --workers=2 --model=llama-tiny --steps=4 --checkpoint_every=4 --run_dir="$t/a" --export_dir="$t/llama" \
  > "$t/a.log" 2>&1 || { cat "$t/a.log"; fail "the exporting llama-tiny run"; }
for f in config.json model.safetensors.index.json model-00001-of-00002.safetensors model-00002-of-00002.safetensors; do
  [ -f "$t/llama/$f" ] || fail "the export lacks $f: $(ls "$t/llama")"
done
ls -d "$t"/llama.partial-* >/dev/null 2>&1 && fail "a temporary export directory was left behind"
grep -q '"architectures": \["LlamaForCausalLM"\]' "$t/llama/config.json" || fail "config.json: $(cat "$t/llama/config.json")"
ok "llama-tiny export of 2 ranks: $(ls "$t/llama" | tr '\n' ' ')"

# 2. Our C++ stages (3 of them, seeded otherwise) on the export, against transformers.
"$logits" "$t/a/job.textproto" "$t/llama" "$t/ours_llama.safetensors" 3 || fail "export_logits llama"
"$py" "$check" llama "$t/llama" "$t/ours_llama.safetensors" || fail "transformers' logits"
ok "transformers LlamaForCausalLM matches"

# 3. The GPT (tiny) on 2 stages, against gpt_peer.py's model.
run --workers=2 --model=tiny --steps=4 --run_dir="$t/g" --export_dir="$t/gpt" > "$t/g.log" 2>&1 \
  || { cat "$t/g.log"; fail "the exporting tiny run"; }
grep -q '"model_type": "stagehand-gpt"' "$t/gpt/config.json" || fail "GPT config.json: $(cat "$t/gpt/config.json")"
"$logits" "$t/g/job.textproto" "$t/gpt" "$t/ours_gpt.safetensors" 2 || fail "export_logits gpt"
"$py" "$check" gpt "$t/gpt" "$t/ours_gpt.safetensors" "$peer" || fail "gpt_peer's logits"
ok "gpt_peer.py load_export matches"

# 4. --init_from on 3 stages trains on from the export: its first loss is the export's loss on step 0's
# batch (an inference run with the weights on 1 stage reports the same) and not the fresh model's.
run --workers=3 --model=llama-tiny --steps=2 --init_from="$t/llama" --run_dir="$t/b" > "$t/b.log" 2>&1 \
  || { cat "$t/b.log"; fail "the --init_from training run"; }
run --workers=1 --model=llama-tiny --steps=1 --inference --init_from="$t/llama" --run_dir="$t/c" > "$t/c.log" 2>&1 \
  || { cat "$t/c.log"; fail "the --init_from inference run"; }
grep -q "^stagehand: step 1/1  loss .*  perplexity " "$t/c.log" || fail "no perplexity on the progress line: $(cat "$t/c.log")"
grep -q "^stagehand: .* s/step .* tokens/s .*  loss .*  perplexity " "$t/c.log" || fail "no perplexity on the end line: $(cat "$t/c.log")"
fresh=$(json "$t/a/report.json" first_loss) first=$(json "$t/b/report.json" first_loss)
inf=$(json "$t/c/report.json" inference_loss) ppl=$(json "$t/c/report.json" inference_perplexity)
"$py" - "$fresh" "$first" "$inf" "$ppl" <<'EOF' || fail "losses: fresh $fresh, after --init_from $first, inference $inf, perplexity $ppl"
import math, sys
fresh, first, inf, ppl = map(float, sys.argv[1:])
assert abs(first - inf) <= 1e-5 * abs(inf), "training and inference from the export disagree on step 0's batch"
assert fresh - first > 1e-3, "the import changed nothing: its loss is the fresh model's"
assert abs(ppl - math.exp(inf)) <= 1e-9 * ppl, "perplexity is not exp(loss)"
EOF
ok "--init_from: first loss $first = inference loss $inf (perplexity $ppl); the fresh model's $fresh"

# 5. The checkpoint of run 1 exported without training, on 3 workers: the same tensors.
run --workers=3 --model=llama-tiny --resume="$t/a" --export_dir="$t/llama2" --run_dir="$t/e" > "$t/e.log" 2>&1 \
  || { cat "$t/e.log"; fail "the export-only run"; }
grep -q "without training" "$t/e.log" || fail "the export-only run did not say so: $(cat "$t/e.log")"
"$py" "$check" same "$t/llama" "$t/llama2" || fail "the export of the checkpoint differs"
ok "export of a checkpoint without training (3 shards) equals the run's own"

# 6. Refusals.
refused "exists already" --workers=2 --model=llama-tiny --steps=1 --export_dir="$t/llama"
refused "is not a directory" --workers=2 --model=llama-tiny --steps=1 --export_dir="$t/nowhere/x"
refused "intermediate_size" --workers=2 --model=llama-tiny --ffn_hidden=128 --steps=1 --init_from="$t/llama"
refused "model_type" --workers=2 --model=tiny --steps=1 --init_from="$t/llama"
refused "config.json is missing" --workers=2 --model=tiny --steps=1 --init_from="$t/g"
refused "drop one of them" --workers=2 --model=llama-tiny --steps=6 --init_from="$t/llama" --resume="$t/a"
cp -r "$t/gpt" "$t/cut" && truncate -s -100 "$t/cut/model-00002-of-00002.safetensors"
refused "cut/model-00002-of-00002.safetensors" --workers=2 --model=tiny --steps=1 --init_from="$t/cut"
cp -r "$t/gpt" "$t/drop" && "$py" "$check" drop "$t/drop" ln_f.bias
refused "has no tensor ln_f.bias" --workers=2 --model=tiny --steps=1 --init_from="$t/drop"
cp -r "$t/gpt" "$t/shape" && "$py" "$check" reshape "$t/shape" blocks.1.fc1.weight
refused "holds blocks.1.fc1.weight as [255, 64]" --workers=2 --model=tiny --steps=1 --init_from="$t/shape"
cp -r "$t/llama" "$t/extra" && "$py" "$check" extra "$t/extra" model.norm.weight
refused "holds model.norm.weight.extra, which this model has not" --workers=2 --model=llama-tiny --steps=1 \
  --init_from="$t/extra"
cp -r "$t/llama" "$t/mixed" && cp "$t/gpt/model-00002-of-00002.safetensors" "$t/mixed/"
refused "mixed/model-00002-of-00002.safetensors holds" --workers=2 --model=llama-tiny --steps=1 --init_from="$t/mixed"

# 7. A directory that appears under the export's name while the run trains: the rename fails, the
# run fails with a line saying so, the temporary directory is removed, the intruder left as it was.
run --workers=2 --model=tiny --steps=60 --run_dir="$t/late_run" --export_dir="$t/late" > "$t/late.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$t/late_run/steps.csv" ] && [ "$(wc -l < "$t/late_run/steps.csv")" -ge 2 ] && break
  sleep 0.1
done
mkdir "$t/late" && touch "$t/late/keep"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 1 ] || fail "the run whose export could not be renamed exited $rc: $(tail -5 "$t/late.log")"
grep -q "renaming .*late.partial-.* to .*late" "$t/late.log" || fail "no line on the failed rename: $(tail -5 "$t/late.log")"
ls -d "$t"/late.partial-* >/dev/null 2>&1 && fail "the temporary export was left behind: $(ls "$t")"
[ "$(ls "$t/late")" = keep ] || fail "the directory in the export's place changed: $(ls "$t/late")"
ok "an export that cannot be renamed into place fails the run and leaves nothing"

echo "$passed passed, 0 failed"
