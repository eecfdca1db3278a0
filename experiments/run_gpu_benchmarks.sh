#!/usr/bin/env bash
# Every GPU benchmark of experiments/ in ONE device call (issue 53, the third GPU round), outputs to $OUT.
#
# Here (where PyPI is reachable), from the root of the checkout the session was started in
# (the device tool sends that checkout, also when a helper calls it), once:
#   bash /work/shared/device/wheels.sh simplejpeg keras keras-hub namex optree
# (it adds /.whl/ to .git/info/exclude, so it stops in a git worktree, where .git is a file:
# there, add /.whl/ to "$(git rev-parse --git-path info/exclude)" and run its pip download.)
# (grain, tfds, ml-collections, ... into .whl/; keras, keras-hub and the two of their
# requirements the GPU image lacks, for the Keras peer: ~16 MB carried in all. Not
# opencv-python-headless or regex/tokenizers: the GPU image has them. The C region decoder is
# not built there: the tree is used from PYTHONPATH, and the input pipeline decodes whole
# images at reduced scale.)
# Then one device call, from the repository root:
#   run(command="bash experiments/run_gpu_benchmarks.sh", carry=[".whl"], timeout_s=590)
# summary.txt ends with the second call for the stages the first had no time for:
#   run(command="STAGES=a,b BUDGET_S=N bash experiments/run_gpu_benchmarks.sh", carry=[".whl"],
#       timeout_s=N+50), N from status's budget_left_s less ~60 s, called while the machine is warm.
# Copy the tables from $OUT/log.txt into experiments/RESULTS.md (GPU section), with the raw lines.
#
# A device command may run 10 minutes, so every stage has a time limit and the whole script
# ends by BUDGET_S (540 s). The stages run most important first (issue 53's items, in its
# order), each cut to the time left and skipped when less is left than it needs (run_stage
# below gives each its need and its limit, in seconds):
#   item 1 (ResNet-50, 224 px, batch 256: img/s, ms/step, TFLOP/s with cuDNN's convolutions,
#           peak memory, each jaxnet row against the best torch row)
#   torch           torch.compile default mode, fused SGD, channels_last, bf16 autocast.
#   bench_train     jaxnet (the recipe's levers on) and the hand-written Flax step, bf16 and fp16.
#   levers_on       item 2 too: the device check of that step (experiments/gpu_device_check.py):
#                   memory, kernels, a profile whose kernels map through their HLO instructions to
#                   layers, each beside the CPU-compiled plan's row for the device's target
#                   (`python -m jaxnet.cli.gpu_plan --json` for h100 and h200, compiled on the
#                   device's CPU in the background meanwhile); the trace comes back compressed.
#   pool_scatter    the device check with one lever off: model.scatter_free_pool=false.
#   b512            the recipe's step at 512 per GPU.
#   stem_pad4, stem_s2d   one stem lever on: model.stem_conv=pad4 / space_to_depth.
#   torch_autotune  torch.compile mode max-autotune-no-cudagraphs (Triton autotuning of the
#                   convolutions: its compile may take minutes, so it comes after the rows that
#                   surely fit and takes what the first call has left).
#   items 3 and 4
#   convnext_tiny, efficientnet_b0   bench_train against torchvision's models, torch.compile
#                   default mode, bf16, batch 256 (128 for EfficientNet-B0).
#   end_to_end      python -m jaxnet.main on a generated folder of ImageNet-sized JPEGs (made in
#                   the background meanwhile), with 16 Grain workers, then on `jaxnet prepare`'s
#                   shards of it, against the same command on synthetic data.
#   vit             ViT-B/16 bf16 batch 256 through the device check (attention FLOPs counted;
#                   after end_to_end: the first round measured it, 2026-11-27).
#   item 1, the rest
#   torch_fp16      torch.compile default mode in fp16 (GradScaler).
#   keras           the Keras 3 (JAX backend) peer, keras-hub ResNet-50 v1.5, bf16.
#   last
#   fcn_torch, fcn  segmentation: torchvision's compiled fcn_resnet50 and jaxnet's, 512 px, batch 16.
#   bench_input     the input pipeline alone.
#   bench_scaling   only with more than one GPU.
# Item 5: on an H100 the same rows are the H100's; summary.txt names the device.
# STAGES=a,b,...: run only those, in that order.
#
# $OUT gets 4 files (at most 8 come back):
#   summary.txt   machine, GPU, versions, each stage's exit status and seconds, every error, the
#                 headline rows against the best torch row, the second call's command
#   log.txt       the full output of every stage, in order (all the tables)
#   results.json  every stage's JSON ({stage: its rows}) and the torch peers' RESULT lines
#   step_trace.json.gz   the profile of the ResNet-50 step (perfetto), when under 15 MB
#
# QUICK=1: a CPU dry run of the same stages with tiny models (PYTHON and TORCH_PYTHON choose
# the interpreters; the device's python3 has both jax and torch; the caller's PYTHONPATH is
# kept after the carried wheels and the tree).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-results}
QUICK=${QUICK:-0}
PYTHON=${PYTHON:-python3}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}
BUDGET_S=${BUDGET_S:-540}
ORDER=(torch bench_train levers_on pool_scatter b512 stem_pad4 stem_s2d torch_autotune
       convnext_tiny efficientnet_b0 end_to_end vit torch_fp16 keras fcn_torch fcn bench_input bench_scaling)
IFS=, read -r -a STAGE_LIST <<< "${STAGES:-$(IFS=,; echo "${ORDER[*]}")}"
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt LOG=$OUT/log.txt
: > "$SUMMARY"; : > "$LOG"
TMP=$(mktemp -d)
export PYTHONUNBUFFERED=1
start=$SECONDS

note() { echo "$*" | tee -a "$SUMMARY"; }
wants() { [[ " ${STAGE_LIST[*]} " == *" $1 "* ]]; }
for s in "${STAGE_LIST[@]}"; do
  [[ " ${ORDER[*]} " == *" $s "* ]] || { note "ERROR: no stage $s (stages: ${ORDER[*]})"; exit 2; }
done

# The GPU machine's image lacks grain, tfds and ml-collections: install the carried wheels.
caller_path=${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" > /dev/null; then
  if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >> "$LOG" 2>&1; then
    note "ERROR: wheel install failed (see log.txt)"; exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD$caller_path
else
  note "no .whl/ carried: assuming grain, tfds and ml-collections are installed"
  export PYTHONPATH=$PWD$caller_path
fi
# The torch peers need none of the carried wheels (a cp312 optree there breaks another
# interpreter's torch in a dry run): the tree and the caller's path only.
TORCH_PATH=$PWD$caller_path

{
  echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC')), stages: ${STAGE_LIST[*]}, budget ${BUDGET_S}s"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
    2>/dev/null || echo "nvidia-smi: not available"
  timeout 120 "$PYTHON" - <<'EOF' 2>&1
import platform
from importlib import metadata
names = ["jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint",
         "grain", "protobuf", "numpy", "torch", "torchvision", "opencv-python-headless", "simplejpeg",
         "keras", "keras-hub"]
def version(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None
found = {n: version(n) for n in names}
print("python " + platform.python_version() + ", " +
      ", ".join(f"{n} {v}" for n, v in found.items() if v))
# grain's protos need protobuf >= 5.28; an older one fails at `import grain`.
pb = tuple(int(x) for x in (found["protobuf"] or "0").split(".")[:2])
if pb < (5, 28):
  print(f"WARNING: protobuf {found['protobuf']} < 5.28: grain will not import; carry a newer wheel")
import jax
kind = jax.devices()[0].device_kind
print(f"jax devices: {jax.device_count()} x {kind} ({jax.default_backend()})")
if "H100" in kind:
  print("an H100 (issue 53 item 5): these rows are the H100 headline rows")
EOF
} | tee -a "$SUMMARY" >> "$LOG"
nvidia-smi >> "$LOG" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

failed=0
not_run=()
stage() {  # stage NAME NEED LIMIT COMMAND...: runs with a time limit cut to what is left
  local name=$1 need=$2 limit=$3; shift 3
  local left=$((BUDGET_S - (SECONDS - start)))
  if (( left < need )); then
    note "$name: not run, ${left}s left of ${BUDGET_S}s (needs ${need}s)"; not_run+=("$name"); return
  fi
  (( limit > left )) && limit=$left
  local t0=$SECONDS
  echo "== $name (limit ${limit}s, at $((t0 - start))s): $*" >> "$LOG"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$TMP/$name.txt" >> "$LOG"
  local rc=${PIPESTATUS[0]}
  local how="exit $rc"; (( rc == 124 || rc == 137 )) && how="stopped at its ${limit}s limit"
  note "$name: $how after $((SECONDS - t0))s"
  if (( rc != 0 )); then
    failed=1
    # The stage's last words (its error, or the FAILED list of bench_train) go in the summary.
    tail -n 8 "$TMP/$name.txt" | sed 's/^/    /' >> "$SUMMARY"
  fi
}

# Started now, in the background, on the CPU (they never touch the GPU): the GPU plan of the
# measured step compiled for the committed target files (levers_on sets it against the
# device), and the JPEG folder of end_to_end.
plans=()
plan_pids=()
if wants levers_on && [[ $QUICK != 1 ]]; then
  for target in h100 h200; do
    nice -n 10 "$PYTHON" -m jaxnet.cli.gpu_plan --config=resnet50 --target=$target --gpus=1 \
      --config.batch_size=256 --json > "$TMP/plan_$target.json" 2> "$TMP/plan_$target.err" &
    plan_pids+=($!)
    plans+=(--plan "$target=$TMP/plan_$target.json")
  done
fi
folder_args=()
if wants end_to_end && [[ $QUICK != 1 ]]; then
  nice -n 10 "$PYTHON" -m jaxnet.cli.make_imagefolder "$TMP/folder" --classes 10 --per-class 256 \
    --val-per-class 1 > "$TMP/folder.log" 2>&1 &
  folder_pid=$!
  folder_args=(--dir "$TMP/folder")
fi

torch_peer=(env PYTHONPATH="$TORCH_PATH" "$TORCH_PYTHON" experiments/peers/torch_resnet.py)
check=("$PYTHON" experiments/gpu_device_check.py)
if [[ $QUICK == 1 ]]; then
  torch_cell=(--model resnet_tiny --image-size 16 --batches 2 --steps 3 --warmup 1 --repeats 2 --compile off)
  autotune=(--compile off)   # on a CPU torch.compile needs a C++ toolchain and minutes
  train_args=(--tiny --precisions bf16,fp16 --max-seconds 60 --timeout 150)
  resnet=(--quick)
  family_args=(--tiny --precisions bf16 --max-seconds 60 --timeout 150 --no-torch)  # no torchvision *_mini
  families=(convnext_mini efficientnet_mini)
  vit_args=(--quick --set model.name=vit_mini)
  e2e_args=(--quick)
  keras_args=(--image-size 32 --batches 2 --steps 2 --warmup 1 --repeats 1)  # resnet50: keras has no tiny one
  fcn_torch_args=(--image-size 32 --batches 2 --steps 1 --warmup 1 --repeats 1 --compile off)
  fcn_args=(--quick --config fcn --set model.name=fcn_tiny --set image_size=64)
  input_args=(--quick --workers 0 --seconds 0.5)
else
  torch_cell=(--model resnet50 --image-size 224 --batches 256 --compile on)
  autotune=(--compile-modes max-autotune-no-cudagraphs)
  train_args=(--precisions bf16,fp16 --batches 256 --one-process --max-seconds 95 --timeout 105)
  resnet=(--config resnet50 --batch 256)
  family_args=(--precisions bf16 --one-process --max-seconds 85 --timeout 100 --steps 10 --repeats 3
               --torch-compile-modes default)
  families=(convnext_tiny efficientnet_b0)
  vit_args=(--config vit --set model.name=vit_b16 --batch 256)
  e2e_args=(--workers 16 --steps 60 --log-every 10 --rows synthetic,grain,prepared "${folder_args[@]}")
  keras_args=(--image-size 224 --batches 256)
  fcn_torch_args=(--image-size 512 --batches 16 --compile on)
  fcn_args=(--config fcn --batch 16 --set image_size=512)
  input_args=(--quick --workers 0,8,16 --seconds 1)
fi
one_lever=(--profile-steps 0 --no-trace-file --steps 10)

run_stage() {
  case $1 in
    torch) stage torch 60 110 "${torch_peer[@]}" --precisions bf16 --optimizer auto "${torch_cell[@]}" ;;
    bench_train) stage bench_train 60 110 "$PYTHON" experiments/bench_train.py --no-torch --no-keras \
        "${train_args[@]}" --json "$TMP/bench_train.json" ;;
    levers_on)
      for pid in "${plan_pids[@]}"; do
        wait "$pid" || note "gpu_plan (pid $pid) failed: $(tail -n 2 "$TMP"/plan_*.err | tr '\n' ' ')"
      done
      plan_pids=()
      stage levers_on 50 90 "${check[@]}" "${resnet[@]}" "${plans[@]}" --out "$OUT" --json-out "$TMP/levers_on.json" ;;
    torch_autotune) stage torch_autotune 120 180 "${torch_peer[@]}" --precisions bf16 --optimizer auto \
        "${torch_cell[@]}" "${autotune[@]}" ;;
    pool_scatter) stage pool_scatter 40 55 "${check[@]}" "${resnet[@]}" --set model.scatter_free_pool=false \
        "${one_lever[@]}" --json-out "$TMP/pool_scatter.json" ;;
    b512) stage b512 40 60 "${check[@]}" "${resnet[@]/256/512}" "${one_lever[@]}" --json-out "$TMP/b512.json" ;;
    stem_pad4) stage stem_pad4 40 55 "${check[@]}" "${resnet[@]}" --set model.stem_conv=pad4 \
        "${one_lever[@]}" --json-out "$TMP/stem_pad4.json" ;;
    stem_s2d) stage stem_s2d 40 55 "${check[@]}" "${resnet[@]}" --set model.stem_conv=space_to_depth \
        "${one_lever[@]}" --json-out "$TMP/stem_s2d.json" ;;
    convnext_tiny|efficientnet_b0)
      local family=${families[0]} batch=256
      [[ $1 == efficientnet_b0 ]] && family=${families[1]} batch=128
      [[ $QUICK == 1 ]] && batch=2
      stage "$1" 80 110 "$PYTHON" experiments/bench_train.py "${family_args[@]}" --model "$family" \
        --batches "$batch" --no-keras --no-flax --json "$TMP/$1.json" ;;
    vit) stage vit 45 80 "${check[@]}" "${vit_args[@]}" "${one_lever[@]}" --json-out "$TMP/vit.json" ;;
    end_to_end)
      if [[ -n ${folder_pid:-} ]]; then
        wait "$folder_pid" || note "make_imagefolder failed: $(tail -n 2 "$TMP/folder.log")"
      fi
      local left=$((BUDGET_S - (SECONDS - start)))
      stage end_to_end 90 150 "$PYTHON" experiments/bench_end_to_end.py "${e2e_args[@]}" \
        --max-seconds $(( (left < 150 ? left : 150) - 10 )) --json "$TMP/end_to_end.json" ;;
    torch_fp16) stage torch_fp16 60 100 "${torch_peer[@]}" --precisions fp16 --optimizer auto "${torch_cell[@]}" ;;
    keras)
      if KERAS_BACKEND=jax "$PYTHON" -c "import keras_hub" > /dev/null 2>&1; then  # not tensorflow, keras's default
        stage keras 50 80 env KERAS_BACKEND=jax "$PYTHON" experiments/peers/keras_resnet.py --precisions bf16 \
          "${keras_args[@]}"
      else
        note "keras: not run (keras_hub does not import: carry its wheels, see this script's header)"
      fi ;;
    fcn_torch) stage fcn_torch 60 100 "${torch_peer[@]}" --model fcn_resnet50 --num-classes 21 --precisions bf16 \
        --optimizer auto "${fcn_torch_args[@]}" ;;
    fcn) stage fcn 45 70 "${check[@]}" "${fcn_args[@]}" "${one_lever[@]}" --json-out "$TMP/fcn.json" ;;
    bench_input) stage bench_input 60 90 "$PYTHON" experiments/bench_input.py "${input_args[@]}" ;;
    bench_scaling)
      if (( gpus > 1 )); then
        stage bench_scaling 60 100 "$PYTHON" experiments/bench_scaling.py --quick
      else
        note "bench_scaling: not run (${gpus} GPU: scaling needs several)"
      fi ;;
  esac
}
for s in "${STAGE_LIST[@]}"; do run_stage "$s"; done
kill $(jobs -p) 2> /dev/null  # a background plan or folder no stage waited for

# The headlines (each jaxnet row against the best torch row) and results.json.
"$PYTHON" experiments/gpu_headlines.py --tmp "$TMP" --out "$OUT/results.json" 2>&1 | tee -a "$SUMMARY"

if (( ${#not_run[@]} )); then
  note "second call (called at once, while the machine is warm; N from status's budget_left_s less ~60 s):"
  note "  run(command=\"STAGES=$(IFS=,; echo "${not_run[*]}") BUDGET_S=N bash experiments/run_gpu_benchmarks.sh\", carry=[\".whl\"], timeout_s=N+50)"
fi
files=$(find "$OUT" -type f | wc -l)
(( files > 8 )) && note "WARNING: $files files in \$OUT; at most 8 come back"
note "done in $((SECONDS - start))s; exit $failed; outputs in $OUT"
rm -rf "$TMP"
exit $failed
