#!/usr/bin/env bash
# Every GPU benchmark of experiments/ in ONE device call, outputs to $OUT.
#
# Here (where PyPI is reachable), from the repository root, once:
#   bash ../shared/device/wheels.sh simplejpeg keras keras-hub namex optree
# (grain, tfds, ml-collections, ... into .whl/; keras, keras-hub and the two of their
# requirements the GPU image lacks, for the Keras peer: ~4.5 MB of the ~16 MB carried.
# (not opencv-python-headless: its 61 MB wheel overflows the 64 MiB carry; the input
# pipeline then resizes with PIL, and bench_input's header says "opencv not installed".
# The C region decoder is not built there either: the tree is used from PYTHONPATH.)
# Then one device call, from the repository root:
#   run(command="bash experiments/run_gpu_benchmarks.sh", carry=[".whl"], timeout_s=600)
# and copy the tables from $OUT/log.txt into experiments/RESULTS.md (GPU section).
#
# A device command may run 10 minutes, so every stage has a time budget and the
# whole script ends by BUDGET_S (540 s; call it with timeout_s=590). The stages run most
# important first (issue 45), each cut to the time left, skipped with under a minute left:
#   1. torch_compile   the PyTorch peer with torch.compile (resnet50, bf16, batch 256):
#                      the comparison that matters, so it runs first and always.
#   2. keras           the Keras 3 (JAX backend) peer, keras-hub ResNet-50 v1.5, bf16,
#                      batch 256 (experiments/peers/keras_resnet.py); skipped with a
#                      note when keras-hub's wheels were not carried.
#   3. bench_train     jaxnet vs the hand-written flax loop, resnet50 224px, bf16, batch 256.
#   4. device_check    the GPU plan against the device (experiments/gpu_device_check.py):
#                      the step compiled and run on the GPU (memory analysis, allocator peak,
#                      kernels) beside `jaxnet.cli.gpu_plan` for the h100 and h200 target
#                      files (compiled on the CPU in the background while stages 1-3 run),
#                      and a jax.profiler trace of the step summarized by kernel kind.
#   5. end_to_end      python -m jaxnet.main on a generated folder of ImageNet-sized JPEGs
#                      (made in the background meanwhile) with 16 Grain workers, and with
#                      DALI if installed, against the same command on synthetic data.
#   6. vit             ViT-B/16 bf16 batch 256 through the device check (attention path named),
#   7. bench_input     and the input pipeline alone: only on time the others left.
#   8. bench_scaling   only with more than one GPU (one device says nothing of scaling).
#
# $OUT gets at most 7 files (at most 8 come back):
#   summary.txt   machine, GPU, versions (protobuf too), each stage's exit status and
#                 seconds, every error, the headline jaxnet/torch.compile and
#                 jaxnet/keras ratios
#   log.txt       the full output of every stage, in order (all the tables)
#   bench_train.json, device_check.json, end_to_end.json, device_check_vit.json  the measurements
#   step_trace.json.gz   the profile of the ResNet-50 step (perfetto), when under 15 MB
#
# QUICK=1: a CPU dry run of the same stages with tiny models (PYTHON and TORCH_PYTHON
# choose the interpreters; the device's python3 has both jax and torch).
#
# SUITE=levers (issue 52) runs other stages instead, in this order, each cut to the time left:
#   1. torch_best    the fair peer: torch.compile modes default and max-autotune-no-cudagraphs,
#                    fused SGD, channels_last, bf16 autocast (resnet50, batch 256); the
#                    headline ratio is against the best of them.
#   2. bench_train   jaxnet (the resnet50 recipe's levers on) vs the hand-written flax step.
#   3. levers_on     the device check of that step with its profile: each kernel through its
#                    HLO instruction to its layer (the per-layer table, measured), the trace kept.
#   4. scatter_free_pool_false, stem_conv_pad4, stem_conv_space_to_depth: the same step with
#                    one lever changed, timed, no profile.
#   5. convnext_tiny, efficientnet_b0: bench_train with the torch peer (torchvision's models,
#                    torch.compile default mode), bf16, batch 256 (128 for EfficientNet-B0),
#                    on the time left.
# One device call:  run(command="SUITE=levers bash experiments/run_gpu_benchmarks.sh",
# carry=[".whl"], timeout_s=600); $OUT gets summary.txt, log.txt, bench_train.json,
# device_check*.json and step_trace.json.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-results}
QUICK=${QUICK:-0}
PYTHON=${PYTHON:-python3}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
SUITE=${SUITE:-all}
SUMMARY=$OUT/summary.txt LOG=$OUT/log.txt
: > "$SUMMARY"; : > "$LOG"
TMP=$(mktemp -d)
export PYTHONUNBUFFERED=1
start=$SECONDS

note() { echo "$*" | tee -a "$SUMMARY"; }

# The GPU machine's image lacks grain, tfds and ml-collections: install the carried wheels.
if compgen -G ".whl/*.whl" > /dev/null; then
  if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >> "$LOG" 2>&1; then
    note "ERROR: wheel install failed (see log.txt)"; exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  note "no .whl/ carried: assuming grain, tfds and ml-collections are installed"
  export PYTHONPATH=$PWD
fi

{
  echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC'))"
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
print(f"jax devices: {jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})")
EOF
} | tee -a "$SUMMARY" >> "$LOG"
nvidia-smi >> "$LOG" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

failed=0
stage() {  # stage NAME SECONDS COMMAND...: runs with a time limit cut to what is left
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - start)))
  if (( left < 60 )); then
    note "$name: not run, ${left}s left of ${BUDGET_S}s"; failed=1; return
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

if [[ $SUITE == levers ]]; then
  if [[ $QUICK == 1 ]]; then
    torch_args=(--model resnet_tiny --image-size 16 --batches 2 --steps 3 --warmup 1 --repeats 2 --compile off)
    train_args=(--tiny --precisions bf16 --max-seconds 60 --timeout 150 --no-torch --no-keras)
    check_args=(--quick)
    family_args=(--tiny --precisions bf16 --max-seconds 60 --timeout 150 --no-keras)
    families=(convnext_mini efficientnet_mini)
    levers=(model.scatter_free_pool=false)  # resnet_tiny has no ImageNet stem to change
    limits=(120 120 150 100 150)
  else
    torch_args=(--model resnet50 --image-size 224 --batches 256 --compile on
                --compile-modes default,max-autotune-no-cudagraphs)
    train_args=(--precisions bf16 --batches 256 --one-process --max-seconds 80 --timeout 105 --no-torch --no-keras)
    check_args=(--config resnet50 --batch 256)
    family_args=(--precisions bf16 --one-process --max-seconds 80 --timeout 110 --no-keras --steps 10 --repeats 3)
    families=(convnext_tiny efficientnet_b0)
    levers=(model.scatter_free_pool=false model.stem_conv=pad4 model.stem_conv=space_to_depth)
    limits=(180 95 90 55 110)
  fi
  stage torch_best "${limits[0]}" "$TORCH_PYTHON" experiments/peers/torch_resnet.py --precisions bf16 \
    --optimizer auto "${torch_args[@]}"
  stage bench_train "${limits[1]}" "$PYTHON" experiments/bench_train.py "${train_args[@]}" \
    --json "$OUT/bench_train.json"
  stage levers_on "${limits[2]}" "$PYTHON" experiments/gpu_device_check.py "${check_args[@]}" --out "$OUT"
  for lever in "${levers[@]}"; do
    tag=${lever#model.}; tag=${tag//=/_}
    stage "$tag" "${limits[3]}" "$PYTHON" experiments/gpu_device_check.py "${check_args[@]}" --set "$lever" \
      --profile-steps 0 --no-trace-file --tag "$tag" --out "$OUT"
  done
  for family in "${families[@]}"; do
    fbatch=256; [[ $family == efficientnet_b0 ]] && fbatch=128; [[ $QUICK == 1 ]] && fbatch=2
    stage "$family" "${limits[4]}" "$PYTHON" experiments/bench_train.py "${family_args[@]}" --model "$family" \
      --batches "$fbatch" --torch-compile-modes default
  done
  "$PYTHON" - "$OUT" "$TMP/torch_best.txt" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import glob, json, os, sys
out, torch_log = sys.argv[1], sys.argv[2]
try:
  torch = [json.loads(l[7:]) for l in open(torch_log) if l.startswith("RESULT ")]
except OSError:
  torch = []
best = max((t for t in torch if "img_s" in t), key=lambda t: t["img_s"], default=None)
for t in torch:
  print(f"torch {t.get('compile_mode')} {t.get('optimizer')}: "
        + (f"{t['img_s']:.1f} img/s" if "img_s" in t else t.get("error", "")))
for path in sorted(glob.glob(os.path.join(out, "device_check*.json"))):
  d = json.load(open(path))
  line = f"{os.path.basename(path)}: {d['img_s']:.1f} img/s, {d['ms_step']:.2f} ms/step"
  if best:
    line += f", jaxnet/torch-best ({best['compile_mode']}) {d['img_s'] / best['img_s']:.3f}"
  print("headline: " + line)
if not best:
  print("headline: no torch result")
EOF
  note "done in $((SECONDS - start))s; exit $failed; outputs in $OUT"
  rm -rf "$TMP"
  exit $failed
fi

# Started now, in the background, on the CPU (they never touch the GPU): the GPU plan of the
# measured config compiled for the committed target files (stage 4 sets it against the
# device), and the JPEG folder of stage 5.
plans=()
plan_pids=()
for target in h100 h200; do
  if [[ $QUICK == 1 ]]; then break; fi
  nice -n 10 "$PYTHON" -m jaxnet.cli.gpu_plan --config=configs/resnet50.py --target=$target --gpus=1 \
    --config.batch_size=256 --json > "$TMP/plan_$target.json" 2> "$TMP/plan_$target.err" &
  plan_pids+=($!)
  plans+=(--plan "$target=$TMP/plan_$target.json")
done
folder_args=()
if [[ $QUICK != 1 ]]; then
  nice -n 10 "$PYTHON" -m jaxnet.cli.make_imagefolder "$TMP/folder" --classes 10 --per-class 256 \
    --val-per-class 1 > "$TMP/folder.log" 2>&1 &
  folder_pid=$!
  folder_args=(--dir "$TMP/folder")
fi

if [[ $QUICK == 1 ]]; then
  torch_args=(--model resnet_tiny --image-size 16 --batches 2 --steps 3 --warmup 1 --repeats 2)
  keras_args=(--image-size 32 --batches 2 --steps 2 --warmup 1 --repeats 1)  # resnet50: keras has no tiny one
  train_args=(--tiny --precisions bf16 --max-seconds 60 --timeout 150)
  check_args=(--quick)
  vit_args=(--quick --set model.name=vit_mini --no-trace-file)
  e2e_args=(--quick)
  input_args=(--quick --workers 0,1)
  limits=(240 200 150 90 200 90 90)
else
  torch_args=(--model resnet50 --image-size 224 --batches 256)
  keras_args=(--image-size 224 --batches 256)
  # jaxnet and the hand-written flax step at the torch cell only (bf16, batch 256): the
  # other cells do not fit one device call beside the stages below.
  train_args=(--precisions bf16 --batches 256 --one-process --max-seconds 90 --timeout 115)
  check_args=(--config configs/resnet50.py --batch 256 "${plans[@]}")
  vit_args=(--config configs/vit.py --set model.name=vit_b16 --batch 256 --no-trace-file)
  e2e_args=(--workers 16 --steps 60 --log-every 10 "${folder_args[@]}")
  input_args=(--quick --workers 0,8,16)
  # torch, keras, bench_train, device_check, end_to_end, vit, bench_input: the first five sum
  # to BUDGET_S less the setup; the last two run only on time the others left.
  limits=(120 90 115 95 100 90 60)
fi

stage torch_compile "${limits[0]}" "$TORCH_PYTHON" experiments/peers/torch_resnet.py \
  --precisions bf16 --compile on "${torch_args[@]}"
if KERAS_BACKEND=jax "$PYTHON" -c "import keras_hub" > /dev/null 2>&1; then  # not tensorflow, keras's default
  stage keras "${limits[1]}" "$PYTHON" experiments/peers/keras_resnet.py --precisions bf16 \
    "${keras_args[@]}"
else
  note "keras: not run (keras-hub is not installed: carry its wheels, see this script's header)"
fi
stage bench_train "${limits[2]}" "$PYTHON" experiments/bench_train.py --no-torch --no-keras \
  "${train_args[@]}" --json "$OUT/bench_train.json"
for pid in "${plan_pids[@]}"; do wait "$pid" || note "gpu_plan (pid $pid) failed: $(tail -n 2 "$TMP"/plan_*.err | tr '\n' ' ')"; done
stage device_check "${limits[3]}" "$PYTHON" experiments/gpu_device_check.py "${check_args[@]}" --out "$OUT"
[[ -n ${folder_pid:-} ]] && { wait "$folder_pid" || note "make_imagefolder failed: $(tail -n 2 "$TMP/folder.log")"; }
left=$((BUDGET_S - (SECONDS - start))); e2e_s=$(( (left < limits[4] ? left : limits[4]) - 10 ))
stage end_to_end "${limits[4]}" "$PYTHON" experiments/bench_end_to_end.py "${e2e_args[@]}" \
  --max-seconds "$e2e_s" --json "$OUT/end_to_end.json"
stage vit "${limits[5]}" "$PYTHON" experiments/gpu_device_check.py "${vit_args[@]}" --tag vit --out "$OUT"
stage bench_input "${limits[6]}" "$PYTHON" experiments/bench_input.py "${input_args[@]}"
if (( gpus > 1 )); then
  stage bench_scaling 100 "$PYTHON" experiments/bench_scaling.py --quick
else
  note "bench_scaling: not run (${gpus} GPU: scaling needs several)"
fi

# The headlines: jaxnet's bf16 rate against torch.compile's and Keras's, same model and batch.
"$PYTHON" - "$OUT/bench_train.json" "torch.compile=$TMP/torch_compile.txt" "keras=$TMP/keras.txt" \
  <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
def read(path, parse):
  try:
    with open(path) as f:
      return parse(f)
  except (OSError, ValueError, KeyError):
    return []
rows = read(sys.argv[1], lambda f: json.load(f)["rows"])
for peer_arg in sys.argv[2:]:
  peer, path = peer_arg.split("=", 1)
  results = read(path, lambda f: [json.loads(l[7:]) for l in f if l.startswith("RESULT ")])
  results = [r for r in results if "img_s" in r]
  for t in results:
    mine = [r for r in rows if r.get("precision") == t["precision"]
            and r.get("batch_per_device") == t["batch"] and "img_s" in r]
    if mine:
      j = mine[0]["img_s"] / mine[0]["global_batch"] * t["batch"]  # per device, as the peer's one GPU
      print(f"headline: {t['precision']} batch {t['batch']}: jaxnet {j:.1f} img/s, {peer} "
            f"{t['img_s']:.1f} img/s, jaxnet/{peer} {j / t['img_s']:.3f}")
    else:
      print(f"headline: {peer} {t['img_s']:.1f} img/s; no jaxnet cell at {t['precision']} batch {t['batch']}")
  if not results:
    print(f"headline: no {peer} result")
EOF

files=$(find "$OUT" -type f | wc -l)
(( files > 6 )) && note "WARNING: $files files in \$OUT; at most 8 come back"
note "done in $((SECONDS - start))s; exit $failed; outputs in $OUT"
rm -rf "$TMP"
exit $failed
