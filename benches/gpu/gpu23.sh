#!/usr/bin/env bash
# GPU run 23: more evidence on the teardown fix (test-gemm 30 more times; the other
# CUDA test executables that build many runtimes 3 times each, under the same 20 s
# watchdog, test-attention once), and three more samples of the streams suite with
# PyTorch's in the same run.
set -uo pipefail
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache RTX_REQUIRE_CUDA=1 RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
G=/usr/local/cuda/bin/cuda-gdb
loop() { # exe runs limit_tenths
  local exe=$1 runs=$2 lim=${3:-200} hangs=0 fails=0 ok=0 t0=$(date +%s)
  for i in $(seq 1 $runs); do
    $exe > /tmp/r$i.log 2>&1 & pid=$!
    n=0; while kill -0 $pid 2>/dev/null && [ $n -lt $lim ]; do sleep 0.1; n=$((n+1)); done
    if kill -0 $pid 2>/dev/null; then
      hangs=$((hangs+1)); echo "$exe run $i: STUCK"
      [ $hangs = 1 ] && timeout 150 $G -q -batch -p $pid -ex "set pagination off" -ex "thread apply all bt 30" > $OUT/hang-$(basename $exe).txt 2>&1
      kill -9 $pid; wait $pid 2>/dev/null
    else
      wait $pid; rc=$?
      if [ $rc = 0 ]; then ok=$((ok+1)); else fails=$((fails+1)); echo "$exe run $i rc=$rc"; grep -E "panicked|FAILED" -A1 /tmp/r$i.log | head -6; fi
    fi
  done
  echo "== $exe: ok=$ok failed=$fails stuck=$hangs in $(( $(date +%s) - t0 )) s"
}
loop .gpu/bin/dbg-test-gemm 30
for t in test-dag test-conv test-reduce test-elementwise test-memory test-oom test-poison; do loop .gpu/bin/$t 3; done
loop .gpu/bin/test-attention 1 900
for i in 1 2 3; do timeout 90 .gpu/bin/bench-harness --bench streams > $OUT/streams$i.jsonl 2>/dev/null; echo "streams $i rc=$?"; done
timeout 120 python3 benches/torch_baseline.py streams > $OUT/torch.jsonl 2> $OUT/torch.err; echo "torch rc=$?"
python3 - $OUT <<'PY'
import json, sys, glob
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(out + "/streams*.jsonl")) + [out + "/torch.jsonl"]:
    for l in open(f):
        try: d = json.loads(l)
        except Exception: continue
        c = d.get("case", "")
        if c.startswith("streams_8x200"):
            rows.setdefault(c, []).append(d.get("rtx_ms", d.get("torch_ms", d.get("ms"))))
for c, v in rows.items():
    print(c, " ".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in v))
PY
