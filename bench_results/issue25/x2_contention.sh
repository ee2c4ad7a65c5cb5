# Issue 25: is the 15% by which 2-GPU steps outran the model (issue 15) the host, not DDP? The eager fast layout's
# step is bound by the host's kernel launches (omp_1gpu/RESULT.md: the GPU idle two thirds of the step), so a
# second process launching on the same host could slow each one. On nvidia-h200-x2, one call (~5.5 min):
#   timeout 595 bash bench_results/issue25/x2_contention.sh
# 12B eager fast layout (MEMORY_TARGET_GIB=130), the realistic mix unpacked (960 rows), 14 steps, no eval:
#   alone       one 1-GPU job on GPU 0, nothing else running
#   side        two 1-GPU jobs at once, GPU 0 and GPU 1, the same data (no DDP, no communication)
#   side-cores  the same, each job on its own half of the physical cores (taskset; SMT siblings kept together)
#   ddp         the 2-GPU DDP job (torchrun --nproc_per_node=2)
# alone and side see the same tokens at every step: side/alone per step is the host's share. Then the table.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
lscpu > $OUT/lscpu.txt; lscpu -p=CPU,CORE,SOCKET,NODE > $OUT/cpus.csv
mkdir -p /tmp/mix && python3 tools/make_chat_mix.py /tmp/mix/train.jsonl 960
export MODEL_CONFIG=configs/gemma-4-12b.json DATA_PATH=/tmp/mix/train.jsonl MAX_LEN=2048
export MEMORY_TARGET_GIB=130 COMPILE_LAYERS=0 EPOCHS=1 MAX_STEPS=14
# the physical cores split in two halves, every thread of a core in the same half
half() { grep -v '^#' $OUT/cpus.csv | awk -F, -v h=$1 '{core=$3*100000+$2} !(core in seen){seen[core]=n++} seen[core]%2==h{printf "%s%s", sep, $1; sep=","}'; }
job() {  # name, GPU, [cpu list]
  local pin=${3:+taskset -c $3}
  CUDA_VISIBLE_DEVICES=$2 OUTPUT_DIR=/tmp/$1 timeout 240 $pin torchrun --standalone --nproc_per_node=1 train_ddp.py > $OUT/$1.log 2>&1
  echo "== $1: exit $?"; cp /tmp/$1/metrics.jsonl $OUT/$1.jsonl
}
job alone 0
job side0 0 & job side1 1 & wait
echo "cores: $(half 0) | $(half 1)"
job cores0 0 "$(half 0)" & job cores1 1 "$(half 1)" & wait
OUTPUT_DIR=/tmp/ddp timeout 240 torchrun --standalone --nproc_per_node=2 train_ddp.py > $OUT/ddp.log 2>&1; echo "== ddp: exit $?"
cp /tmp/ddp/metrics.jsonl $OUT/ddp.jsonl
python3 bench_results/issue25/contention_table.py $OUT | tee $OUT/table.txt
