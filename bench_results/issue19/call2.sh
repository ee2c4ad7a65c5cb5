# Device call 2 (nvidia-h200-x2): bench.py's plain and fast-compile on 1 GPU each, each alone on its GPU (side by
# side, GPU 0 and GPU 1), 12B architecture, 2,048-token rows, 8 samples per step, steady steps 2..6; then the
# README's main job on 2 GPUs, timed from launch to the last process gone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1; O=$OUT
(CUDA_VISIBLE_DEVICES=0 timeout 480 python3 bench.py --runs plain --run-timeout 420 --out $O/plain > $O/plain.out 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 480 python3 bench.py --runs fast-compile --run-timeout 420 --out $O/fast-compile > $O/fast-compile.out 2>&1) &
wait
OUTPUT_DIR=/tmp/main-out timeout 120 python3 bench_results/gpu-lane/timed_job.py $O/main_job.log -- torchrun --standalone --nproc_per_node=2 train_ddp.py > $O/main_job.txt 2>&1
cat $O/main_job.txt; tail -n 4 $O/plain.out $O/fast-compile.out
