#!/usr/bin/env bash
# Every GPU benchmark of experiments/ in ONE device call, outputs to $OUT.
#
# Here (where PyPI is reachable), from the repository root, once:
#   bash ../shared/device/wheels.sh simplejpeg   # grain, tfds, ml-collections, ... into .whl/
# (not opencv-python-headless: its 61 MB wheel overflows the 64 MiB carry; the input
# pipeline then resizes with PIL, and bench_input's header says "opencv not installed".
# The C region decoder is not built there either: the tree is used from PYTHONPATH.)
# Then one device call, from the repository root:
#   run(command="bash experiments/run_gpu_benchmarks.sh", carry=[".whl"], timeout_s=600)
# and copy the tables from $OUT/*.txt into experiments/RESULTS.md (GPU section).
#
# The device call is limited to 10 minutes, so each stage has a time budget
# (`timeout`, and bench_train's own --max-seconds, which reports cells it had
# no time for as "not run" instead of losing the table). Total at most ~560 s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$SECONDS

# The GPU machine's image lacks grain, tfds and ml-collections: install the carried wheels.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed" | tee "$OUT/errors.txt"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  echo "no .whl/ carried: assuming grain, tfds and ml-collections are installed" | tee "$OUT/errors.txt"
  export PYTHONPATH=$PWD
fi

{ nvidia-smi; python3 -c "import jax; print(jax.devices())"; } > "$OUT/machine.txt" 2>&1

stage() {  # stage NAME SECONDS COMMAND...: runs with a time limit, output to $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "   exit $? after $((SECONDS - start))s"
}

# 1) Train-step throughput, jaxnet vs flax-minimal vs torch: resnet50, 224px,
#    64/128/256 per device, bf16 first (the headline), then fp16, fp32. One jax
#    process shares one init; peak memory is then XLA's analysis of each
#    compiled step. torch eager here: torch.compile recompiles for every cell
#    (minutes), which the 10-minute call cannot hold; see stage 2.
stage bench_train 420 python3 experiments/bench_train.py --precisions bf16,fp16,fp32 \
  --batches 64,128,256 --one-process --torch-compile off --max-seconds 250 \
  --json "$OUT/bench_train.json"

# 2) The torch peer with torch.compile on, one cell (bf16, 256), if time is left:
#    compare its RESULT line's img_s with the torch column of stage 1 (eager).
if (( SECONDS - start < 330 )); then
  stage torch_compile 120 python3 experiments/peers/torch_resnet.py --model resnet50 \
    --precisions bf16 --batches 256 --image-size 224 --compile on
fi

# 3) Multi-device scaling, when the parallel branch's benchmark is here.
if [[ -f experiments/bench_scaling.py ]] && (( SECONDS - start < 420 )); then
  stage bench_scaling 60 python3 experiments/bench_scaling.py --quick
fi

# 4) Input pipeline on this machine's 16 CPU cores (no GPU involved).
if (( SECONDS - start < 470 )); then
  stage bench_input 50 python3 experiments/bench_input.py --quick --workers 0,2,4,8
fi

# 5) Time to accuracy: digits and a generated ImageFolder, bf16.
if (( SECONDS - start < 490 )); then
  stage time_to_accuracy 90 python3 experiments/time_to_accuracy.py --quick --precision bf16 \
    --workers 4 --json "$OUT/time_to_accuracy.json"
fi
echo "done in $((SECONDS - start))s; outputs in $OUT"
