#!/usr/bin/env python3
"""Where the forwards' softmax sits against the wait for the previous P V, in the SASS.

Each step of the Hopper forwards' loop (attention_tma.cu, and attention_wgmma.cu's PIPE
kernels) issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}, waits for S_j
(`wgmma.wait_group 1`), runs S_j's softmax, then waits for the P V GEMM
(`wgmma.wait_group 0`): the softmax is meant to run under the warpgroup's own P V GEMM. ptxas
may schedule that second wait (`WARPGROUP.DEPBAR.LE gsb0, 0x0`) above the softmax's
instructions (docs/performance-notes.md, "The consumers' order in the SASS"). This script
builds a program with the given -D flags through the `ptxas` example (NVRTC, no GPU needed),
disassembles it with cuobjdump and prints, for each forward kernel, the step of its loop with
the most `MUFU.EX2` between the wait for S and the next wgmma issue: how many of them come
before the wait for P V (overlapped with it) and how many after.

Usage (from the repository root):
  python3 kernels/checks/sass_order.py [--program attention_tma] [-D NAME=VALUE ...]
                                       [--cubin FILE] [--expect before|after]
--expect before fails (exit 1) unless every forward kernel's step has all its exponentials
before the wait; --expect after, unless none. cuobjdump: $RTX_CUOBJDUMP, else `cuobjdump` on
PATH, else installed from PyPI (nvidia-cuda-cuobjdump, with nvidia-cuda-nvdisasm, which it runs)
into .nvrtc-tools/ (git ignores it).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def cuobjdump():
    exe = os.environ.get("RTX_CUOBJDUMP") or shutil.which("cuobjdump")
    if exe:
        return exe
    tools = os.path.join(ROOT, ".nvrtc-tools")
    found = glob.glob(os.path.join(tools, "nvidia", "*", "bin", "cuobjdump"))
    if not found:
        print("sass_order: installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into %s" % tools,
              file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--target", tools, "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"], check=True,
                       env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore"))
        found = glob.glob(os.path.join(tools, "nvidia", "*", "bin", "cuobjdump"))
    if not found:
        raise SystemExit("sass_order: no cuobjdump after the install")
    for tool in glob.glob(os.path.join(os.path.dirname(found[0]), "*")):
        os.chmod(tool, 0o755)
    return found[0]


def build(program, defines, outdir):
    """The CUBIN of kernels/cuda/<program>.cu built with `defines` (the ptxas example)."""
    dump = subprocess.run(["bash", "-c", 'eval "$(bash .ci/nvrtc-setup --env)" && env -0'], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    env = dict(kv.split("=", 1) for kv in dump.split("\0") if "=" in kv)
    # (the example embeds the kernel sources: rebuild it so that it has the current ones)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "rtx-kernels", "--example", "ptxas"], cwd=ROOT,
                   env=env, check=True)
    exe = os.path.join(ROOT, "target", "release", "examples", "ptxas")
    out = subprocess.run([exe, program, "--out=" + outdir] + ["--flag=-D" + d for d in defines], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    path = os.path.join(outdir, program + ".cubin")
    if out.returncode != 0 or not os.path.exists(path):
        raise SystemExit("sass_order: building %s failed:\n%s" % (program, (out.stdout + out.stderr)[-3000:]))
    return path


def functions(sass):
    """{kernel name: [instruction text, ...]} from `cuobjdump -sass`."""
    funs, cur = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funs.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append(m.group(1))
    return funs


def steps(instrs):
    """For each wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1): the MUFU.EX2 between it and the
    wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0), and those between that wait and the next
    wgmma issue (WARPGROUP.ARRIVE / HGMMA) or wait for S."""
    out = []
    for i, ins in enumerate(instrs):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in ins:
            continue
        before, after, waited = 0, 0, False
        for nxt in instrs[i + 1:]:
            if "WARPGROUP.ARRIVE" in nxt or "HGMMA" in nxt or "WARPGROUP.DEPBAR.LE gsb0, 0x1" in nxt:
                break
            if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in nxt:
                waited = True
            elif "MUFU.EX2" in nxt:
                if waited:
                    after += 1
                else:
                    before += 1
        if waited:
            out.append((before, after))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", default="attention_tma")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--cubin", help="disassemble this CUBIN instead of building one")
    ap.add_argument("--expect", choices=("before", "after"))
    args = ap.parse_args()
    tmp = None
    if args.cubin:
        path = args.cubin
    else:
        tmp = tempfile.mkdtemp(prefix="sass_order_")
        path = build(args.program, args.defines, tmp)
    exe = cuobjdump()
    env = dict(os.environ)  # cuobjdump -sass runs nvdisasm: look beside it first
    env["PATH"] = os.path.dirname(exe) + os.pathsep + env.get("PATH", "")
    dis = subprocess.run([exe, "-sass", path], capture_output=True, text=True, env=env)
    if dis.returncode != 0:
        raise SystemExit("sass_order: cuobjdump failed:\n%s" % dis.stderr[-2000:])
    sass = dis.stdout
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = []
    print("%s %s: MUFU.EX2 of each forward kernel's loop step, before / after the wait for P V" % (
        args.cubin or args.program, " ".join("-D" + d for d in args.defines)))
    for name, instrs in sorted(functions(sass).items()):
        if not name.startswith("flash_fwd"):
            continue
        st = steps(instrs)
        if not st:
            print("  %-32s no step with both waits (no S / P V overlap in this kernel)" % name)
            continue
        before, after = max(st, key=lambda x: x[0] + x[1])
        print("  %-32s %3d / %3d" % (name, before, after))
        if (args.expect == "before" and after > 0) or (args.expect == "after" and before > 0):
            bad.append(name)
    if bad:
        print("not as expected (%s the wait): %s" % (args.expect, ", ".join(bad)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
