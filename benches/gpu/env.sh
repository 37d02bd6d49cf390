# Sourced by the GPU run scripts (from gpu30.sh on; the earlier ones are kept as they
# ran): the host's CUDA library folders, the staged kernel cache, and `show_streams
# FILE [KEYS...]`, which prints a harness output's streams rows (rtx and raw) for 1 and 4 streams
# (with the named extra fields, e.g. `execute_ms`).
export RTX_KERNEL_CACHE=$PWD/.gpu/kcache
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
show_streams() {
  python3 - "$@" <<'PY'
import json, sys
path, keys = sys.argv[1], sys.argv[2:]
for line in open(path):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    c = d.get("case", "")
    if "streams_8x200" in c and c[-2:] in ("_1", "_4"):
        extra = " ".join("%s=%.2f" % (k, d[k]) for k in keys if k in d)
        print("   %-32s %7.2f ms (min %.2f) %s" % (c, d["rtx_ms"], d["min_ms"], extra))
PY
}
