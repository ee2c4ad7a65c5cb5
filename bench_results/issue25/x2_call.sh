# Issue 25, one part per device call (the packed jobs are too long for one 600 s call together):
#   bash bench_results/issue25/x2_call.sh MODE PART...   MODE: unpacked or packed; PART: predict, 1, 2
# e.g. on nvidia-h200-x2, back to back in one lease: "unpacked predict 1 2", "packed predict 1", "packed 2";
# then python bench_results/issue25/compare.py DIR (DIR: the calls' $OUT files side by side).
# 12B (random weights), eager fast layout (MEMORY_TARGET_GIB=130), the realistic mix (make_chat_mix.py; unpacked 960 rows,
# packed 4,400 conversations, 1,423 rows of 2,048), MAX_STEPS=60 (a whole epoch on 2 GPUs, half of one on 1),
# 32 eval rows. predict: time_budget.py (GPU 0 alone); N: the job on N GPUs, alone and with empty Triton and
# inductor caches: time_budget predicts a cold start, as on a newly rented node (a job right after it on the same
# machine finds warm caches and ends ~13% sooner, call 5). Job time limits: time_budget's packed prediction on one
# GPU is 4.5 min (call 7, whose 230 s limit ended the job at step 50).
mode=${1:?unpacked or packed}; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
rows=$([ "$mode" = packed ] && echo 4400 || echo 960)
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl $rows && python3 tools/make_chat_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 MAX_STEPS=60 PACKING=$([ "$mode" = packed ] && echo 1 || echo 0)
cold() { export TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d); }
for part in "$@"; do
  cold
  if [ "$part" = predict ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 time_budget.py --gpus-per-node 1 2 --warmup 1 --steps 2 --json $OUT/predicted_$mode.json > $OUT/time_budget_$mode.log 2>&1; echo "== time_budget $mode: exit $?"
    grep -v "Warning\|warn" $OUT/time_budget_$mode.log | tail -8 | cut -c1-300
  else
    OUTPUT_DIR=/tmp/run_${mode}_$part timeout 420 torchrun --standalone --nproc_per_node=$part train_ddp.py > $OUT/run_${mode}_${part}gpu.log 2>&1; echo "== job $mode on $part GPU(s): exit $?"
    cp /tmp/run_${mode}_$part/metrics.jsonl $OUT/metrics_${mode}_${part}gpu.jsonl
    grep -h "since launch" $OUT/run_${mode}_${part}gpu.log | cut -c1-200
  fi
done
