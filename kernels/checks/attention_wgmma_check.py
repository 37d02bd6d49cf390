#!/usr/bin/env python3
"""Correctness and speed of kernels/cuda/attention_wgmma.cu (FlashAttention forward with Hopper
wgmma, sm_90a) next to the mma.sync forward of attention.cu and PyTorch SDPA.

Two steps, because the GPU host has no Rust and the kernel needs the sm_90a target:

1. Here (Rust + NVRTC, no GPU):   python3 kernels/checks/attention_wgmma_check.py --build [DIR]
   compiles attention_wgmma.cu once per VARIANT (-D tunables) and attention.cu (the mma.sync
   baseline) with the ptxas example (NVRTC 13.0; sm_90a resp. sm_90) into DIR (default
   .wgmma_cubin/, git-ignored) with manifest.json (defines,
   registers, spills).
2. On the GPU host:               python3 kernels/checks/attention_wgmma_check.py [--cubins DIR]
   loads the CUBINs with cupy and, for every variant, checks the forward against float64
   PyTorch math (fresh torch.randn inputs, o and lse poisoned with NaN): dtype {f16, bf16} x
   D {64, 128} x causal {0, 1} x mask {none, [Lq,Lk], [B,H,Lq,Lk] with -inf entries and one
   fully masked row} x (Lq, Lk) incl. 1, 17, 1000, 4097 and Lq != Lk x GQA {H = 2 Hkv, H = Hkv};
   relative errors ||x - ref|| / ||ref|| of o and lse, PASS when < 2e-2 (the default variant
   gets the full set, the others a reduced one). A failing variant gets a layout diagnosis
   (one-hot attention: which V row / column each output row / column matches). Then it
   times (CUDA events, medians, 2 rotating input sets) bf16, B*L = 16384, H*D = 2048,
   L in {1024, 4096, 16384}, causal 0/1: the passing wgmma variants, the mma.sync forward and
   torch.nn.functional.scaled_dot_product_attention (the fastest of its default dispatch and
   its cuDNN and flash backends: attention_check.sdpa_best_ms), and prints TFLOP/s and ratios
   to SDPA.
   Full log and a JSON summary go to $OUT when set.

   Each variant is checked in a child process, so a kernel fault or hang costs that variant
   only (--child-timeout seconds).

Options: --quick (fewer cases / lengths), --no-bench, --no-check, --variants a,b.
--bwd: the same for the wgmma backward main kernel (attention_wgmma_bwd.cu, D = 128) and the TMA
backward's (attention_tma_bwd.cu, btma* variants, D = 128 and 64; the mma.sync backward is their
D = 64 reference in the timing), each with attention.cu's preprocess and convert kernels: dq, dk,
dv against float64 autograd (f16/bf16,
causal 0/1, no mask / [Lq,Lk] / [B,H,Lq,Lk] masks with -inf entries and a fully masked row, odd
lengths, Lq != Lk, GQA; outputs NaN-poisoned), then backward-only and forward + backward time
next to the mma.sync backward and SDPA (bf16, B*L = 16384, H = 16, L 4096 / 16384, causal 0/1):
  PYTHONUNBUFFERED=1 timeout 185 python3 kernels/checks/attention_wgmma_check.py --bwd --child-timeout 60
(about 60 s on the H200 with 4 variants).
On the GPU host, with .wgmma_cubin/ copied into its checkout:
  PYTHONUNBUFFERED=1 timeout 285 python3 kernels/checks/attention_wgmma_check.py 2>&1 | tee $OUT/log.txt
(about 60 s with 9 variants on the H200).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # kernels/checks/ -> root
DEFAULT_CUBINS = os.path.join(ROOT, ".wgmma_cubin")
TOL = 2e-2

# (name, -D defines of attention_wgmma.cu, head dims it is meant for, note). "wg" = defaults.
# Measured on the H200 so far (fwd TFLOP/s ratio to SDPA at L >= 4096, bf16): the defaults are
# the winners of runs 1-2 (D128 0.71-0.77, D64 0.80-0.88); D128 alternatives below are untimed
# candidates (2 CTAs/SM of one warpgroup; without the S/PV overlap: within noise in run 2).
VARIANTS = [
    ("wg", {}, (64, 128), "defaults: D128 2 WG x 128 keys, S/PV overlap, in turn; "
                          "D64 2 WG x 64 keys, 2 CTAs/SM"),
    ("d128w1m2", {"ATTN_WG_D128_NWG": 1, "ATTN_WG_D128_BC": 64, "ATTN_WG_D128_PIPE": 0,
                  "ATTN_WG_D128_ORDER": 0, "ATTN_WG_D128_MINB": 2}, (128,),
     "D128: 1 WG x 64 keys, no overlap, 2 CTAs/SM"),
    ("d128w1m2p", {"ATTN_WG_D128_NWG": 1, "ATTN_WG_D128_BC": 64, "ATTN_WG_D128_PIPE": 1,
                   "ATTN_WG_D128_ORDER": 0, "ATTN_WG_D128_MINB": 2}, (128,),
     "D128: 1 WG x 64 keys, S/PV overlap, 2 CTAs/SM"),
    ("d128np", {"ATTN_WG_D128_PIPE": 0}, (128,), "D128: defaults without S/PV overlap"),
    # flash_fwd_tma_d128_* (attention_tma.cu; rtx's D=128 forward on the H200): a producer
    # warpgroup with bulk tensor copies, two consumer warpgroups, stages handed over by
    # mbarriers (tma_cfg below). 2026-12-04: tma 0.83-0.94x SDPA at L >= 4096 (wg 0.66-0.77);
    # 3 K stages, or 3 K and 3 V, 3-9 % slower; D64 slower than wg at L = 1024 (the kernel's
    # comment); 176-key tiles (FlashAttention-3's non-causal tile) spilled 788 B in the masked
    # build; the mask-less one had none and was not faster (runs 24a-24b), removed.
    ("tma", {}, (128,), "TMA: producer WG + 2 consumer WG x 64 rows, 128 keys, 2 K + 2 V stages"),
    ("tma64", {"ATTN_TMA_D64_WG": 2}, (64, 128), "TMA, D64 with 2 consumer WG x 64 rows (not adopted)"),
    ("tmanm", {"ATTN_TMA_NOMASK": 1}, (128,), "D128 TMA, calls without a mask on kernels without the mask's "
                                               "loads (no consumer spill)"),
    ("tma64w3", {"ATTN_TMA_D64_WG": 3, "ATTN_TMA_NOMASK": 1, "ATTN_TMA_D64_MASKED": 1}, (64,),
     "D64 TMA with 3 consumer WG x 64 rows (FA-3's D64 block), mask-less calls on the nm kernels "
     "(160 registers; the masked kernel spills)"),
    # The launch's grid and scheduler (attention_tma.cu, "Work tiles"; no build of their own:
    # "launch_cubin" names the CUBIN, "launch_*" keys are not -D defines): tmanm / tma64w3 above
    # launch a block per work tile; "launch_persist" 1 gives calls without causal masking at most
    # one block per SM, 2 every call; "launch_sched" 1 hands the tiles out by the kernel's atomic
    # counter (the launcher's way), else each block takes every grid-th; "launch_blocks" caps the
    # grid lower still, so that the check's small cases run several work tiles per block.
    ("tmad", {"launch_cubin": "tmanm", "ATTN_TMA_NOMASK": 1, "launch_persist": 2, "launch_sched": 1}, (128,),
     "tmanm on the launcher's grid: one block per SM, tiles handed out by the counter"),
    ("tmap", {"launch_cubin": "tmanm", "ATTN_TMA_NOMASK": 1, "launch_persist": 1}, (128,),
     "tmanm, one block per SM without causal masking, every grid-th tile (no counter)"),
    ("tmad5", {"launch_cubin": "tmanm", "ATTN_TMA_NOMASK": 1, "launch_persist": 2, "launch_sched": 1,
               "launch_blocks": 5}, (128,), "tmad on at most 5 blocks (several work tiles per block; for the check)"),
    ("tmap5", {"launch_cubin": "tmanm", "ATTN_TMA_NOMASK": 1, "launch_persist": 2, "launch_blocks": 5}, (128,),
     "tmap (every call) on at most 5 blocks"),
    ("tmam5", {"launch_cubin": "tma", "launch_persist": 2, "launch_sched": 1, "launch_blocks": 5}, (128,),
     "the masked D128 build, counter, at most 5 blocks"),
    ("tma64d", {"launch_cubin": "tma64w3", "launch_persist": 2, "launch_sched": 1, "ATTN_TMA_D64_WG": 3,
                "ATTN_TMA_NOMASK": 1}, (64,), "tma64w3 on the launcher's grid (one block per SM, the counter)"),
    ("tma64d5", {"launch_cubin": "tma64w3", "launch_persist": 2, "launch_sched": 1, "launch_blocks": 5,
                 "ATTN_TMA_D64_WG": 3, "ATTN_TMA_NOMASK": 1}, (64,), "tma64d on at most 5 blocks"),
    # The softmax kept before the wait for the previous P V in the SASS (attention_tma.cu,
    # ATTN_TMA_SOFTMAX_FIRST). Runs 24a-24b (H100): the full checks passed; 2-13 % slower than the
    # default order at L >= 4096.
    ("tmasf", {"ATTN_TMA_NOMASK": 1, "ATTN_TMA_SOFTMAX_FIRST": 1}, (128,),
     "tmanm with the softmax kept before the wait for the previous P V (masked kernel too)"),
    ("tmasfd", {"launch_cubin": "tmasf", "ATTN_TMA_NOMASK": 1, "ATTN_TMA_SOFTMAX_FIRST": 1, "launch_persist": 2,
                "launch_sched": 1}, (128,), "tmasf on the launcher's grid (one block per SM, the counter)"),
    ("tmasfd5", {"launch_cubin": "tmasf", "ATTN_TMA_NOMASK": 1, "ATTN_TMA_SOFTMAX_FIRST": 1, "launch_persist": 2,
                 "launch_sched": 1, "launch_blocks": 5}, (128,), "tmasfd on at most 5 blocks"),
    ("tma64sf", {"ATTN_TMA_D64_WG": 3, "ATTN_TMA_NOMASK": 1, "ATTN_TMA_D64_MASKED": 1,
                 "ATTN_TMA_SOFTMAX_FIRST": 1}, (64,), "tma64w3 with the softmax kept before the wait"),
    ("tma64sfd", {"launch_cubin": "tma64sf", "ATTN_TMA_D64_WG": 3, "ATTN_TMA_NOMASK": 1, "ATTN_TMA_SOFTMAX_FIRST": 1,
                  "launch_persist": 2, "launch_sched": 1}, (64,), "tma64sf on the launcher's grid"),
    ("tma64sfd5", {"launch_cubin": "tma64sf", "ATTN_TMA_D64_WG": 3, "ATTN_TMA_NOMASK": 1,
                   "ATTN_TMA_SOFTMAX_FIRST": 1, "launch_persist": 2, "launch_sched": 1, "launch_blocks": 5}, (64,),
     "tma64sfd on at most 5 blocks"),
    # mbarrier waits that suspend instead of spinning (attention_tma.cu, ATTN_TMA_WAIT_SLEEP): 1 the
    # producer's, 2 every wait.
    ("tmaws1", {"ATTN_TMA_NOMASK": 1, "ATTN_TMA_D64_MASKED": 1, "ATTN_TMA_WAIT_SLEEP": 1}, (128, 64),
     "tmanm / tma64w3 with the producer's waits suspending"),
    ("tmaws2", {"ATTN_TMA_NOMASK": 1, "ATTN_TMA_D64_MASKED": 1, "ATTN_TMA_WAIT_SLEEP": 2}, (128, 64),
     "tmanm / tma64w3 with every mbarrier wait suspending"),
    ("tmaws1d", {"launch_cubin": "tmaws1", "ATTN_TMA_NOMASK": 1, "ATTN_TMA_WAIT_SLEEP": 1, "launch_persist": 2,
                 "launch_sched": 1}, (128, 64), "tmaws1 on the launcher's grid"),
    ("tmaws2d", {"launch_cubin": "tmaws2", "ATTN_TMA_NOMASK": 1, "ATTN_TMA_WAIT_SLEEP": 2, "launch_persist": 2,
                 "launch_sched": 1}, (128, 64), "tmaws2 on the launcher's grid"),
    ("tmaws2d5", {"launch_cubin": "tmaws2", "ATTN_TMA_NOMASK": 1, "ATTN_TMA_WAIT_SLEEP": 2, "launch_persist": 2,
                  "launch_sched": 1, "launch_blocks": 5}, (128, 64), "tmaws2d on at most 5 blocks (for the check)"),
    ("tmak3", {"ATTN_TMA_KS": 3}, (128,), "D128 TMA with 3 K stages"),
    ("tmak3v3", {"ATTN_TMA_KS": 3, "ATTN_TMA_VS": 3}, (128,), "D128 TMA with 3 K and 3 V stages"),
]
# D -> (warpgroups, keys per tile, PIPE), the defaults of attention_wgmma.cu
DEFAULT_TILES = {128: (2, 128, 1), 64: (2, 64, 0)}


def wg_cfg(defs, D):
    """(threads, dynamic smem bytes, query rows per block) of flash_fwd_wgmma_d{D}_* built
    with `defs` (the formula documented at the top of attention_wgmma.cu)."""
    nwg = int(defs.get("ATTN_WG_D%d_NWG" % D, DEFAULT_TILES[D][0]))
    bc = int(defs.get("ATTN_WG_D%d_BC" % D, DEFAULT_TILES[D][1]))
    vstages = 3 if int(defs.get("ATTN_WG_D%d_PIPE" % D, DEFAULT_TILES[D][2])) else 2
    smem = 1024 + 64 * nwg * D * 2 + (2 + vstages) * bc * D * 2
    return 128 * nwg, smem, 64 * nwg


assert wg_cfg({}, 128) == (256, 197632, 128) and wg_cfg({}, 64) == (256, 50176, 128)


def tma_cfg(defs, D=128):
    """(threads, dynamic smem bytes, query rows per block) of flash_fwd_tma_d{D}_* (the launch
    documented above the kernel in attention_tma.cu): 2 consumer warpgroups, and 3 for D = 64
    unless built with ATTN_TMA_D64_WG=2."""
    ks, vs = int(defs.get("ATTN_TMA_KS", 2)), int(defs.get("ATTN_TMA_VS", 2))
    nwg = int(defs.get("ATTN_TMA_D64_WG", 3)) if D == 64 else 2
    br = 64 * nwg
    return 128 * (nwg + 1), 1024 + br * D * 2 + (ks + vs) * 128 * D * 2 + 8 * (3 + 2 * ks + 2 * vs), br


assert tma_cfg({})[1] == 164952 and tma_cfg({"ATTN_TMA_D64_WG": 2}, 64)[1] == 83032
assert tma_cfg({}, 64) == (512, 91224, 192)


class TensorMaps:
    """CUtensorMap encoding through the driver (cuTensorMapEncodeTiled, ctypes): the 3-D maps
    (D, L, B * heads) that flash_fwd_tma_* (q, k, v) and flash_bwd_tma_* (q, k, v, dO) take, box
    (64, rows, 1) (rows 128, or 64 for the backward's q and dO), 128-byte swizzle."""
    def __init__(self):
        import ctypes
        self.ct = ctypes
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.cache = {}

    def encode(self, ptr, D, L, heads, bf16, rows=128, f32=False):
        """16-bit elements (bf16 or f16), box (64, rows, 1); f32=True: f32 elements, box
        (32, rows, 1) (the backward's dq_accum map, rows = 16)."""
        ct = self.ct
        key = (int(ptr), D, L, heads, bf16, rows, f32)
        if key in self.cache:
            return self.cache[key]
        m = (ct.c_uint64 * 16)()
        es_bytes = 4 if f32 else 2
        dims = (ct.c_uint64 * 3)(D, L, heads)
        strides = (ct.c_uint64 * 2)(D * es_bytes, L * D * es_bytes)
        box = (ct.c_uint32 * 3)(32 if f32 else 64, rows, 1)
        es = (ct.c_uint32 * 3)(1, 1, 1)
        # data type FLOAT32 = 7 / BFLOAT16 = 9 / FLOAT16 = 6, interleave none, swizzle 128B = 3,
        # L2 promotion 128B = 2, OOB fill none (zeros) = 0
        r = self.lib.cuTensorMapEncodeTiled(ct.byref(m), 7 if f32 else (9 if bf16 else 6), 3, ct.c_void_p(int(ptr)),
                                            dims, strides, box, es, 0, 3, 2, 0)
        if r != 0:
            raise RuntimeError("cuTensorMapEncodeTiled failed: CUresult %d" % r)
        out = bytes(bytearray(m))
        self.cache[key] = out
        return out


def tma_fwd_params(params_dtype, maps, p, B, H, Lq, D, bf16, br):
    """The FlashTmaParams of flash_fwd_tma_* (attention_tma.cu: the FlashParams `p`, `sched` left
    null, the q, k, v tensor maps) as a one-element numpy structured array; br = the kernel's query
    rows per block (q's box has 128 rows for 128, else 64)."""
    import numpy as np
    tdt = np.dtype({"names": ["p", "sched", "q", "k", "v"],
                    "formats": [params_dtype, "u8", "V128", "V128", "V128"],
                    "offsets": [0, 152, 192, 320, 448], "itemsize": 576})
    tp = np.zeros(1, dtype=tdt)
    tp["p"] = p
    pp = p[0] if getattr(p, "shape", ()) else p
    Hkv, Lk = int(pp["Hkv"]), int(pp["Lk"])
    qbox = 128 if br == 128 else 64
    for f, L, heads, rows in (("q", Lq, B * H, qbox), ("k", Lk, B * Hkv, 128), ("v", Lk, B * Hkv, 128)):
        tp[f] = np.frombuffer(maps.encode(pp[f], D, L, heads, bf16, rows), dtype="V128")[0]
    return tp


def tma_bwd_params(params_dtype, maps, p, B, H, Hkv, Lq, Lk, D, bf16, qrows=64):
    """The `FlashTmaBwdParams` of flash_bwd_tma_* (attention_tma_bwd.cu: 832 bytes, q, k, v, dout,
    dq maps at 192, 320, 448, 576, 704) for the FlashParams `p` (a 1-element array of `params_dtype`):
    q and dO maps with boxes of `qrows` rows (the kernel's query rows per step: 64 for D = 128,
    128 for D = 64 unless built with ATTN_TBW_D64_BR=64), k and v with 128-row ones, dq_accum's
    (f32) with boxes of 32 columns by 16 rows."""
    import numpy as np
    tdt = np.dtype({"names": ["p", "q", "k", "v", "dout", "dq"], "formats": [params_dtype] + ["V128"] * 5,
                    "offsets": [0, 192, 320, 448, 576, 704], "itemsize": 832})
    tp = np.zeros(1, dtype=tdt)
    tp["p"] = p
    pp = p[0] if getattr(p, "shape", ()) else p
    for f, L, heads, rows in (("q", Lq, B * H, qrows), ("k", Lk, B * Hkv, 128), ("v", Lk, B * Hkv, 128),
                              ("dout", Lq, B * H, qrows)):
        tp[f] = np.frombuffer(maps.encode(pp[f], D, L, heads, bf16, rows), dtype="V128")[0]
    tp["dq"] = np.frombuffer(maps.encode(pp["dq_accum"], D, Lq, B * H, bf16, 16, f32=True), dtype="V128")[0]
    return tp


# ---------------------------------------------------------------------------------------
# Step 1 (here): build the CUBINs
# ---------------------------------------------------------------------------------------
def build(outdir):
    os.makedirs(outdir, exist_ok=True)
    # the environment after `eval "$(bash .ci/nvrtc-setup --env)"` (NVRTC 13.0 from PyPI)
    dump = subprocess.run(["bash", "-c", 'eval "$(bash .ci/nvrtc-setup --env)" && env -0'], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    env = dict(kv.split("=", 1) for kv in dump.split("\0") if "=" in kv)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "rtx-kernels", "--example", "ptxas"],
                   cwd=ROOT, env=env, check=True)
    exe = os.path.join(ROOT, "target", "release", "examples", "ptxas")
    manifest = {}
    tmp = os.path.join(outdir, "tmp")
    # the tma* variants are flash_fwd_tma_* of attention_tma.cu, the others attention_wgmma.cu's
    jobs = ([(n, "attention_tma" if n.startswith("tma") else "attention_wgmma", d) for (n, d, _, _) in VARIANTS
             if "launch_cubin" not in d] +
            [("attention", "attention", {})] +
            [(n, "attention_tma_bwd" if n.startswith("btma") else "attention_wgmma_bwd", d)
             for (n, d, _) in BWD_VARIANTS])
    for name, program, defs in jobs:
        os.makedirs(tmp, exist_ok=True)
        flags = ["--flag=-D%s=%s" % kv for kv in sorted(defs.items())]
        out = subprocess.run([exe, program, "--out=" + tmp, "--log"] + flags, cwd=ROOT, env=env,
                             capture_output=True, text=True)
        text = out.stdout + out.stderr
        report = [l.strip() for l in text.splitlines() if l.startswith("  flash_")]
        warn = [l.strip() for l in text.splitlines() if "C75" in l and "C7519" not in l]
        src = os.path.join(tmp, program + ".cubin")
        if out.returncode != 0 or not os.path.exists(src):
            raise SystemExit("building %s failed:\n%s" % (name, text[-3000:]))
        shutil.move(src, os.path.join(outdir, name + ".cubin"))
        manifest[name] = {"defines": defs, "report": report, "warnings": warn}
        print("%-10s %s" % (name, " ".join("-D%s=%s" % kv for kv in sorted(defs.items())) or "(defaults)"))
        for l in report + warn:
            print("    " + l)
    shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


# ---------------------------------------------------------------------------------------
# Step 2 (GPU host)
# ---------------------------------------------------------------------------------------
def gpu_main(args):
    sys.path.insert(0, HERE)
    import attention_check as ac  # noqa: E402  (sets TMPDIR under $OUT, imports torch, cupy)
    import torch
    import torch.nn.functional as F
    import cupy

    out_dir = os.environ.get("OUT")
    t0 = time.time()
    dev = torch.cuda.get_device_properties(0)
    print("device: %s, torch %s, cupy %s" % (dev.name, torch.__version__, cupy.__version__))
    manifest = {}
    mpath = os.path.join(args.cubins, "manifest.json")
    if os.path.exists(mpath):
        manifest = json.load(open(mpath))

    class Mod:
        def __init__(self, path):
            self.mod = cupy.RawModule(path=path)
            self.fns = {}

        def launch(self, name, grid, block, smem, params):
            k = self.fns.get(name)
            if k is None:
                k = self.mod.get_function(name)
                if smem > 48 * 1024:
                    k.max_dynamic_shared_size_bytes = smem
                self.fns[name] = k
            k(grid, block, (params,), shared_mem=smem)

    class Wg:
        def __init__(self, name, defs, dims):
            self.name, self.defs, self.dims = name, defs, dims
            self.m = Mod(os.path.join(args.cubins, defs.get("launch_cubin", name) + ".cubin"))

        def fwd(self, p, B, H, Lq, D, dt):
            threads, smem, br = wg_cfg(self.defs, D)
            self.m.launch("flash_fwd_wgmma_d%d_%s" % (D, dt), ((Lq + br - 1) // br, H, B),
                          (threads, 1, 1), smem, p)

    class Tma(Wg):
        maps = None
        sched = None

        def fwd(self, p, B, H, Lq, D, dt):
            if Tma.maps is None:
                Tma.maps = TensorMaps()
            pp = p[0] if getattr(p, "shape", ()) else p
            threads, smem, br = tma_cfg(self.defs, D)
            tp = tma_fwd_params(ac.PARAMS_DTYPE, Tma.maps, p, B, H, Lq, D, dt == "bf16", br)
            # ATTN_TMA_NOMASK: calls without a mask take the flash_fwd_tma_nm_* kernels
            nm = "nm_" if int(self.defs.get("ATTN_TMA_NOMASK", 0)) and int(pp["mask"]) == 0 else ""
            # the work tiles, one block each, or fewer blocks taking several (see VARIANTS)
            blocks = (Lq + br - 1) // br * H * B
            persist = int(self.defs.get("launch_persist", 0))
            if persist == 2 or (persist == 1 and not int(pp["causal"])):
                blocks = min(blocks, torch.cuda.get_device_properties(0).multi_processor_count,
                             int(self.defs.get("launch_blocks", 1 << 30)))
            if int(self.defs.get("launch_sched", 0)):
                if self.sched is None:  # [next, done], left at 0 by every launch
                    self.sched = torch.zeros(2, dtype=torch.int32, device="cuda")
                tp["sched"] = self.sched.data_ptr()
            self.m.launch("flash_fwd_tma_%sd%d_%s" % (nm, D, dt), (blocks, 1, 1), (threads, 1, 1), smem, tp)

    class Mma:
        name, dims = "mma", (64, 128)

        def __init__(self):
            path = os.path.join(args.cubins, "attention.cubin")
            self.m = Mod(path) if os.path.exists(path) else None
            self.k = None if self.m else ac.Kernels({}, "base")

        def fwd(self, p, B, H, Lq, D, dt):
            if self.k:
                ac.run_fwd(self.k, p, B, H, Lq, D, dt)
                return
            threads, smem = ac.fwd_launch_cfg(D, 1 if D == 64 else 0)
            self.m.launch("flash_fwd_d%d_%s" % (D, dt), ((Lq + 127) // 128, H, B), (threads, 1, 1), smem, p)

    # ---- builds ----
    sel = [x for x in args.variants.split(",") if x]
    builds = []
    for (name, defs, dims, note) in VARIANTS:
        if (sel and name not in sel and (name != "wg" or args.no_wg)) or (args.child and name != args.child):
            continue
        try:
            builds.append((Tma if name.startswith("tma") else Wg)(name, defs, dims))
            rep = manifest.get(name, {})
            print("loaded %-10s [%s]  %s" % (name, note, "; ".join(
                r for r in rep.get("report", []) if "bf16" in r)))
            for w in rep.get("warnings", []):
                print("    " + w)
        except Exception as e:  # noqa: BLE001
            print("variant %s: LOAD FAILED: %s" % (name, str(e)[:300]))
    mma = Mma()

    # ---- correctness ----
    def ref_fwd(q, k, v, mask, causal, scale):
        G = q.shape[1] // k.shape[1]
        kk = k.double().repeat_interleave(G, dim=1)
        vv = v.double().repeat_interleave(G, dim=1)
        s = torch.matmul(q.double(), kk.transpose(-1, -2)) * scale
        if mask is not None:
            s = s + mask.double()
        Lq, Lk = q.shape[2], k.shape[2]
        if causal:
            tri = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(1)
            s = s.masked_fill(tri, float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s - m)
        l = e.sum(dim=-1, keepdim=True)
        o = torch.matmul(e / torch.where(l == 0, torch.ones_like(l), l), vv)
        lse = torch.where(l == 0, torch.full_like(l, float("-inf")), torch.log(l) + m).squeeze(-1)
        return o, lse

    def make_inputs(dtype, D, mask_mode, Lq, Lk, B, H, Hkv, gen):
        q = torch.randn(B, H, Lq, D, device="cuda", generator=gen).to(dtype)
        k = torch.randn(B, Hkv, Lk, D, device="cuda", generator=gen).to(dtype)
        v = torch.randn(B, Hkv, Lk, D, device="cuda", generator=gen).to(dtype)
        mask, mstr = None, (0, 0, 0)
        if mask_mode:
            shape = (Lq, Lk) if mask_mode == 1 else (B, H, Lq, Lk)
            mask = torch.randn(*shape, device="cuda", generator=gen)
            drop = torch.rand(*shape, device="cuda", generator=gen) < 0.06
            mask = mask.masked_fill(drop, float("-inf"))
            if Lq > 3:
                mask[..., 3, :] = float("-inf")  # one fully masked row
            mask = mask.to(dtype).contiguous()
            mstr = (0, 0, Lk) if mask_mode == 1 else (H * Lq * Lk, Lq * Lk, Lk)
        return q, k, v, mask, mstr

    def run_case(K, q, k, v, mask, mstr, causal, scale):
        B, H, Lq, D = q.shape
        dt = ac.tname(q.dtype)
        o = torch.full((B, H, Lq, D), float("nan"), device="cuda", dtype=q.dtype)
        lse = torch.full((B, H, Lq), float("nan"), device="cuda", dtype=torch.float32)
        p = ac.make_params(q, k, v, o, lse, mask, mstr, causal, scale)
        K.fwd(p, B, H, Lq, D, dt)
        torch.cuda.synchronize()
        return o, lse

    def check(K, dtype, D, causal, mask_mode, Lq, Lk, gqa, gen):
        big = Lq >= 1000 and Lk >= 1000
        B, H = (1, 2) if big else (2, 4)
        Hkv = H // 2 if gqa else H
        scale = 1.0 / math.sqrt(D)
        q, k, v, mask, mstr = make_inputs(dtype, D, mask_mode, Lq, Lk, B, H, Hkv, gen)
        o, lse = run_case(K, q, k, v, mask, mstr, causal, scale)
        ro, rl = ref_fwd(q, k, v, mask, causal, scale)
        return {"o": ac.relerr(o, ro), "lse": ac.relerr(lse, rl)}

    def cases(full):
        lengths = [(1, 1), (17, 17), (1000, 1000), (4097, 4097), (1, 1000), (17, 1000), (1000, 17),
                   (300, 4097), (4097, 129)]
        if not full:
            lengths = [(17, 17), (1000, 1000), (1000, 17), (17, 1000), (1025, 1025)]
        for dtype in (torch.bfloat16, torch.float16):
            for D in (128, 64):
                for causal in (0, 1):
                    for mask_mode in (0, 1, 2):
                        for i, (Lq, Lk) in enumerate(lengths):
                            for gqa in (True, False):
                                if not full and (mask_mode + i + int(gqa)) % 2:
                                    continue  # reduced set: half the combinations
                                yield dtype, D, causal, mask_mode, Lq, Lk, gqa

    def diagnose(K):
        """One-hot attention (q = k, large scale: row i attends key i only, O = V) on one tile:
        prints which V row / column each output row / column matches best."""
        gen = torch.Generator(device="cuda")
        gen.manual_seed(7)
        for D in (128, 64):
            L = 128
            q = torch.randn(1, 1, L, D, device="cuda", generator=gen).to(torch.bfloat16)
            v = torch.randn(1, 1, L, D, device="cuda", generator=gen).to(torch.bfloat16)
            o, lse = run_case(K, q, q, v, None, (0, 0, 0), 0, 4.0)
            ro, rl = ref_fwd(q, q, v, None, 0, 4.0)
            of, rf = o[0, 0].double(), ro[0, 0]
            rows = (of @ rf.T).argmax(dim=1).tolist()
            cols = (of.T @ rf).argmax(dim=1).tolist()
            print("  diagnose %s D=%d: o err %.2e, lse err %.2e; NaN in o: %d" % (
                K.name, D, ac.relerr(o, ro), ac.relerr(lse, rl), int(torch.isnan(o).sum())))
            bad_r = [(i, j) for i, j in enumerate(rows) if i != j]
            bad_c = [(i, j) for i, j in enumerate(cols) if i != j]
            print("    rows matching ref: %d/%d, first mismatches %s" % (L - len(bad_r), L, bad_r[:12]))
            print("    cols matching ref: %d/%d, first mismatches %s" % (D - len(bad_c), D, bad_c[:12]))
            print("    lse[:8] got %s ref %s" % ([round(x, 3) for x in lse[0, 0, :8].tolist()],
                                                  [round(x, 3) for x in rl[0, 0, :8].tolist()]))

    summary = {"variants": {}, "manifest": manifest}
    ok_names = []
    ran_names = []
    if not args.no_check and not args.child:
        # Each variant is checked in a child process: a kernel fault (sticky CUDA error) or a
        # hang then costs that variant only.
        res_dir = os.path.join("/tmp", "attention_wgmma_check_%d" % os.getpid())
        os.makedirs(res_dir, exist_ok=True)
        for K in builds:
            res_path = os.path.join(res_dir, "result_%s.json" % K.name)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", K.name, "--cubins", args.cubins,
                   "--result", res_path] + (["--quick"] if args.quick else [])
            try:
                rc = subprocess.run(cmd, timeout=args.child_timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout after %d s" % args.child_timeout
            if rc != 0:
                print("check of %s: child exit %s" % (K.name, rc), flush=True)
            if os.path.exists(res_path):
                r = json.load(open(res_path))
                summary["variants"][K.name] = r
                if r["pass"] == r["cases"] and r["cases"] > 0:
                    ok_names.append(K.name)
                elif not r.get("lost"):
                    ran_names.append(K.name)  # wrong results, but safe to time
    elif args.child:
        fmt = lambda x: "%8.1e" % x if x == x else "     NaN"  # noqa: E731
        for K in [K for K in builds if K.name == args.child]:
            full = K.name in ("wg", "tma", "tmanm", "tma64w3", "tmad5", "tma64d5", "tmasf", "tmasfd5", "tma64sf",
                              "tma64sfd5", "tmaws2", "tmaws2d5") and not args.quick
            gen = torch.Generator(device="cuda")
            gen.manual_seed(1234)
            res, worst, t1 = [], {"o": 0.0, "lse": 0.0}, time.time()
            print("\n== correctness of %s (%s set) vs float64, PASS < %.0e; failures listed ==" % (
                K.name, "full" if full else "reduced", TOL))
            lost = False
            for (dtype, D, causal, mm, Lq, Lk, gqa) in cases(full):
                if D not in K.dims:
                    continue
                try:
                    errs = check(K, dtype, D, causal, mm, Lq, Lk, gqa, gen)
                    note = ""
                except Exception as e:  # noqa: BLE001
                    errs, note = {"o": float("nan"), "lse": float("nan")}, str(e)[:160]
                    try:
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001
                        lost = True
                ok = all(x == x and x < TOL for x in errs.values())
                for n in worst:
                    worst[n] = max(worst[n], errs[n]) if errs[n] == errs[n] else float("nan")
                res.append(dict(dt=ac.tname(dtype), D=D, causal=causal, mask=mm, Lq=Lq, Lk=Lk,
                                gqa=gqa, ok=ok, errs=errs, note=note))
                if not ok:
                    print("FAIL %-4s D=%3d causal=%d mask=%d Lq=%5d Lk=%5d gqa=%d | o %s lse %s %s" % (
                        ac.tname(dtype), D, causal, mm, Lq, Lk, gqa, fmt(errs["o"]), fmt(errs["lse"]), note),
                        flush=True)
                if lost:
                    print("CUDA context lost; stopping")
                    break
            n_ok = sum(r["ok"] for r in res)
            print("%s: %d / %d PASS, max rel err o %s lse %s (%.0f s)" % (
                K.name, n_ok, len(res), fmt(worst["o"]), fmt(worst["lse"]), time.time() - t1), flush=True)
            summary["variants"][K.name] = {"pass": n_ok, "cases": len(res), "worst": worst, "lost": lost,
                                           "fails": [r for r in res if not r["ok"]][:40]}
            with open(args.result, "w") as f:
                json.dump(summary["variants"][K.name], f, default=str)
            if n_ok == len(res) and res:
                ok_names.append(K.name)
            elif not lost:
                try:
                    diagnose(K)
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
            if lost:
                break
        # determinism: the same inputs three times give bitwise the same output
        if args.child in ("wg", "tma", "tmad5", "tma64d5", "tmasfd5", "tma64sfd5", "tmaws2d5") and args.child in ok_names:
            K = builds[0]
            gen = torch.Generator(device="cuda")
            gen.manual_seed(99)
            for D in [D for D in (128, 64) if D in K.dims]:
                q, k, v, mask, mstr = make_inputs(torch.bfloat16, D, 2, 4097, 4097, 1, 4, 2, gen)
                outs = [run_case(K, q, k, v, mask, mstr, 1, 1.0 / math.sqrt(D)) for _ in range(3)]
                same = all(torch.equal(outs[0][0], x[0]) and torch.equal(outs[0][1].nan_to_num(), x[1].nan_to_num())
                           for x in outs[1:])
                print("determinism D=%d (3 runs, 4097 causal + mask): %s" % (D, "identical" if same else "DIFFER"))
        return 0 if ok_names else 1
    else:
        ok_names = [K.name for K in builds]

    # ---- timing ----
    rows = []
    if not args.no_bench:
        timed = [K for K in builds if K.name in ok_names or K.name in ran_names]
        print("\ntiming: %s + mma.sync + SDPA ('!' = failed the check)" % ", ".join(K.name for K in timed))
        Ls = (1024, 4096) if args.quick else (1024, 4096, 16384)
        for D in (128, 64):
            H = 2048 // D
            for L in Ls:
                B = 16384 // L
                for causal in (0, 1):
                    fl = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
                    sets = []
                    for _ in range(2):
                        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                        o = torch.empty_like(q)
                        lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                        # (o and lse kept with the set: the kernel writes them on every call)
                        sets.append((q, k, v, ac.make_params(q, k, v, o, lse, None, (0, 0, 0), causal), o, lse))
                    reps = 20 if L >= 16384 else 30
                    r = {"D": D, "L": L, "B": B, "causal": causal, "tflops": {}}
                    ref = None
                    for K in [mma] + [K for K in timed if D in K.dims]:
                        try:
                            ms = ac.time_fn([lambda s=s, K=K: K.fwd(s[3], B, H, L, D, "bf16") for s in sets], reps)
                            r["tflops"][K.name] = fl / (ms * 1e-3) / 1e12
                            # after its timed launches, the output of one more against the first
                            # timed kernel's (the mma.sync one: 2e-2 as the check), and the work-tile
                            # counters back at 0
                            s0 = sets[0]
                            s0[4].fill_(float("nan"))
                            K.fwd(s0[3], B, H, L, D, "bf16")
                            torch.cuda.synchronize()
                            if ref is None:
                                ref = s0[4].clone()
                            err = ac.relerr(s0[4], ref)
                            sched = getattr(K, "sched", None)
                            left = sched.tolist() if sched is not None else [0, 0]
                            if not err < TOL or left != [0, 0]:
                                print("AFTER TIMING %s: rel err %.2e against mma, counters %s" % (K.name, err, left))
                                r["tflops"][K.name] = float("nan")
                        except Exception as e:  # noqa: BLE001
                            print("timing %s failed: %s" % (K.name, str(e)[:200]))

                    def sdpa(s):
                        with torch.no_grad():
                            F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=bool(causal))

                    try:
                        ms = ac.sdpa_best_ms([lambda s=s: sdpa(s) for s in sets], reps)
                        r["tflops"]["sdpa"] = fl / (ms * 1e-3) / 1e12
                    except Exception as e:  # noqa: BLE001
                        print("timing sdpa failed: %s" % str(e)[:200])
                    rows.append(r)
                    print("timed D=%d L=%d causal=%d: %s" % (D, L, causal, "  ".join(
                        "%s %.0f" % kv for kv in r["tflops"].items())), flush=True)
                    del sets
                    torch.cuda.empty_cache()
        names = ["mma"] + [K.name for K in timed]
        lab = lambda n: n if n == "mma" or n in ok_names else n + "!"  # noqa: E731
        print("\n== forward TFLOP/s, bf16, B*L = 16384, H*D = 2048 (fwd flops = 4BHL^2D, /2 causal); "
              "x = ratio to SDPA ==")
        print("%4s %6s %3s %4s | %s | %7s" % ("D", "L", "B", "caus", " ".join("%16s" % lab(n) for n in names), "sdpa"))
        for r in rows:
            sd = r["tflops"].get("sdpa", float("nan"))
            cells = []
            for n in names:
                x = r["tflops"].get(n)
                cells.append("%7.1f (x%.2f)" % (x, x / sd) if x else "%16s" % "-")
            print("%4d %6d %3d %4d | %s | %7.1f" % (r["D"], r["L"], r["B"], r["causal"], " ".join(cells), sd))
        summary["bench"] = rows
    print("\ntotal %.0f s; passing wgmma variants: %s" % (time.time() - t0, ", ".join(ok_names) or "none"))
    if out_dir:
        with open(os.path.join(out_dir, "attention_wgmma_check.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        shutil.rmtree(ac._TMP, ignore_errors=True)  # cupy's scratch under $OUT
    return 0 if "wg" in ok_names or args.no_check or (args.no_wg and ok_names) else 1


# ---------------------------------------------------------------------------------------
# The wgmma backward (attention_wgmma_bwd.cu): --bwd
# ---------------------------------------------------------------------------------------
# (name, -D defines of attention_wgmma_bwd.cu, note). "bwg" = defaults; it must stay first.
# Measured on the H200 (2026-11-29, bf16 D=128, B*L = 16384, H = 16, L 4096 / 16384, causal 0/1;
# backward = preprocess + main + convert, TFLOP/s = 2.5 x 4BHL^2D (/2 causal) / time): bwg (then
# named bwgbulk) 292-347, bwgred 286-337, bwgmma 265-312, bwgmmab 269-319; the mma.sync backward
# of attention.cu 203-225; all passed the gradient check.
BWD_VARIANTS = [
    ("bwg", {}, "defaults: BC = 128 keys, 2 WG, BR = 64 query rows per step, dQ via smem + bulk reduce"),
    ("bwgred", {"ATTN_WGB_DQ_BULK": 0}, "dQ red.global.add.v2.f32 from registers"),
    ("bwgmma", {"ATTN_WGB_DQ_MMA": 1, "ATTN_WGB_DQ_BULK": 0}, "dQ = dS K with mma.sync (ldmatrix.trans), red.v2"),
    ("bwgmmab", {"ATTN_WGB_DQ_MMA": 1}, "dQ with mma.sync, bulk reduce"),
    ("bwgs2", {"ATTN_WGB_STAGES": 2}, "defaults with the 2-stage Q / dO / lse / dsum ring (before 2026-12-04: "
                                     "3 stages were 2.5-3.2 % faster)"),
    ("bwgx", {"ATTN_WGB_EXP_SPLIT": 1}, "defaults, the exponentials of unmasked steps without per-element tests"),
    ("bwgq", {"ATTN_WGB_DQ_FIRST": 1}, "defaults, dQ's GEMM before dK's (dK under the dQ stores)"),
    ("bwgxq", {"ATTN_WGB_EXP_SPLIT": 1, "ATTN_WGB_DQ_FIRST": 1}, "bwgx and bwgq together"),
    # flash_bwd_tma_d{64,128}_* of attention_tma_bwd.cu (the setting attn_bwd_tma): the same GEMMs fed by a
    # producer warpgroup (bulk tensor copies of Q and dO, mbarrier-handed stages), dQ before dK.
    ("btma", {}, "attention_tma_bwd.cu: producer warpgroup + TMA, 2 consumer WG, mbarriers, dS^T x 2"),
    ("btmaw", {"ATTN_TBW_DQ_TMA": 0}, "btma with dQ reduced row by row (16 bulk reductions per warp and step, "
                                       "the default before the dq tensor map)"),
    ("btmal", {"ATTN_TBW_EARLY": 0}, "btma, D128 reading lse and dsum after the waits for S^T and dP^T "
                                     "(the default before ATTN_TBW_EARLY)"),
    ("btmaws1", {"ATTN_TBW_WAIT_SLEEP": 1}, "btma with the producer's waits suspending (mbar_wait_sleep)"),
    ("btmaws2", {"ATTN_TBW_WAIT_SLEEP": 2}, "btma with every mbarrier wait suspending"),
    ("btma3", {"ATTN_TBW_STAGES": 3}, "btma with 3 stages and one dS^T tile (two more barriers per step)"),
    ("btma64", {"ATTN_TBW_D64_BR": 64}, "btma, D64 with 64 query rows per step (the earlier default; D128 as btma)"),
    ("btmac", {"ATTN_TBW_CARRY_DK": 1, "ATTN_TBW_D64_BR": 64}, "btma64, D64 carrying dK's GEMM into the next step "
                                                              "(D128 as btma)"),
    ("btmau", {"ATTN_TBW_UNDEF": 1}, "btma, S^T / dP^T / dQ declared dead after their last use (reg_undef)"),
    ("btmacu", {"ATTN_TBW_CARRY_DK": 2, "ATTN_TBW_UNDEF": 1, "ATTN_TBW_D64_BR": 64}, "btmau, dK's GEMM carried into the next step "
                                                               "(D128 too: fits with reg_undef)"),
    ("btmacu3", {"ATTN_TBW_CARRY_DK": 2, "ATTN_TBW_UNDEF": 1, "ATTN_TBW_STAGES": 3, "ATTN_TBW_D64_BR": 64}, "btmacu with 3 stages "
                                                                                     "(the carried dK holds a stage a step longer)"),
]


def tbw_rows(defs, D):
    """Query rows per step of flash_bwd_tma_d{D}_* built with `defs` (its q / dO box rows)."""
    return int(defs.get("ATTN_TBW_D64_BR", 128)) if D == 64 else 64


def bwg_cfg(defs, name="bwg", D=128):
    """(threads, dynamic smem bytes, keys per block) of flash_bwd_wgmma_d128_* built with `defs`
    (the formula at the top of attention_wgmma_bwd.cu), or of flash_bwd_tma_d{D}_* for a btma*
    variant (attention_tma_bwd.cu's)."""
    bc, br, d = 128, 64, 128
    if name.startswith("btma"):
        d = D
        br = tbw_rows(defs, D)
        st = int(defs.get("ATTN_TBW_STAGES", 2))
        bufs = 2 if st == 2 else 1
        tiles = 2 if d == 64 else 1  # dQ staging tiles (64 rows each), without ATTN_TBW_DQ_TMA
        dqs = 32768 if int(defs.get("ATTN_TBW_DQ_TMA", 1)) else tiles * 64 * (d + 8) * 4
        return 384, 1024 + 2 * bc * d * 2 + bufs * bc * br * 2 + st * 2 * br * d * 2 + st * 2 * br * 4 + \
            dqs + 8 * (1 + 2 * st), bc
    dq = br * (d + 8) * 4 if int(defs.get("ATTN_WGB_DQ_BULK", 1)) else 0
    st = int(defs.get("ATTN_WGB_STAGES", 3))
    return 2 * bc, 1024 + 2 * bc * d * 2 + bc * br * 2 + st * 2 * br * d * 2 + st * 2 * br * 4 + dq, bc


assert bwg_cfg({}) == (256, 217600, 128) and bwg_cfg({"ATTN_WGB_DQ_BULK": 0})[1] == 182784
assert bwg_cfg({"ATTN_WGB_STAGES": 2}) == (256, 184320, 128)
assert bwg_cfg({}, "btma") == (384, 198696, 128)
assert bwg_cfg({"ATTN_TBW_STAGES": 3}, "btma3") == (384, 215608, 128)
assert bwg_cfg({}, "btma", 64) == (384, 199720, 128)
assert bwg_cfg({"ATTN_TBW_D64_BR": 64}, "btma64", 64) == (384, 133160, 128)
assert bwg_cfg({"ATTN_TBW_STAGES": 3}, "btma3", 64) == (384, 200760, 128)
assert bwg_cfg({"ATTN_TBW_DQ_TMA": 0}, "btmaw") == (384, 200744, 128)
assert bwg_cfg({"ATTN_TBW_DQ_TMA": 0}, "btmaw", 64) == (384, 203816, 128)


def bwd_main(args):
    """Checks flash_bwd_wgmma_d128_* (with attention.cu's preprocess / convert kernels) against
    float64 autograd and times it next to the mma.sync backward and SDPA."""
    sys.path.insert(0, HERE)
    import attention_check as ac  # noqa: E402  (sets TMPDIR under $OUT, imports torch, cupy)
    import torch
    import torch.nn.functional as F
    import cupy

    out_dir = os.environ.get("OUT")
    t0 = time.time()
    if not args.child:
        dev = torch.cuda.get_device_properties(0)
        print("device: %s, torch %s, cupy %s" % (dev.name, torch.__version__, cupy.__version__))
    manifest = {}
    mpath = os.path.join(args.cubins, "manifest.json")
    if os.path.exists(mpath):
        manifest = json.load(open(mpath))

    cache = {}

    def launch(cubin, name, grid, block, smem, params):
        key = (cubin, name)
        k = cache.get(key)
        if k is None:
            mod = cache.get(cubin)
            if mod is None:
                mod = cache[cubin] = cupy.RawModule(path=os.path.join(args.cubins, cubin + ".cubin"))
            k = mod.get_function(name)
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            cache[key] = k
        k(grid, block, (params,), shared_mem=smem)

    def fwd_mma(p, B, H, Lq, D, dt):
        threads, smem = ac.fwd_launch_cfg(D, 1 if D == 64 else 0)
        launch("attention", "flash_fwd_d%d_%s" % (D, dt), ((Lq + 127) // 128, H, B), (threads, 1, 1), smem, p)

    def fwd_wg(p, B, H, Lq, D, dt):
        threads, smem, br = wg_cfg({}, D)
        launch("wg", "flash_fwd_wgmma_d%d_%s" % (D, dt), ((Lq + br - 1) // br, H, B), (threads, 1, 1), smem, p)

    def pre(p, B, H, Lq, D, dt):
        rows = B * H * Lq
        rpb = ac.pre_rows_per_block(D)
        launch("attention", "flash_bwd_preprocess_d%d_%s" % (D, dt), ((rows + rpb - 1) // rpb, 1, 1),
               (256, 1, 1), 0, p)

    def conv(p, B, H, Lq, D, dt):
        n4 = B * H * Lq * D // 4
        launch("attention", "flash_bwd_convert_dq_d%d_%s" % (D, dt), (max(1, min((n4 + 255) // 256, 65535)), 1, 1),
               (256, 1, 1), 0, p)

    def main_old(p, B, H, Hkv, Lq, Lk, D, dt):
        threads, bc, smem = ac.bwd_launch_cfg(D)
        launch("attention", "flash_bwd_dq_dk_dv_d%d_%s" % (D, dt), ((Lk + bc - 1) // bc, Hkv, B),
               (threads, 1, 1), smem, p)

    maps = []

    def make_main_new(name, defs):
        threads, smem, bc = bwg_cfg(defs, name)
        if name.startswith("btma"):
            def main_tma(p, B, H, Hkv, Lq, Lk, D, dt):
                threads, smem, bc = bwg_cfg(defs, name, D)
                if not maps:
                    maps.append(TensorMaps())
                tp = tma_bwd_params(ac.PARAMS_DTYPE, maps[0], p, B, H, Hkv, Lq, Lk, D, dt == "bf16",
                                    tbw_rows(defs, D))
                launch(name, "flash_bwd_tma_d%d_%s" % (D, dt), ((Lk + bc - 1) // bc, Hkv, B),
                       (threads, 1, 1), smem, tp)
            return main_tma

        def main_new(p, B, H, Hkv, Lq, Lk, D, dt):
            launch(name, "flash_bwd_wgmma_d%d_%s" % (D, dt), ((Lk + bc - 1) // bc, Hkv, B),
                   (threads, 1, 1), smem, p)
        return main_new

    def bwd_with(main):
        def run(p, B, H, Hkv, Lq, Lk, D, dt):
            pre(p, B, H, Lq, D, dt)
            main(p, B, H, Hkv, Lq, Lk, D, dt)
            conv(p, B, H, Lq, D, dt)
        return run

    variants = [(n, d, note) for (n, d, note) in BWD_VARIANTS
                if not args.variants or (n == "bwg" and not args.no_wg) or n in args.variants.split(",")]
    for (n, d, note) in variants:
        rep = manifest.get(n, {})
        if not args.child:
            print("%-8s [%s] %s" % (n, note, "; ".join(rep.get("report", []))))
            for w in rep.get("warnings", []):
                print("    " + w)

    def check_one(bwd, dtype, D, causal, mask_mode, Lq, Lk, gqa, gen):
        big = Lq >= 1000 and Lk >= 1000
        B, H = (1, 2) if big else (2, 4)
        Hkv = H // 2 if gqa else H
        dev, dt, nan = "cuda", ac.tname(dtype), float("nan")
        scale = 1.0 / math.sqrt(D)
        q, k, v, dout, mask, mstr = ac.make_inputs(dtype, D, mask_mode, Lq, Lk, B, H, Hkv, gen)
        o = torch.full((B, H, Lq, D), nan, device=dev, dtype=dtype)
        lse = torch.full((B, H, Lq), nan, device=dev, dtype=torch.float32)
        dsum = torch.full((B, H, Lq), nan, device=dev, dtype=torch.float32)
        dqa = torch.full((B, H, Lq, D), nan, device=dev, dtype=torch.float32)
        dq = torch.full((B, H, Lq, D), nan, device=dev, dtype=dtype)
        dk = torch.full((B, Hkv, Lk, D), nan, device=dev, dtype=dtype)
        dv = torch.full((B, Hkv, Lk, D), nan, device=dev, dtype=dtype)
        p = ac.make_params(q, k, v, o, lse, mask, mstr, causal, scale, dout, dsum, dqa, dq, dk, dv)
        fwd_mma(p, B, H, Lq, D, dt)
        bwd(p, B, H, Hkv, Lq, Lk, D, dt)
        torch.cuda.synchronize()
        ro, rl, rdq, rdk, rdv = ac.reference(q, k, v, mask, causal, scale, dout)
        return {"o": ac.relerr(o, ro), "dq": ac.relerr(dq, rdq), "dk": ac.relerr(dk, rdk), "dv": ac.relerr(dv, rdv)}

    def cases(full, dims=(128,)):
        lengths = [(1, 1), (17, 17), (1000, 1000), (4097, 4097), (1, 1000), (17, 1000), (1000, 17),
                   (300, 4097), (4097, 129), (200, 200)]
        if not full:
            lengths = [(17, 17), (1000, 1000), (1000, 17), (17, 1000), (1025, 1025)]
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (0, 1):
                for mask_mode in (0, 1, 2):
                    for i, (Lq, Lk) in enumerate(lengths):
                        for gqa in (True, False):
                            if (mask_mode + i + int(gqa)) % 2 and (Lq, Lk) != (4097, 4097):
                                continue  # half the combinations (all of the largest)
                            for D in dims:
                                yield dtype, D, causal, mask_mode, Lq, Lk, gqa

    summary = {"variants": {}, "manifest": {n: manifest.get(n) for (n, _, _) in variants}}
    fmt = lambda x: "%8.1e" % x if x == x else "     NaN"  # noqa: E731
    names = ("o", "dq", "dk", "dv")
    if args.child:
        (name, defs, _), = [v for v in variants if v[0] == args.child]
        bwd = bwd_with(make_main_new(name, defs))
        full = name in ("bwg", "bwgred", "btma") and not args.quick
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        res, worst, lost, t1 = [], dict.fromkeys(names, 0.0), False, time.time()
        print("\n== correctness of %s (%s set) vs float64 autograd, PASS < %.0e; failures listed ==" % (
            name, "full" if full else "reduced", TOL), flush=True)
        dims = (128, 64) if name.startswith("btma") else (128,)  # the TMA kernel also has D = 64
        for (dtype, D, causal, mm, Lq, Lk, gqa) in cases(full, dims):
            try:
                errs, note = check_one(bwd, dtype, D, causal, mm, Lq, Lk, gqa, gen), ""
            except Exception as e:  # noqa: BLE001
                errs, note = dict.fromkeys(names, float("nan")), str(e)[:160]
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    lost = True
            ok = all(x == x and x < TOL for x in errs.values())
            for n in names:
                worst[n] = max(worst[n], errs[n]) if errs[n] == errs[n] else float("nan")
            res.append(dict(dt=ac.tname(dtype), causal=causal, mask=mm, Lq=Lq, Lk=Lk, gqa=gqa, ok=ok,
                            errs=errs, note=note))
            if not ok:
                print("FAIL %-4s causal=%d mask=%d Lq=%5d Lk=%5d gqa=%d | %s %s" % (
                    ac.tname(dtype), causal, mm, Lq, Lk, gqa,
                    " ".join("%s %s" % (n, fmt(errs[n])) for n in names), note), flush=True)
            if lost:
                print("CUDA context lost; stopping")
                break
        n_ok = sum(r["ok"] for r in res)
        print("%s: %d / %d PASS, max rel err %s (%.0f s)" % (
            name, n_ok, len(res), " ".join("%s %s" % (n, fmt(worst[n])) for n in names), time.time() - t1),
            flush=True)
        with open(args.result, "w") as f:
            json.dump({"pass": n_ok, "cases": len(res), "worst": worst, "lost": lost,
                       "fails": [r for r in res if not r["ok"]][:40]}, f, default=str)
        return 0 if n_ok == len(res) else 1

    ok_names, ran_names = [], []
    if not args.no_check:
        res_dir = os.path.join("/tmp", "attention_wgmma_bwd_check_%d" % os.getpid())
        os.makedirs(res_dir, exist_ok=True)
        for (name, _, _) in variants:
            res_path = os.path.join(res_dir, "result_%s.json" % name)
            cmd = [sys.executable, os.path.abspath(__file__), "--bwd", "--child", name, "--cubins", args.cubins,
                   "--result", res_path] + (["--quick"] if args.quick else [])
            limit = args.child_timeout if name in ("bwg", "bwgred", "btma") else max(30, args.child_timeout // 2)
            try:
                rc = subprocess.run(cmd, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout after %d s" % args.child_timeout
            if rc != 0:
                print("check of %s: child exit %s" % (name, rc), flush=True)
            if os.path.exists(res_path):
                r = json.load(open(res_path))
                summary["variants"][name] = r
                if r["pass"] == r["cases"] and r["cases"] > 0:
                    ok_names.append(name)
                elif not r.get("lost"):
                    ran_names.append(name)
    else:
        ok_names = [n for (n, _, _) in variants]

    rows = []
    if not args.no_bench:
        timed = [(n, d) for (n, d, _) in variants if n in ok_names or n in ran_names]
        lab = lambda n: n if n in ok_names or n in ("mma", "sdpa") else n + "!"  # noqa: E731
        dt = "bf16"
        Ls = (4096,) if args.quick else (4096, 16384)
        # D = 64: the mma.sync backward and the TMA variants (no wgmma backward has D = 64)
        Ds = (128, 64) if any(n.startswith("btma") for (n, _) in timed) else (128,)
        for D in Ds:
            H = 2048 // D
            print("\n== timing bf16 D=%d, B*L = 16384, H = %d (median ms, CUDA events; '!' = failed the check) ==" % (D, H))
            for L in Ls:
                B = 16384 // L
                for causal in (0, 1):
                    fl = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
                    sets = []
                    for _ in range(2):
                        q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                        o = torch.empty_like(q)
                        lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                        dsum = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                        dqa = torch.empty(B, H, L, D, device="cuda", dtype=torch.float32)
                        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
                        p = ac.make_params(q, k, v, o, lse, None, (0, 0, 0), causal, None, do, dsum, dqa, dq, dk, dv)
                        fwd_wg(p, B, H, L, D, dt)  # o, lse for the backward
                        # (every tensor the kernels write kept with the set)
                        sets.append((q, k, v, do, p, o, lse, dsum, dqa, dq, dk, dv))
                    reps = 15 if L >= 16384 else 25
                    ms = {}
                    mains = [("mma", main_old)] + [(n, make_main_new(n, d)) for (n, d) in timed
                                                    if D == 128 or n.startswith("btma")]
                    try:
                        ms[("wgfwd", "fwd")] = ac.time_fn([lambda s=s: fwd_wg(s[4], B, H, L, D, dt) for s in sets], reps)
                        for n, mf in mains:
                            ms[(n, "main")] = ac.time_fn([lambda s=s, mf=mf: mf(s[4], B, H, H, L, L, D, dt)
                                                          for s in sets], reps)
                            bw = bwd_with(mf)
                            ms[(n, "bwd")] = ac.time_fn([lambda s=s, bw=bw: bw(s[4], B, H, H, L, L, D, dt)
                                                         for s in sets], reps)
                        # after the timed launches, one more backward of each against the first's (the
                        # mma.sync one) on the first set: dk and dv within the check's tolerance
                        ref = None
                        for n, mf in mains:
                            s0 = sets[0]
                            s0[10].fill_(float("nan"))
                            s0[11].fill_(float("nan"))
                            bwd_with(mf)(s0[4], B, H, H, L, L, D, dt)
                            torch.cuda.synchronize()
                            if ref is None:
                                ref = (s0[10].clone(), s0[11].clone())
                                continue
                            err = max(ac.relerr(s0[10], ref[0]), ac.relerr(s0[11], ref[1]))
                            if not err < TOL:
                                print("AFTER TIMING %s: dk / dv rel err %.2e against mma" % (n, err))
                                ms[(n, "main")] = ms[(n, "bwd")] = float("nan")
                    except Exception as e:  # noqa: BLE001
                        print("timing failed: %s" % str(e)[:300])
                    tsets = [(s[0].clone().requires_grad_(), s[1].clone().requires_grad_(),
                              s[2].clone().requires_grad_(), s[3]) for s in sets]

                    def t_fb(s):
                        out = F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=bool(causal))
                        torch.autograd.grad(out, (s[0], s[1], s[2]), s[3])

                    def t_f(s):
                        with torch.no_grad():
                            F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=bool(causal))

                    try:
                        ms[("sdpa", "fwd")] = ac.sdpa_best_ms([lambda s=s: t_f(s) for s in tsets], reps)
                        ms[("sdpa", "fb")] = ac.sdpa_best_ms([lambda s=s: t_fb(s) for s in tsets], reps)
                        ms[("sdpa", "bwd")] = ms[("sdpa", "fb")] - ms[("sdpa", "fwd")]
                    except Exception as e:  # noqa: BLE001
                        print("timing sdpa failed: %s" % str(e)[:200])
                    r = {"D": D, "L": L, "B": B, "causal": causal, "fwd_flops": fl,
                         "ms": {"%s/%s" % kv: x for kv, x in ms.items()}}
                    rows.append(r)
                    sd_fb = ms.get(("sdpa", "fb"), float("nan"))
                    sd_b = ms.get(("sdpa", "bwd"), float("nan"))
                    fw = ms.get(("wgfwd", "fwd"), float("nan"))
                    print("\nL=%5d B=%d causal=%d: wgmma fwd %.3f ms; SDPA fwd %.3f, bwd (fb - fwd) %.3f, f+b %.3f ms" % (
                        L, B, causal, fw, ms.get(("sdpa", "fwd"), float("nan")), sd_b, sd_fb))
                    print("  %-8s %9s %9s %8s %9s %9s %8s" % ("bwd", "main ms", "bwd ms", "TFLOP/s", "x sdpa bwd",
                                                               "f+b ms", "x sdpa"))
                    for n, _ in mains:
                        mm_, bb = ms.get((n, "main"), float("nan")), ms.get((n, "bwd"), float("nan"))
                        print("  %-8s %9.3f %9.3f %8.1f %9.2f %10.3f %8.2f" % (
                            lab(n), mm_, bb, 2.5 * fl / (bb * 1e-3) / 1e12, sd_b / bb, fw + bb, sd_fb / (fw + bb)),
                            flush=True)
                    del sets, tsets
                    torch.cuda.empty_cache()
        summary["bench"] = rows
    print("\ntotal %.0f s; passing wgmma backward variants: %s" % (time.time() - t0, ", ".join(ok_names) or "none"))
    if out_dir:
        with open(os.path.join(out_dir, "attention_wgmma_bwd_check.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        shutil.rmtree(ac._TMP, ignore_errors=True)
    return 0 if "bwg" in ok_names or args.no_check else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", nargs="?", const=DEFAULT_CUBINS, default=None, metavar="DIR",
                    help="compile the CUBINs here (needs Rust and NVRTC; no GPU)")
    ap.add_argument("--cubins", default=DEFAULT_CUBINS, help="folder of the CUBINs (GPU host)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--variants", default="", help="comma-separated variant names ('wg' always, unless --no-wg)")
    ap.add_argument("--no-wg", action="store_true", help="with --variants: leave out 'wg' unless named")
    ap.add_argument("--child-timeout", type=int, default=100, help="seconds for one variant's check")
    ap.add_argument("--bwd", action="store_true",
                    help="check and time the wgmma backward (attention_wgmma_bwd.cu) instead")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)   # internal: check one variant
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)  # internal: its JSON result
    args = ap.parse_args()
    if args.build:
        build(args.build)
        return 0
    if args.bwd:
        return bwd_main(args)
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
