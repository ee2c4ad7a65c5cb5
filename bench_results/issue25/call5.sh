# Session 7, GPU call 5 of issue 25 (nvidia-h200, 1 GPU; nvidia-h200-x2 not lent): time_budget.py's whole-run
# prediction (launch to adapter) against the real job's own "s since launch", 1 GPU, unpacked, 12B (random weights),
# the eager fast layout (MEMORY_TARGET_GIB=130; eager so that time_budget's first steps fit the bound: call 1's
# compiled measurement did not), realistic mix of 480 rows (60 steps of 8), 32 eval rows at the end. With the
# right-padded fix (no NaN steps expected).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 480 && python3 tools/make_chat_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 OUTPUT_DIR=/tmp/run1
timeout 220 python3 time_budget.py --gpus-per-node 1 --warmup 1 --steps 2 --json $OUT/predicted.json > $OUT/time_budget.log 2>&1; echo "== time_budget: exit $?"
timeout 220 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/run_1gpu.log 2>&1; echo "== run: exit $?"
cp /tmp/run1/metrics.jsonl $OUT/metrics_1gpu.jsonl
grep -v "Warning\|warn" $OUT/time_budget.log | tail -14 | cut -c1-300
grep -E "^settings \(planner\)|world 1|saved in|eval|since launch" $OUT/run_1gpu.log | cut -c1-300
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/metrics_1gpu.jsonl") if '"step"' in l and '"skipped"' in l]
steady = [r["step_time_s"] for r in rows[1:]]
print(f"steps {len(rows)}, skipped {sum(r['skipped'] for r in rows)}, step 1 {rows[0]['step_time_s']:.1f} s, steps 2.. mean {sum(steady)/len(steady):.3f} s")
PY
