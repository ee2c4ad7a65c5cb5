# Launch to step 1, and memory, on a large chat file: 2 ranks on CPU (tiny model), MAX_STEPS=1; every second the
# proportional set size (PSS: shared pages split among their users) of every process under torchrun is read from
# /proc/PID/smaps_rollup; the peak of the sum, and of each rank's own, is printed last.
#   [KEEP_LENGTHS=token_lengths-*.json] bash bench_results/chat-mix-probe/scale.sh DATA.jsonl NAME [KEY=VALUE ...]
data=$1 name=$2; shift 2
out=/tmp/dp2/out-$name; rm -rf $out; mkdir -p $out; log=/tmp/dp2/$name.log
[ -n "$KEEP_LENGTHS" ] && cp $KEEP_LENGTHS $out/  # a lengths file from an earlier run on the same data
start=$(date +%s.%N)
env DATA_PATH=$data OUTPUT_DIR=$out MAX_STEPS=1 MICRO_BATCH=2 ACCUM_STEPS=1 PYTHONUNBUFFERED=1 "$@" \
  timeout 1500 .venv/bin/torchrun --standalone --nproc_per_node=2 train_ddp.py > $log 2>&1 &
launcher=$!
peak_total=0 peak_rank=0
while kill -0 $launcher 2>/dev/null; do
  pids=$(pstree -pT $launcher | grep -o '([0-9]*)' | tr -d '()')
  total=0
  for p in $pids; do
    pss=$(awk '/^Pss:/ {print $2}' /proc/$p/smaps_rollup 2>/dev/null || echo 0)
    total=$((total + ${pss:-0}))
    if grep -q -- "train_ddp.py" /proc/$p/cmdline 2>/dev/null && [ "$p" != "$launcher" ]; then
      rss=$(awk '/^VmRSS:/ {print $2}' /proc/$p/status 2>/dev/null || echo 0); [ "${rss:-0}" -gt $peak_rank ] && peak_rank=$rss
    fi
  done
  [ $total -gt $peak_total ] && peak_total=$total
  sleep 1
done
wait $launcher; rc=$?
end=$(date +%s.%N)
first=$(grep -m1 "^step 1 |" $log >/dev/null && echo yes || echo no)
echo "| $name | exit $rc | launch to end $(python3 -c "print(f'{$end - $start:.0f}')") s | step 1 logged: $first | peak PSS, all processes: $((peak_total / 1024)) MiB | peak RSS of one process: $((peak_rank / 1024)) MiB |"
