# Issue 25, a hypothesis for the 15% by which 2-GPU steps outran the model, tested on one GPU: torchrun sets
# OMP_NUM_THREADS=1 for every rank when --nproc_per_node > 1, not for 1. The same job as x2_profile.sh (12B eager
# fast layout, the realistic mix unpacked, 20 steps, step 20 profiled), on one GPU, with OMP_NUM_THREADS unset
# (torchrun's 1-GPU default) and =1 (what its 2-GPU launch gives each rank); then step_profile.py's table.
#   bash bench_results/issue25/omp_1gpu.sh        (nvidia-h200; outputs in $OUT)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 960
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 MAX_STEPS=20 PROFILE_STEP=20
for omp in unset 1; do
  if [ $omp = unset ]; then unset OMP_NUM_THREADS; else export OMP_NUM_THREADS=$omp; fi
  OUTPUT_DIR=/tmp/prof_omp_$omp timeout 240 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/prof_omp_$omp.log 2>&1; echo "== OMP_NUM_THREADS=$omp: exit $?"
  cp /tmp/prof_omp_$omp/metrics.jsonl $OUT/metrics_omp_$omp.jsonl
done
python3 - $OUT <<'PY'
import json, statistics, sys
from pathlib import Path
print("| OMP_NUM_THREADS | median step s (steps 3-19) | mean step s |")
print("|---|---|---|")
for omp in ("unset", "1"):
    rows = [json.loads(l) for l in (Path(sys.argv[1]) / f"metrics_omp_{omp}.jsonl").read_text().splitlines() if l.strip()]
    times = [r["step_time_s"] for r in rows if 3 <= r.get("step", 0) <= 19 and "step_time_s" in r]
    print(f"| {omp} | {statistics.median(times):.3f} | {statistics.mean(times):.3f} |" if times else f"| {omp} | no step_time_s in {list(rows[-1])} | |")
PY
python3 bench_results/issue25/step_profile.py /tmp/prof_omp_unset /tmp/prof_omp_1 | tee $OUT/step_profile.txt
