# Session 7, GPU call 6 of issue 25 (nvidia-h200, 1 GPU): call 5's job alone on a fresh machine, so its Triton and
# inductor caches are cold, as on a newly rented node (in call 5 it ran after time_budget.py, which had compiled
# every kernel: step 1 took 3.35 s, no later step above 2.72 s, against first-step extras of 4.7, 8.0, 5.7 and
# 0.1 s in time_budget's own cold measurement).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
ls ~/.triton/cache /tmp/torchinductor_$(whoami) 2>&1 | head -3
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 480 && python3 tools/make_chat_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 OUTPUT_DIR=/tmp/run1
timeout 230 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/run_1gpu_cold.log 2>&1; echo "== run: exit $?"
cp /tmp/run1/metrics.jsonl $OUT/metrics_1gpu_cold.jsonl
grep -E "since launch" $OUT/run_1gpu_cold.log | cut -c1-300
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/metrics_1gpu_cold.jsonl") if '"skipped"' in l]
steady = [r["step_time_s"] for r in rows[1:]]
slow = [(r["step"], round(r["step_time_s"], 2)) for r in rows if r["step_time_s"] > 2.8]
print(f"steps {len(rows)}, skipped {sum(r['skipped'] for r in rows)}, step 1 {rows[0]['step_time_s']:.1f} s, steps 2.. sum {sum(steady):.1f} s mean {sum(steady)/len(steady):.3f} s; steps over 2.8 s: {slow}")
PY
