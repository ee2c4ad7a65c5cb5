# A rank that fails before the process group forms, on NCCL (guards.FailuresBeforeGroup): two torchrun "nodes" of one
# rank each on the one GPU, node 1 reading a DATA_PATH with a broken last row. Node 0's rank waits in
# init_process_group("nccl") (DIST_INIT_TIMEOUT_S=600) and should end about 10 s after node 1's error, with its line.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/failures_before_group.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/fbg && cp assets/sample_chat.jsonl /tmp/fbg/good.jsonl && { cat assets/sample_chat.jsonl; echo "{not json"; } > /tmp/fbg/bad.jsonl
launch() {  # node rank, data file
  OUTPUT_DIR=/tmp/fbg/out DATA_PATH=$2 MAX_LEN=128 DIST_INIT_TIMEOUT_S=600 timeout 150 python3 -m torch.distributed.run \
    --nnodes=2 --node-rank=$1 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29517 --rdzv-id=fbg --rdzv-conf=is_host=$(( $1 == 0 )) \
    train_ddp.py > $OUT/node$1.log 2>&1
  echo "node $1: exit $? at $(date +%s.%N | cut -c1-14)" >> $OUT/ends.txt
}
start=$(date +%s.%N | cut -c1-14); echo "start $start" > $OUT/ends.txt
launch 0 /tmp/fbg/good.jsonl & launch 1 /tmp/fbg/bad.jsonl & wait
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/ends.txt
cat $OUT/ends.txt; grep -h "error:\|forming the process group" $OUT/node0.log $OUT/node1.log | cut -c1-400
