# Issue 25 on nvidia-h200-x2: the 15% by which 2-GPU steps outran the model (issue 15). The same job as x2_call.sh
# (12B eager fast layout, the realistic mix), 20 steps, step 20 profiled, on 1 GPU and then on 2, each alone; then
# step_profile.py's table (traces stay on the machine: too large to bring back).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 960
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 MAX_STEPS=20 PROFILE_STEP=20
for n in 1 2; do
  OUTPUT_DIR=/tmp/prof_$n timeout 200 torchrun --standalone --nproc_per_node=$n train_ddp.py > $OUT/prof_${n}gpu.log 2>&1; echo "== $n GPU(s): exit $?"
  cp /tmp/prof_$n/metrics.jsonl $OUT/prof_metrics_${n}gpu.jsonl
done
python3 bench_results/issue25/step_profile.py /tmp/prof_1 /tmp/prof_2 | tee $OUT/step_profile.txt
