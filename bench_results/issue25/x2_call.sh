# Issue 25 on nvidia-h200-x2, one call per mode (bash bench_results/issue25/x2_call.sh unpacked|packed), back to back
# in one lease, then: python bench_results/issue25/compare.py DIR (DIR: the calls' $OUT files side by side).
# 12B (random weights), eager fast layout (MEMORY_TARGET_GIB=130), the realistic mix (make_mix.py; unpacked 960 rows,
# packed 4,400 conversations, about 960 rows of 2,048), MAX_STEPS=60 (a whole epoch on 2 GPUs, half of one on 1),
# 32 eval rows. time_budget.py first (GPU 0 alone), then the job on 1 GPU and on
# 2, each alone and each with empty Triton and inductor caches: time_budget predicts a cold start, as on a newly
# rented node (a job right after it on the same machine finds warm caches and ends ~13% sooner, call 5).
mode=${1:?unpacked or packed}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
rows=$([ "$mode" = packed ] && echo 4400 || echo 960)
mkdir -p /tmp/mix && python3 bench_results/issue23/make_mix.py /tmp/mix/train.jsonl $rows && python3 bench_results/issue23/make_mix.py /tmp/mix/eval.jsonl 32
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl EVAL_PATH=/tmp/mix/eval.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 MAX_STEPS=60 PACKING=$([ "$mode" = packed ] && echo 1 || echo 0)
cold() { export TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d); }
cold; CUDA_VISIBLE_DEVICES=0 timeout 130 python3 time_budget.py --gpus-per-node 1 2 --warmup 1 --steps 2 --json $OUT/predicted_$mode.json > $OUT/time_budget_$mode.log 2>&1; echo "== time_budget $mode: exit $?"
for n in ${GPUS:-1 2}; do  # GPUS=1 on a one-GPU machine
  cold; OUTPUT_DIR=/tmp/run_${mode}_$n timeout 230 torchrun --standalone --nproc_per_node=$n train_ddp.py > $OUT/run_${mode}_${n}gpu.log 2>&1; echo "== job $mode on $n GPU(s): exit $?"
  cp /tmp/run_${mode}_$n/metrics.jsonl $OUT/metrics_${mode}_${n}gpu.jsonl
done
grep -v "Warning\|warn" $OUT/time_budget_$mode.log | tail -8 | cut -c1-300
grep -h "since launch" $OUT/run_${mode}_*gpu.log | cut -c1-200
