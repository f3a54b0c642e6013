#!/usr/bin/env bash
# gpu_check.sh OUTDIR -- builds deepinfer with the CUDA backend on a GPU machine, runs every
# test and the CUDA GEMV benchmark, and writes the logs to OUTDIR:
#   env.txt       GPU, driver, toolkit, cmake
#   deps.txt      how the build dependencies were found (system, carried .debs, apt)
#   build.log     configure + build (warnings are errors)
#   cuda_ops.log  tests/ops/test_cuda_ops and test_cuda_v4_ops (every CUDA op vs the CPU
#                 reference)
#   probe.log     bench/probe_wgmma (wgmma's k16 sums against mma.sync's, bitwise)
#   cuda_model.log tests/e2e/test_cuda_model (V2/V3/V4 goldens, engine and batch invariance
#                 on CUDA; again with DI_CUDA_GRAPHS=0, with each other one-token-group
#                 GEMV: DI_CUDA_TC_LEAN=1, DI_CUDA_TC_XS=0, with a prefill's grouped products on
#                 the GEMV: DI_CUDA_TC_WIDE_GROUPED=0, with a decode batch's grouped products
#                 on one K run per warp or on eight: DI_CUDA_TC_RUNS_MIN_N=0,
#                 DI_CUDA_TC_RUNS_TARGET=1, on tc_kernel instead of the streaming kernel:
#                 DI_CUDA_TC_STREAM=0, with FP8 weights on the tensor cores:
#                 DI_CUDA_TC_FP8=1, with the wide products on mma.sync instead of wgmma:
#                 DI_CUDA_TC_WGMMA=0, with an expert's rows in passes of 8 only and no
#                 weights before the PDL wait: DI_CUDA_TC_STREAM16=0 DI_CUDA_TC_EARLY=0, and
#                 with the plain one-token products on the streaming kernel:
#                 DI_CUDA_TC_STREAM_PLAIN=1, with the queries rotated by the rope op:
#                 DI_CUDA_ATTN_ROPE=0, and with the MoE combine and the next norm in one
#                 kernel: DI_CUDA_COMBINE_NORM_MAX_N=8), tests/e2e/test_bundled_model (the
#                 bundled V4 model on CPU and CUDA) and short CLI generations (V3 and V4) on
#                 --device cuda and cpu
#   ctest.log     all tests through ctest (not with QUICK=1 or CTEST=0)
#   bench.log     bench_cuda_matmul (GEMV GB/s vs the device copy bandwidth, MLA decode)
#   sanitizer.log compute-sanitizer memcheck over test_cuda_ops (only with SANITIZE=1)
#   ncu.txt       Nsight Compute profile of the FP8 decode GEMV (only with VARIANTS=1)
#   summary.txt   one line per step, also printed last
#
# Build dependencies (cmake, pkg-config, jansson, pcre2): taken from the system when present;
# else from .deb files in DI_DEB_DIR (default: <repo>/.debs, e.g. fetched elsewhere with
# `apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 pkgconf pkgconf-bin
# libpkgconf3`), unpacked under /tmp/di-deps (never over /); else through apt-get when the
# machine can reach a mirror. Environment: BUILD_DIR (default <repo>/build-gpu), JOBS,
# DI_FORCE_DEBS=1 (use the .debs even when the system has the packages), BENCH=0 (skip the
# GEMV benchmark), CTEST=0 (skip the full ctest run), BUILD_ONLY=1 (stop after building the
# CUDA targets, e.g. before bench/gpu_decode_profile.sh).
set -uo pipefail

out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build-gpu}
jobs=${JOBS:-$(nproc)}
deb_dir=${DI_DEB_DIR:-$repo/.debs}
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# --- environment ------------------------------------------------------------------------------
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
    command -v nvcc && nvcc --version | tail -2
    command -v cmake && cmake --version | head -1
    grep PRETTY_NAME /etc/os-release
    nproc
} >"$out/env.txt" 2>&1
export PATH=$PATH:/usr/local/cuda/bin

# --- build dependencies -----------------------------------------------------------------------
have_deps() { command -v pkg-config >/dev/null && pkg-config --exists jansson libpcre2-8; }
{
    if have_deps && [ -z "${DI_FORCE_DEBS:-}" ]; then
        echo "deps: system"
    elif ls "$deb_dir"/*.deb >/dev/null 2>&1; then
        echo "deps: unpacking $(ls "$deb_dir"/*.deb | wc -l) .deb files from $deb_dir"
        prefix=/tmp/di-deps
        mkdir -p $prefix
        for f in "$deb_dir"/*.deb; do dpkg-deb -x "$f" $prefix; done
        # The .pc files say prefix=/usr; point them at the unpacked tree.
        find $prefix -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$prefix/usr|" {} +
        export PATH=$prefix/usr/bin:$PATH
        export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
        export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    else
        echo "deps: trying apt-get"
        bash "$repo/tools/install_deps.sh"
    fi
    command -v cmake || echo "cmake: MISSING"
    pkg-config --modversion jansson libpcre2-8
} >"$out/deps.txt" 2>&1
# Exports made inside { } stay in this shell (no subshell), so the build sees them.
if have_deps; then say "deps: ok ($(head -1 "$out/deps.txt"))"; else say "deps: MISSING (see deps.txt)"; fi

# --- build ------------------------------------------------------------------------------------
# First the CUDA test and benchmark (they must build), then everything else, carrying on past
# failures so that others' work in progress cannot stop the CUDA checks.
t0=$(date +%s)
{
    cmake -S "$repo" -B "$build" -DDI_WERROR=ON -DCMAKE_BUILD_TYPE=Release &&
        cmake --build "$build" -j"$jobs" --target test_cuda_ops test_cuda_v4_ops test_cuda_model \
            test_bundled_model deepinfer bench_cuda_matmul probe_wgmma
} >"$out/build.log" 2>&1
rc=$?
say "build (CUDA test + bench): rc=$rc in $(($(date +%s) - t0)) s ($(grep -c 'Building CUDA object' "$out/build.log") CUDA objects)"
if [ $rc -ne 0 ]; then
    grep -E "error" "$out/build.log" | head -20 | tee -a "$summary"
    exit 1
fi
[ -n "${BUILD_ONLY:-}" ] && exit 0
if [ -z "${QUICK:-}" ]; then
    t0=$(date +%s)
    cmake --build "$build" -j"$jobs" -- -k >>"$out/build.log" 2>&1
    rc=$?
    say "build (all): rc=$rc in $(($(date +%s) - t0)) s"
    [ $rc -ne 0 ] && grep -E "error" "$out/build.log" | head -10 | tee -a "$summary"
fi

# --- CUDA op tests and benchmark --------------------------------------------------------------
t0=$(date +%s)
(cd "$repo" && "$build/test_cuda_ops") >"$out/cuda_ops.log" 2>&1
rc=$?
say "test_cuda_ops: rc=$rc in $(($(date +%s) - t0)) s: $(tail -1 "$out/cuda_ops.log")"
grep -E "^FAIL|failed:|CHECK" "$out/cuda_ops.log" | head -20
t0=$(date +%s)
echo "==== test_cuda_v4_ops" >>"$out/cuda_ops.log"
(cd "$repo" && "$build/test_cuda_v4_ops") >>"$out/cuda_ops.log" 2>&1
rc=$?
say "test_cuda_v4_ops: rc=$rc in $(($(date +%s) - t0)) s: $(tail -1 "$out/cuda_ops.log")"
# wgmma's k16 sums against mma.sync's, bitwise (bench/probe_wgmma.cu; exit 1 when any differ)
"$build/probe_wgmma" >"$out/probe.log" 2>&1
rc=$?
say "probe_wgmma: rc=$rc: $(tail -2 "$out/probe.log" | tr '\n' ' ')"

# --- the model on CUDA -------------------------------------------------------------------------
t0=$(date +%s)
(cd "$repo" && "$build/test_cuda_model") >"$out/cuda_model.log" 2>&1
rc=$?
say "test_cuda_model: rc=$rc in $(($(date +%s) - t0)) s: $(tail -1 "$out/cuda_model.log")"
grep -E "FAIL|failed:|differ|DIFFER" "$out/cuda_model.log" | head -20 | tee -a "$summary"
t0=$(date +%s)
echo "==== test_bundled_model" >>"$out/cuda_model.log"
(cd "$repo" && "$build/test_bundled_model") >>"$out/cuda_model.log" 2>&1
rc=$?
say "test_bundled_model: rc=$rc in $(($(date +%s) - t0)) s: $(tail -1 "$out/cuda_model.log")"
# Once more without CUDA graphs (every op of a decode step enqueued one by one).
echo "==== DI_CUDA_GRAPHS=0 test_cuda_model" >>"$out/cuda_model.log"
(cd "$repo" && DI_CUDA_GRAPHS=0 "$build/test_cuda_model") >>"$out/cuda_model.log" 2>&1
say "test_cuda_model with DI_CUDA_GRAPHS=0: rc=$? $(tail -1 "$out/cuda_model.log")"
# The model through the other one-token-group GEMVs (the op tests compare their bits with the
# default's; here the goldens, the engine and batch invariance run on them), with a prefill's
# grouped products on the GEMV instead of the wide kernel, a decode batch's grouped products
# with one K run per warp, with all of a tile's runs on one warp and on tc_kernel (not the
# streaming kernel), with FP8 weights on the tensor cores (every weight, however few its
# rows: the test models are small), with the wide products on mma.sync (not wgmma), with the
# streaming kernel's passes of 8 only and no early weights, with the plain one-token
# products on the streaming kernel (its weights before the PDL wait, under graphs), with the
# queries' rope in a launch of its own, and with a MoE layer's combine and the next norm in
# one (opt-in).
for v in DI_CUDA_TC_LEAN=1 DI_CUDA_TC_XS=0 DI_CUDA_TC_WIDE_GROUPED=0 DI_CUDA_TC_RUNS_MIN_N=0 \
    DI_CUDA_TC_RUNS_TARGET=1 DI_CUDA_TC_STREAM=0 "DI_CUDA_TC_FP8=1 DI_CUDA_TC_MIN_ROWS=1" \
    DI_CUDA_TC_WGMMA=0 "DI_CUDA_TC_STREAM16=0 DI_CUDA_TC_EARLY=0" DI_CUDA_TC_STREAM_PLAIN=1 \
    DI_CUDA_ATTN_ROPE=0 DI_CUDA_COMBINE_NORM_MAX_N=8; do
    echo "==== $v test_cuda_model" >>"$out/cuda_model.log"
    (cd "$repo" && env $v "$build/test_cuda_model") >>"$out/cuda_model.log" 2>&1
    say "test_cuda_model with $v: rc=$? $(tail -1 "$out/cuda_model.log")"
done
# The CLI end to end on the GPU and on the CPU (same greedy ids expected; the speed summary
# is on stderr).
for model in tests/data/v3_fp8 tests/data/v4_upstream_fp8; do
    for dev in cuda cpu; do
        {
            echo "==== deepinfer generate --model $model --device $dev"
            (cd "$repo" && "$build/deepinfer" generate --model $model --device $dev \
                --ids "1 2 3 4 5" --max-tokens 32 2>&1 | tail -3)
        } >>"$out/cuda_model.log" 2>&1
    done
done
(cd "$repo" && "$build/deepinfer" info --devices) >>"$out/cuda_model.log" 2>&1

if [ "${BENCH:-1}" != 0 ]; then
    t0=$(date +%s)
    "$build/bench_cuda_matmul" >"$out/bench.log" 2>&1
    rc=$?
    say "bench: rc=$rc in $(($(date +%s) - t0)) s"
fi

# --- all tests --------------------------------------------------------------------------------
if [ "${CTEST:-1}" != 0 ] && [ -z "${QUICK:-}" ]; then
    t0=$(date +%s)
    (cd "$build" && ctest --output-on-failure -j4 --timeout 300) >"$out/ctest.log" 2>&1
    rc=$?
    say "ctest: rc=$rc in $(($(date +%s) - t0)) s: $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
    grep -E "\*\*\*Failed|Not Run|\(Failed\)|Timeout" "$out/ctest.log" | head -20 | tee -a "$summary"
fi

# --- memory checker (optional: SANITIZE=1) ------------------------------------------------------
if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
    t0=$(date +%s)
    (cd "$repo" && timeout 150 compute-sanitizer --tool memcheck --print-limit 20 \
        "$build/test_cuda_ops") >"$out/sanitizer.log" 2>&1
    rc=$?
    say "compute-sanitizer memcheck: rc=$rc in $(($(date +%s) - t0)) s: $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log")"
fi

# --- tuning variants and a profile (optional: VARIANTS=1) ---------------------------------------
# The CUDA tests again under each non-default knob, the FP8 GEMV timed under each, and one
# Nsight Compute profile of the FP8 decode GEMV (appended to cuda_ops.log / bench.log; ncu.txt).
if [ -n "${VARIANTS:-}" ]; then
    for v in DI_CUDA_FP8_CONVERT=cvt DI_CUDA_KSPLIT_MIN=1000000 DI_CUDA_FP8_PIPE=0 DI_CUDA_TC_RT=1 \
        "DI_CUDA_TC_WIDE_MIN_N=0 DI_CUDA_TC_WIDE_GROUPED=0"; do
        echo "==== $v" >>"$out/cuda_ops.log"
        (cd "$repo" && env $v "$build/test_cuda_ops") >>"$out/cuda_ops.log" 2>&1
        say "test_cuda_ops with $v: rc=$? $(tail -1 "$out/cuda_ops.log")"
    done
    for v in "DI_CUDA_FP8_CONVERT=bits DI_CUDA_KSPLIT_MIN=256" \
        "DI_CUDA_FP8_PIPE=0 DI_CUDA_KSPLIT_MIN=256" \
        "DI_CUDA_FP8_PIPE=1 DI_CUDA_KSPLIT_MIN=1000000" \
        "DI_CUDA_FP8_CONVERT=cvt DI_CUDA_KSPLIT_MIN=256" \
        "DI_CUDA_FP8_CONVERT=bits DI_CUDA_KSPLIT_MIN=1000000" \
        "DI_CUDA_FP8_CONVERT=cvt DI_CUDA_KSPLIT_MIN=1000000"; do
        echo "==== $v" >>"$out/bench.log"
        env $v "$build/bench_cuda_matmul" 0 F8_E4M3 4 2>&1 | grep -v '^device' >>"$out/bench.log"
    done
    if command -v ncu >/dev/null; then
        timeout 180 ncu --clock-control none -k regex:gemv_kernel -c 1 --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section Occupancy --section WarpStateStats \
            "$build/bench_cuda_matmul" 0 F8_E4M3 1 >"$out/ncu.txt" 2>&1
        say "ncu: rc=$?"
    fi
fi

[ -f "$out/bench.log" ] && cat "$out/bench.log"
echo "---- summary"
cat "$summary"
