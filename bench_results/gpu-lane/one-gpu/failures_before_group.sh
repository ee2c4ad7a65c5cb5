# A rank that fails before the process group forms, on NCCL (guards.FailuresBeforeGroup): two torchrun "nodes" of one
# rank each on the one GPU, node F reading a DATA_PATH with a broken last row, for F = 1 then 0 (node 0's agent serves
# the store). The other node's rank waits in init_process_group("nccl") (DIST_INIT_TIMEOUT_S=600) and should end
# with node F's line: about 10 s after it when node 1 failed; at once when node 0 did (its store gone with it).
# On a machine with 2 GPUs (nvidia-h200-x2) each node has its own GPU (node N sees GPU N): NCCL across 2 GPUs.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/failures_before_group.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/fbg && cp assets/sample_chat.jsonl /tmp/fbg/good.jsonl && { cat assets/sample_chat.jsonl; echo "{not json"; } > /tmp/fbg/bad.jsonl
gpus=$(nvidia-smi -L | wc -l)
launch() {  # node rank, data file, failing node
  CUDA_VISIBLE_DEVICES=$(( $1 % gpus )) OUTPUT_DIR=/tmp/fbg/out$3 DATA_PATH=$2 MAX_LEN=128 DIST_INIT_TIMEOUT_S=600 timeout 150 python3 -m torch.distributed.run \
    --nnodes=2 --node-rank=$1 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:2951$3 --rdzv-id=fbg$3 \
    --rdzv-conf=is_host=$(( $1 == 0 )) train_ddp.py > $OUT/failing$3-node$1.log 2>&1
  echo "failing node $3: node $1 exit $? at $(date +%s.%N | cut -c1-14)" >> $OUT/ends.txt
}
for f in 1 0; do
  echo "failing node $f: start $(date +%s.%N | cut -c1-14)" >> $OUT/ends.txt
  launch 0 /tmp/fbg/$([ $f = 0 ] && echo bad || echo good).jsonl $f & sleep 1
  launch 1 /tmp/fbg/$([ $f = 1 ] && echo bad || echo good).jsonl $f & wait
done
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/ends.txt
cat $OUT/ends.txt; grep -H "error:\|forming the process group\|GroupNotFormed" $OUT/failing*-node*.log | cut -c1-400
