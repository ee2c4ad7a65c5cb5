# Issue 25, GPU call 1 (nvidia-h200, 1 GPU; x2 not lent this session): time_budget.py's whole-run prediction
# (launch to adapter) against the real job's own "s since launch", on 1 GPU, unpacked, 12B architecture (random
# weights), fast compiled layout, the realistic chat mix (480 rows: 60 steps of 8), 32 eval rows at the end.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 480 && python3 tools/make_chat_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=1 EPOCHS=1 OUTPUT_DIR=/tmp/run1
timeout 200 python3 time_budget.py --gpus-per-node 1 --warmup 1 --steps 2 --json $OUT/predicted.json > $OUT/time_budget.log 2>&1; echo "== time_budget: exit $?"
timeout 250 torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/run_1gpu.log 2>&1; echo "== run: exit $?"
cp /tmp/run1/metrics.jsonl $OUT/metrics_1gpu.jsonl
grep -v "Warning\|warn" $OUT/time_budget.log | tail -16 | cut -c1-300
grep -E "^settings \(planner\)|world 1|saved in|eval|since launch" $OUT/run_1gpu.log | cut -c1-300
