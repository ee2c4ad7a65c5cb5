# Device call 4 (nvidia-h200-x2): time_budget.py's prediction against real runs of train_ddp.py on the 12B
# architecture (random weights), 256 chat rows of log-normally spread lengths, the fast layout (MEMORY_TARGET_GIB=130,
# eager), one epoch: time_budget on GPU 0 beside the 1-GPU run on GPU 1, then the 2-GPU run. Writes $OUT/call4.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
O=$OUT/call4; mkdir -p $O; W=$(mktemp -d)
python3 - "$W/spread.jsonl" <<'PY'
import json, random, sys
rng, words = random.Random(0), "gradient token rank batch memory network device update adapter sequence value".split()
with open(sys.argv[1], "w") as f:
    for i in range(256):
        n = max(8, min(3000, int(rng.lognormvariate(5.5, 0.8))))
        answer = " ".join(rng.choice(words) for _ in range(n))
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": answer}]}) + "\n")
PY
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=$W/spread.jsonl MEMORY_TARGET_GIB=130 EPOCHS=1 DRIFT_CHECK_EVERY=0
( CUDA_VISIBLE_DEVICES=0 timeout 240 python3 time_budget.py --gpus-per-node 1 2 --json $O/predicted.json > $O/time_budget.out 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 OUTPUT_DIR=$W/g1 timeout 240 torchrun --standalone --nproc_per_node=1 train_ddp.py > $O/run_1gpu.log 2>&1; cp $W/g1/metrics.jsonl $O/metrics_1gpu.jsonl ) &
wait
OUTPUT_DIR=$W/g2 timeout 200 torchrun --standalone --nproc_per_node=2 train_ddp.py > $O/run_2gpu.log 2>&1; cp $W/g2/metrics.jsonl $O/metrics_2gpu.jsonl
tail -12 $O/time_budget.out; grep -h "saved in" $O/run_*.log
