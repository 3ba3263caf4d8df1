#!/usr/bin/env bash
# One run on a lent GPU machine (no network): environment, missing packages from the carried
# wheel folder, the GPU tests, the GPU benchmark, a subset of the existing tests. From the
# repository root:
#
#     OUT=/an/empty/dir bash examples/gpu_check.sh        # the device tool sets $OUT itself
#
# Everything it reports goes to $OUT (env.txt, install.txt, pytest_gpu.txt/.xml,
# gpu_test_report.json, gpu_benchmark.json/.txt, pytest_subset.txt, gpu_check.log,
# summary.txt). No `set -e`: every step has its own timeout and runs whatever happened before;
# the step limits shrink so that the whole script stays within GPU_CHECK_BUDGET seconds
# (default 400). Nothing outside $OUT, ${TMPDIR:-/tmp} and the missing packages' target
# folder is written; installed packages (torch, lightning, jax, numpy, ...) are never touched:
# only missing modules are installed, with --no-deps, into a separate folder on PYTHONPATH.
#
# Wheels: .device-wheels/ (gitignored; pass it in the device tool's `carry`), ~29 MiB, made with
#     P="--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64"
#     for v in 3.10.12 3.11 3.12; do pip download --no-deps --only-binary=:all: --python-version $v $P \
#         -d .device-wheels optree==0.20.0 ml_dtypes==0.6.0 h5py==3.14.0 pyyaml==6.0.4 hypothesis; done
# and, per Python version as well (pure wheels land once; the newest release for that Python
# where the pin needs a newer one: keras 3.12.4 on 3.10), safetensors==0.8.0 rich==15.0.0
# markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 pytest==9.2.0 iniconfig==2.3.1 pluggy==1.7.0
# packaging==26.4 sortedcontainers==2.4.0 torchdata==0.11.0 keras==3.15.1 absl-py==2.5.1
# namex==0.1.0 fsspec==2026.9.0 typing_extensions==4.16.0 exceptiongroup tomli (py3-none-any).
# No numpy wheels (~16 MB each): numpy comes with torch/JAX in the image.

set -u
T0=$SECONDS
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$PWD
OUT=${OUT:-$REPO/gpu-check-out}
mkdir -p "$OUT"
BUDGET=${GPU_CHECK_BUDGET:-400}
ONLY=${GPU_CHECK_STEPS:-env install imports gpu-tests benchmark cpu-subset}  # which steps run
want() { [[ " $ONLY " == *" $1 "* ]]; }
WHEELS=$REPO/.device-wheels
SITE=${TMPDIR:-/tmp}/autockpt-device-site
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
mkdir -p "$SITE"
if [ -z "${PYTHON:-}" ]; then  # the first interpreter that has torch
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null && timeout 120 "$candidate" -c "import torch" 2>/dev/null; then
            PYTHON=$(command -v "$candidate")
            break
        fi
    done
fi
PY=${PYTHON:-$(command -v python3 || command -v python)}
echo "python: $PY   OUT: $OUT   budget: ${BUDGET}s"

export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"  # the four autockpt packages, then missing deps
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_INDEX=1
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

STEPS=()
declare -A RC TOOK LIMITS

# limit DEFAULT RESERVE: DEFAULT seconds, or less so that RESERVE seconds stay for later steps
limit() {
    local left=$((BUDGET - (SECONDS - T0) - $2))
    ((left < 15)) && left=15
    ((left < $1)) && echo "$left" || echo "$1"
}

# step NAME LIMIT LOGFILE CMD...: run CMD under `timeout`, output to the console and LOGFILE
step() {
    local name=$1 lim=$2 log=$3
    shift 3
    local t=$SECONDS
    echo
    echo "===== $name (limit ${lim}s, at $((SECONDS - T0))s) ====="
    timeout -k 10 "$lim" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    STEPS+=("$name")
    RC[$name]=$rc
    TOOK[$name]=$((SECONDS - t))
    LIMITS[$name]=$lim
    echo "===== $name: rc=$rc in $((SECONDS - t))s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
}

# -- 1. environment ------------------------------------------------------------------------------
env_report() {
    echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   repo: $REPO   git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)"
    echo "# python: $PY"
    "$PY" -V
    uname -a
    ldd --version 2>/dev/null | head -1
    echo "# cpus: $(nproc)"
    free -g 2>/dev/null
    df -h "$REPO" "${TMPDIR:-/tmp}" 2>/dev/null
    echo "# nvidia-smi"
    timeout 20 nvidia-smi || echo "nvidia-smi failed: rc=$?"
    timeout 10 nvidia-smi --query-gpu=name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,driver_version --format=csv 2>/dev/null
    echo "# pip list"
    timeout 30 "$PY" -m pip list 2>&1 || echo "pip list failed"
    echo "# torch"
    timeout 60 "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.1f} GiB", f"sm_{p.major}{p.minor}", "count", torch.cuda.device_count())
    print("free/total", [f"{x / 2**30:.1f} GiB" for x in torch.cuda.mem_get_info()])
    print("pinned alloc ok:", torch.empty(1 << 20, pin_memory=True).is_pinned())
EOF
}
export -f env_report
export PY REPO
want env && step env "$(limit 45 330)" "$OUT/env.txt" bash -c env_report

# -- 2. missing packages, from .device-wheels only ----------------------------------------------
want install && step install "$(limit 60 300)" "$OUT/install.txt" "$PY" - "$WHEELS" "$SITE" <<'EOF'
"""Install the modules that are missing, one distribution at a time, with --no-deps, into a
separate target folder (PYTHONPATH has it); fall back to unpacking the matching wheel there
when pip is missing or fails. Present packages are never reinstalled or upgraded."""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import zipfile

wheels, site = sys.argv[1], sys.argv[2]
os.makedirs(site, exist_ok=True)
old = sys.version_info < (3, 11)
# (module to import, distribution in the wheel folder) in dependency order
WANTED = [
    ("numpy", "numpy"), ("yaml", "pyyaml"), ("fsspec", "fsspec"), ("typing_extensions", "typing_extensions"),
    ("packaging", "packaging"), ("mdurl", "mdurl"), ("markdown_it", "markdown_it_py"), ("pygments", "pygments"),
    ("rich", "rich"), ("safetensors", "safetensors"),
    *([("exceptiongroup", "exceptiongroup"), ("tomli", "tomli")] if old else []),
    ("iniconfig", "iniconfig"), ("pluggy", "pluggy"), ("pytest", "pytest"),
    ("sortedcontainers", "sortedcontainers"), ("hypothesis", "hypothesis"), ("torchdata", "torchdata"),
    ("absl", "absl_py"), ("namex", "namex"), ("optree", "optree"), ("ml_dtypes", "ml_dtypes"), ("h5py", "h5py"),
    ("keras", "keras"),
]
tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_for(dist):
    found = []
    for path in glob.glob(os.path.join(wheels, "*.whl")):
        parts = os.path.basename(path)[:-4].split("-")
        if norm(parts[0]) != norm(dist):
            continue
        py, abi = parts[-3], parts[-2]
        if py == tag or abi == "abi3" or abi == "none" and py.startswith("py"):
            found.append(path)
    return sorted(found)[-1] if found else None


missing = [(m, d) for m, d in WANTED if importlib.util.find_spec(m) is None]
print("python", sys.version.split()[0], "tag", tag, "| missing:", ", ".join(d for _, d in missing) or "none")
have_pip = importlib.util.find_spec("pip") is not None
failed = []
for module, dist in missing:
    wheel = wheel_for(dist)
    if wheel is None:
        print(f"  {dist}: no wheel for {tag} in {wheels}")
        failed.append(dist)
        continue
    ok = False
    if have_pip:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--target", site, wheel]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        ok = proc.returncode == 0
        if not ok:
            print(f"  {dist}: pip failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    if not ok:  # a wheel is a zip of the installed layout
        try:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
            ok = True
        except Exception as exc:
            print(f"  {dist}: unpacking failed: {exc}")
    print(f"  {dist}: {'installed from ' + os.path.basename(wheel) if ok else 'NOT installed'}")
    if not ok:
        failed.append(dist)
if site not in sys.path:
    sys.path.insert(0, site)
importlib.invalidate_caches()
still = [m for m, _ in WANTED if importlib.util.find_spec(m) is None]
print("still missing:", ", ".join(still) or "none")
sys.exit(1 if failed else 0)
EOF

want imports && step imports "$(limit 45 280)" "$OUT/imports.txt" env KERAS_BACKEND=torch "$PY" - <<'EOF'
import importlib, sys
for name in ["numpy", "yaml", "fsspec", "rich", "safetensors", "pytest", "hypothesis", "torch", "lightning",
             "torchdata", "autockpt_core", "autockpt_torch", "autockpt_lightning", "keras", "autockpt_keras"]:
    try:
        mod = importlib.import_module(name)
        print(f"ok   {name:20s} {getattr(mod, '__version__', '')}  {getattr(mod, '__file__', '')}")
    except Exception as exc:
        print(f"FAIL {name:20s} {type(exc).__name__}: {exc}")
EOF

# -- 3. GPU tests ---------------------------------------------------------------------------------
read -r -a GPU_TEST_ARGS <<< "${GPU_CHECK_GPU_TEST_ARGS:-}"  # e.g. "-k keras"
want gpu-tests && step gpu-tests "$(limit 140 230)" "$OUT/pytest_gpu.txt" env AUTOCKPT_GPU_REPORT="$OUT/gpu_test_report.json" \
    "$PY" -m pytest -q -p no:cacheprovider -rA --durations=20 --junitxml="$OUT/pytest_gpu.xml" tests/gpu "${GPU_TEST_ARGS[@]}"

# -- 4. GPU benchmark -----------------------------------------------------------------------------
BENCH_LIMIT=$(limit "${GPU_BENCH_LIMIT:-185}" 45)
read -r -a BENCH_ARGS <<< "${GPU_BENCH_ARGS:-}"  # e.g. "--sizes= --default-fit-frameworks lightning,keras"
if [ "$(timeout 60 "$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)" != 1 ]; then
    echo "no CUDA: benchmark plumbing check on the CPU with a tiny state"
    BENCH_ARGS=(--device cpu --sizes 4MB --modes sync,overlap,device --default-fit-size 4MB
                --default-fit-seconds 2 --default-fit-rounds 1 --clean-steps 30)
fi
want benchmark && step benchmark "$BENCH_LIMIT" "$OUT/gpu_benchmark.txt" "$PY" examples/gpu_benchmark.py \
    --json "$OUT/gpu_benchmark.json" --budget-s $((BENCH_LIMIT - 20)) "${BENCH_ARGS[@]}"

# -- 5. existing tests of the snapshot modes, with CUDA present ------------------------------------
# tests/torch: staging (fake-CUDA stream order), modes, host buffers (pinned by default here);
# core: the pending-copy contract and the mode trial; Lightning: overlap/sync/auto fits (CPU
# model, but pinned buffers and the persist thread that CUDA's presence selects) and buffer
# prefaulting. Deselected: a test that expects persist_mode "auto" to pick the persist process,
# which by design it does not where CUDA is available.
# GPU_CHECK_SUBSET replaces the test paths (e.g. "tests/torch/test_sharded_writer.py").
read -r -a SUBSET <<< "${GPU_CHECK_SUBSET:-tests/torch tests/core/test_session_pending.py tests/core/policy/test_mode_trial.py tests/lightning/test_snapshot_overlap.py tests/lightning/test_lightning_persist.py}"
want cpu-subset && step cpu-subset "$(limit 90 0)" "$OUT/pytest_subset.txt" "$PY" -m pytest -q -p no:cacheprovider -rf \
    "${SUBSET[@]}" \
    --deselect tests/lightning/test_lightning_persist.py::test_checkpoints_are_written_by_the_persist_process_from_prefaulted_buffers

# -- summary --------------------------------------------------------------------------------------
{
    echo
    echo "===== summary (total $((SECONDS - T0))s of budget ${BUDGET}s) ====="
    for name in "${STEPS[@]}"; do
        printf '%-12s rc=%-4s %4ss (limit %ss)\n' "$name" "${RC[$name]}" "${TOOK[$name]}" "${LIMITS[$name]}"
    done
    grep -h -E "^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped)" "$OUT/pytest_gpu.txt" "$OUT/pytest_subset.txt" 2>/dev/null | tail -40
    echo "files in $OUT:"
    ls -la "$OUT"
} | tee "$OUT/summary.txt"
sleep 1  # let the log's tee catch up
