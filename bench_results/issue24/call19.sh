# Session 9, GPU call 19 (nvidia-h200, 1 GPU; nvidia-h200-x2 not lent all session).
# 1. The GPU tests at this commit on one GPU (python -m pytest -m gpu: the 2-GPU NCCL tests skip themselves):
#    the code that runs in the job changed this session (zero-target steps, data checks before the first collective).
# 2. Where frugal's host-bound step time goes from run to run (calls 16-18: +-10% on one machine): the GPU's NUMA
#    node against the host's others. Frugal (24.5 GiB, compiled), 6 steps, pinned by taskset to the CPUs of the
#    GPU's node, then to the CPUs of another node (pinned host memory follows the CPU that first touches it).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
{ echo "== host"; nproc; grep Cpus_allowed_list /proc/self/status; cat /sys/devices/system/node/online
  for n in /sys/devices/system/node/node*; do echo "$(basename $n): $(cat $n/cpulist)"; done
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^0000\(....:\)/\1/')
  echo "gpu0 $bus numa_node $(cat /sys/bus/pci/devices/$bus/numa_node)"
  nvidia-smi topo -m; } > $OUT/host.txt 2>&1
cat $OUT/host.txt
start=$(date +%s)
timeout 230 python3 -m pytest -m gpu -p no:cacheprovider -q -rA --durations=0 > $OUT/gpu-1gpu.log 2>&1; echo "== pytest -m gpu on 1 GPU: exit $? in $(( $(date +%s) - start )) s"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" $OUT/gpu-1gpu.log | tail -25
gpunode=$(grep numa_node $OUT/host.txt | awk '{print $4}')
for node in /sys/devices/system/node/node*; do
  n=${node##*node}; cpus=$(python3 -c "import os;a=os.sched_getaffinity(0);c=[];[c.extend(range(int(x.split('-')[0]),int(x.split('-')[-1])+1)) for x in open('$node/cpulist').read().strip().split(',')];print(','.join(str(i) for i in c if i in a))")
  [ -z "$cpus" ] && continue
  label=$([ "$n" = "$gpunode" ] && echo local || echo remote)
  echo "== frugal pinned to node $n ($label): cpus $cpus"
  taskset -c $cpus timeout 135 python3 bench.py --steps 6 --run-timeout 130 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b$n > $OUT/bench-node$n.out 2>&1; echo "exit $?"
  grep -E "^step" /tmp/b$n/bench.log | cut -d"|" -f1,9,14 | tr '\n' ';'; echo; tail -n 1 $OUT/bench-node$n.out
done
