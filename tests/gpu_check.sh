#!/usr/bin/env bash
# gpu_check.sh: `make gpu-check`, the one command to run first on a GPU machine. Offline, and held
# to a time budget (GPU_CHECK_SECONDS, default 520 s: one command on a lent machine may run 10
# minutes): every run's timeout is cut to what is left, the chapters' layouts stop being started
# when the budget is spent, and what could not run is listed as "skip" with the reason. Every run
# gets GUARD_TIMEOUT=60 (default; the watchdog then ends a hang in about a minute, not 10).
# Without a GPU (nvidia-smi missing or listing none) it prints one line and exits 2. With one,
# each part below is timed, in this order (the quick ones that say the most first):
#   a  environment: GPU, compute capability, SMs, memory, driver, CUDA runtime, nvcc, NCCL (header
#      and library), Open MPI; a probe built with nvcc runs a kernel; the fp32 peak for MFU
#   b  Open MPI and cJSON: the system's, or else the bundle `make gpu-bundle` made elsewhere
#      (gpu-bundle/, tools/gpu_bundle.sh), unpacked into gpu-bundle/root and relocated; with
#      neither, one line saying what to do and exit 2 (before anything else is printed)
#   c  the build: make cuda with -j (one job per core)
#   f  NCCL: chapter 01 with --check on one rank, COMM=nccl (one rank holds no NCCL communicator:
#      the run says so); with two GPUs or more, 2 ranks of chapters 01, 05 (a GPipe pipeline, whose
#      early receives need the links connected at creation), 03 --async-tp and 06's ring, each
#      PARITY OK, NCCL's version line printed (NCCL refuses two ranks on one GPU)
#   d  every unit test tests/test_*.c of the cuda build on the rank counts its first line names,
#      at most MAX_NP (4) ranks, COMM=mpi: the ranks share the GPU (they compare the CUDA kernels
#      with host references)
#   g  determinism: one layout of chapter 08 (FSDP x TP on 4 ranks) run twice with --dump; its
#      losses, step-1 gradients, initial weights and batches compared bit for bit (cmp)
#   h  throughput, the C side of make bench-baseline (its PyTorch side runs on the CPU): chapter
#      01's step at the bench size on one rank, and chapter 08's trainer on a larger model;
#      tokens/s and MFU against the GPU's fp32 peak (cuBLAS runs fp32 without TF32)
#   e  every chapter's layouts (NN_*/checks.txt, tests/run_checks.sh) of at most MAX_NP ranks,
#      COMM=mpi, for the rest of the budget; how many were skipped for having more ranks, and
#      how many for time
# The float8 parts (chapter 07, test_gemm_fp8, test_float8_linear) need compute capability 8.9
# or later: on an older GPU they are skipped with a line saying so.
# Writes the summary OUT (default out/gpu-check.txt): the environment, one line per part (pass,
# FAIL or skip, seconds, figures), the total; and every part's output beside it (OUT with .log for
# .txt). Exit 0 when no part fails (skips are listed), 1 when one fails, 2 when it cannot start.
# Environment: OUT, BUILD_ROOT (default build), MAX_NP (default 4), GPU_CHECK_SECONDS (520),
# GPU_BUNDLE (default gpu-bundle), CUDA_HOME, GPU_CHECK_JOBS (runs at a time in d and e; default
# cores / 4), NVIDIA_SMI (default nvidia-smi), GUARD_TIMEOUT (60).
# GPU_CHECK_BACKEND=cpu runs the same parts on the CPU build (COMM=nccl-sim in f, small sizes in
# h): the script's own plumbing tried on a machine without a GPU, under a stand-in nvidia-smi
# (tests/t_gpu_check.sh does, with a small budget).
set -u
t_begin=$(date +%s)
cd "$(dirname "$0")/.."
repo=$PWD
budget=${GPU_CHECK_SECONDS:-520}
[ "$budget" -ge 30 ] 2>/dev/null || { echo "gpu-check: GPU_CHECK_SECONDS=$budget is not valid: use a number of seconds, 30 or more"; exit 2; }
deadline=$((t_begin + budget))
left() { echo $((deadline - $(date +%s))); }
# cap N: a run's timeout, N seconds or what is left of the budget (less a margin to write up)
cap() { local l; l=$(( $(left) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
export GUARD_TIMEOUT=${GUARD_TIMEOUT:-60}
backend=${GPU_CHECK_BACKEND:-cuda}
root=${BUILD_ROOT:-build}
out=${OUT:-out/gpu-check.txt}
max_np=${MAX_NP:-4}
bundle=${GPU_BUNDLE:-gpu-bundle}
cores=$(nproc 2>/dev/null || echo 1)
njobs=${GPU_CHECK_JOBS:-$((cores / 4))}; [ "$njobs" -ge 1 ] 2>/dev/null || njobs=1

# ---------------------------------------------------------------- a GPU at all? (one line if not)
smi=${NVIDIA_SMI:-nvidia-smi}   # tests/t_gpu_check.sh points it at stand-ins
if ! command -v "$smi" >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi not found): run it on a machine with an NVIDIA GPU and driver; make test checks everything else"
    exit 2
fi
smi_list=$("$smi" -L 2>&1)
gpus=$(echo "$smi_list" | grep -c '^GPU [0-9]')
if [ "$gpus" -eq 0 ]; then
    echo "gpu-check: no GPU here (nvidia-smi lists none: $(echo "$smi_list" | grep . | head -1 | cut -c1-120)); make test checks everything else"
    exit 2
fi

# ---------------------------------------------------------------- Open MPI and cJSON (one line if neither)
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
what_missing() {
    local m=""
    { command -v mpicc && command -v mpirun; } >/dev/null 2>&1 || m="Open MPI (mpicc, mpirun)"
    printf '#include <cjson/cJSON.h>\nint main(void) { return cJSON_Version() == 0; }\n' >"$tmp/cj.c"
    # linked as the build links (mpicc, with a bundle's OMPI_LDFLAGS), else with gcc
    local compiler=gcc; [ -z "$m" ] && compiler=mpicc
    $compiler "$tmp/cj.c" -o "$tmp/cj" -lcjson >/dev/null 2>&1 || m="${m:+$m and }cJSON"
    printf '#include <zlib.h>\nint main(void) { return crc32(0L, 0, 0) != 0; }\n' >"$tmp/z.c"
    $compiler "$tmp/z.c" -o "$tmp/z" -lz >/dev/null 2>&1 || m="${m:+$m and }zlib"
    echo "$m"
}
t_deps=$(date +%s)
missing=$(what_missing)
deps_how="the system's packages"
if [ -n "$missing" ]; then
    if ! ls "$bundle"/debs/*.deb >/dev/null 2>&1; then
        echo "gpu-check: $missing missing and no $bundle/ here: run make gpu-bundle on a Debian 12 machine with its package registry and copy gpu-bundle/ into this checkout (or apt-get install openmpi-bin libopenmpi-dev libcjson-dev zlib1g-dev)"
        exit 2
    fi
    need=$(sed -n 's/^glibc >= //p' "$bundle/MANIFEST" 2>/dev/null)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
    if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
        echo "gpu-check: $missing missing, and $bundle/'s libraries (Debian 12) need glibc >= $need where this machine has $have: install openmpi-bin libopenmpi-dev libcjson-dev zlib1g-dev from this system's own distribution"
        exit 2
    fi
    if ! why=$(bash tools/gpu_bundle.sh unpack "$bundle" "$bundle/root" 2>&1); then
        echo "gpu-check: $missing missing, and unpacking $bundle/ failed: $why"
        exit 2
    fi
    eval "$(bash tools/gpu_bundle.sh env "$bundle/root")"
    still=$(what_missing)
    if [ -n "$still" ]; then
        echo "gpu-check: $still still missing after unpacking $bundle/ into $bundle/root: see tools/gpu_bundle.sh"
        exit 2
    fi
    deps_how="$bundle/ ($(ls "$bundle"/debs/*.deb | wc -l) Debian packages), unpacked into $bundle/root: PATH, LD_LIBRARY_PATH, OPAL_PREFIX set for this run (was missing: $missing)"
fi
# NCCL: the CUDA Toolkit's nccl.h (or Debian's and Ubuntu's libnccl-dev), else the NCCL wheel
# PyTorch brings (nvidia-nccl-cu13: include/nccl.h and lib/libnccl.so.2, with no libnccl.so for
# -lnccl, hence the link made in the build folder)
cuda_home=${CUDA_HOME:-}
if [ -z "$cuda_home" ]; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then cuda_home=/usr/local/cuda
    elif command -v nvcc >/dev/null; then cuda_home=$(dirname "$(dirname "$(command -v nvcc)")"); fi
fi
nccl_how=""
if [ "$backend" = cuda ] && [ ! -f "$cuda_home/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    wheel_h=$(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null |
              while read -r d; do find "$d" -name nccl.h -path '*/include/*' 2>/dev/null; done | head -1)
    wheel_so=$([ -n "$wheel_h" ] && ls "$(dirname "$(dirname "$wheel_h")")"/lib/libnccl.so* 2>/dev/null | head -1)
    if [ -n "$wheel_so" ] && mkdir -p "$root/nccl-wheel" && ln -sfn "$wheel_so" "$root/nccl-wheel/libnccl.so"; then
        inc=$(dirname "$wheel_h")
        export C_INCLUDE_PATH="$inc${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}" CPLUS_INCLUDE_PATH="$inc${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
        export LIBRARY_PATH="$(cd "$root/nccl-wheel" && pwd)${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$(dirname "$wheel_so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        nccl_how="no nccl.h in the CUDA Toolkit: PyTorch's NCCL wheel, $(dirname "$inc")"
    fi
fi
t_deps=$(( $(date +%s) - t_deps ))

# ---------------------------------------------------------------- bookkeeping
mkdir -p "$(dirname "$out")" || exit 2
log=${out%.txt}.log
: >"$log" || exit 2
mpirun_base="${MPIRUN_BASE:-$(tools/mpirun_base.sh)} --bind-to none"   # several runs share the cores
t_start=$(date +%s)
names=(); results=(); secs=(); figs=(); final=""
env_lines=()
write_summary() {
    {
        echo "# make gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname), $(( $(date +%s) - t_begin )) s${final:- so far} (budget $budget s)"
        printf '%s\n' "${env_lines[@]}"
        echo
        local i
        for i in "${!names[@]}"; do
            printf '%-2s %-48s %-5s %4s s  %s\n' "${names[$i]%% *}" "${names[$i]#* }" "${results[$i]}" "${secs[$i]}" "${figs[$i]}"
        done
    } >"$out"
}
# record "x title" pass|FAIL SECONDS "figures"
record() {
    names+=("$1"); results+=("$2"); secs+=("$3"); figs+=("$4")
    printf '%-2s %-48s %-5s %4s s  %s\n' "${1%% *}" "${1#* }" "$2" "$3" "$4"
    write_summary
}
section() { printf '\n==== %s\n' "$1" >>"$log"; }
# pool FILE: the lines "ID<TAB>COMMAND" of FILE, GPU_CHECK_JOBS at a time; COMMAND's output goes to
# $tmp/pool/ID.out and its status to ID.rc. Each run has Open MPI session directories of its own
# (mpiruns ending at once would remove the shared one under another's feet). "@T@" in COMMAND is
# its timeout (cap 300, when it starts), "@LEFT@" what is left of the budget; once less than 30 s of the budget is left no more are
# started, and those left get the status "skip".
pool() {
    local id cmd
    mkdir -p "$tmp/pool"
    while IFS=$'\t' read -r id cmd; do
        while [ "$(jobs -rp | wc -l)" -ge "$njobs" ]; do wait -n; done
        if [ "$(left)" -lt 30 ]; then echo skip >"$tmp/pool/$id.rc"; : >"$tmp/pool/$id.out"; continue; fi
        cmd=${cmd//@T@/$(cap 300)}
        cmd=${cmd//@LEFT@/$(cap 100000)}
        (
            export OMPI_MCA_orte_tmpdir_base=$tmp/ompi/$id
            mkdir -p "$OMPI_MCA_orte_tmpdir_base"
            bash -c "$cmd" </dev/null >"$tmp/pool/$id.out" 2>&1
            echo $? >"$tmp/pool/$id.rc"
        ) &
    done <"$1"
    wait
}
# out_of_time "x title" SECONDS: true (and the part recorded as skipped) when less than SECONDS
# of the budget is left
out_of_time() {
    [ "$(left)" -ge "$2" ] && return 1
    record "$1" skip 0 "not run: $(left) s of the time budget left (GPU_CHECK_SECONDS=$budget), it needs about $2"
}

# ---------------------------------------------------------------- a: environment
t0=$(date +%s)
section "a environment"
IFS=, read -r gpu_name driver cc mem_mib clock_mhz < <("$smi" --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm \
    --format=csv,noheader,nounits 2>/dev/null | head -1 | sed 's/, */,/g')
"$smi" >>"$log" 2>&1
nvcc=${cuda_home:+$cuda_home/bin/nvcc}
nvcc_v=$([ -x "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
nccl_h=""; for h in "$cuda_home/include/nccl.h" /usr/include/nccl.h ${wheel_h:-}; do [ -f "$h" ] && { nccl_h=$h; break; }; done
nccl_hv=$([ -n "$nccl_h" ] && awk '/define NCCL_MAJOR/{a=$3}/define NCCL_MINOR/{b=$3}/define NCCL_PATCH/{c=$3}END{print a"."b"."c}' "$nccl_h")
ompi_v=$(mpirun --version 2>/dev/null | head -1 | sed 's/^mpirun (Open MPI) //')
os=$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}")
probe_ok=yes; probe_why=""
declare -A P=()
if [ "$backend" = cuda ]; then
    cat >"$tmp/probe.cu" <<'EOF'
// gpu_check.sh's probe: what the CUDA runtime, the driver and NCCL report, and one kernel run
#include <cstdio>
#include <cuda_runtime.h>
#include <nccl.h>
__global__ void sum_lanes(int *x) { atomicAdd(x, (int)threadIdx.x + 1); }
int main() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { printf("error=cudaGetDeviceCount: %s\n", cudaGetErrorString(e)); return 1; }
    int rt = 0, drv = 0, major = 0, minor = 0, sms = 0, khz = 0, nv = 0, h = 0, *d = nullptr;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    ncclGetVersion(&nv);
    printf("devices=%d\nruntime=%d.%d\ndriver_api=%d.%d\ncc=%d.%d\nsms=%d\nclock_khz=%d\nnccl=%d.%d.%d\n", n, rt / 1000,
           rt % 1000 / 10, drv / 1000, drv % 1000 / 10, major, minor, sms, khz, nv / 10000, nv / 100 % 100, nv % 100);
    if ((e = cudaMalloc(&d, sizeof(int))) == cudaSuccess && (e = cudaMemset(d, 0, sizeof(int))) == cudaSuccess) {
        sum_lanes<<<1, 32>>>(d);
        if ((e = cudaGetLastError()) == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    }
    if (e != cudaSuccess) { printf("error=a kernel: %s\n", cudaGetErrorString(e)); return 1; }
    printf("kernel=%s\n", h == 528 ? "ok" : "wrong sum");
    return h != 528;
}
EOF
    libdir=$(ls -d "$cuda_home/lib64" "$cuda_home/lib" 2>/dev/null | head -1)
    if [ ! -x "$nvcc" ]; then probe_ok=""; probe_why="nvcc not found (set CUDA_HOME)"
    elif ! timeout 120 "$nvcc" -O2 -o "$tmp/probe" "$tmp/probe.cu" -L"$libdir" -Xlinker -rpath -Xlinker "$libdir" -lnccl >>"$log" 2>&1; then
        probe_ok=""; probe_why="the probe did not compile with $nvcc"
    else
        timeout 60 "$tmp/probe" >"$tmp/probe.txt" 2>&1; rc=$?
        cat "$tmp/probe.txt" >>"$log"
        while IFS='=' read -r k v; do [ -n "$k" ] && P[$k]=$v; done <"$tmp/probe.txt"
        [ $rc -eq 0 ] || { probe_ok=""; probe_why="the probe failed: ${P[error]:-exit $rc}"; }
    fi
fi
cc=${cc:-${P[cc]:-0.0}}
sms=${P[sms]:-0}
[ -n "$clock_mhz" ] && [ "$clock_mhz" -gt 0 ] 2>/dev/null || clock_mhz=$(( ${P[clock_khz]:-0} / 1000 ))
# fp32 lanes per SM: 64 on Volta, Turing and A100 (7.x, 8.0), 128 on GA10x, Ada, Hopper, Blackwell
lanes=128; case "$cc" in 7.*|8.0) lanes=64 ;; esac
peak=$(awk -v s="$sms" -v l="$lanes" -v c="$clock_mhz" 'BEGIN {printf "%.1f", s * l * 2 * c / 1e6}')   # TFLOP/s
cc_num=$(echo "$cc" | awk -F. '{print $1 * 10 + $2}')
fp8_ok=yes; [ "$cc_num" -ge 89 ] 2>/dev/null || fp8_ok=""
driver_major=${driver%%.*}
env_lines=(
    "GPU        ${gpu_name:-?} (x$gpus), compute capability $cc, $sms SMs, $(awk -v m="${mem_mib:-0}" 'BEGIN {printf "%.1f", m / 1024}') GiB; fp32 peak $peak TFLOP/s ($sms SMs x $lanes lanes x 2 x ${clock_mhz} MHz)"
    "driver     ${driver:-?} (CUDA ${P[driver_api]:-?} API); CUDA runtime ${P[runtime]:-?}; nvcc ${nvcc_v:-not found} (${cuda_home:-no CUDA_HOME})"
    "NCCL       header ${nccl_hv:-not found} (${nccl_h:-no nccl.h}); library ${P[nccl]:-?}${nccl_how:+ ($nccl_how)}"
    "Open MPI   ${ompi_v:-?} ($deps_how)"
    "host       $cores cores, $os, glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
)
printf '%s\n' "${env_lines[@]}" | tee -a "$log"
echo
a_fig="${gpu_name:-?}, cc $cc, driver ${driver:-?}, runtime ${P[runtime]:-?}, NCCL ${P[nccl]:-$nccl_hv}, Open MPI ${ompi_v:-?}"
if [ "$backend" = cuda ] && [ -z "$probe_ok" ]; then record "a environment" FAIL $(( $(date +%s) - t0 )) "$probe_why"
elif [ "$backend" = cuda ] && ! [ "${driver_major:-0}" -ge 580 ] 2>/dev/null; then
    record "a environment" FAIL $(( $(date +%s) - t0 )) "driver ${driver:-?} is older than 580, which CUDA 13 needs: update the NVIDIA driver"
else record "a environment" pass $(( $(date +%s) - t0 )) "$a_fig"; fi

# ---------------------------------------------------------------- b: Open MPI and cJSON
section "b Open MPI, cJSON, NCCL"; echo "$deps_how${nccl_how:+; $nccl_how}" >>"$log"
if [ "$backend" = cuda ] && [ -z "$nccl_h" ]; then
    record "b Open MPI, cJSON, NCCL" FAIL "$t_deps" "$deps_how; NCCL not found: no nccl.h in ${cuda_home:-CUDA_HOME}/include or /usr/include, and no NCCL wheel (install libnccl-dev, or set CUDA_HOME)"
else record "b Open MPI, cJSON, NCCL" pass "$t_deps" "$deps_how${nccl_how:+; $nccl_how}"; fi

# ---------------------------------------------------------------- c: the build
t0=$(date +%s)
section "c build"
if [ "$backend" = cuda ]; then build=(make -j"$cores" --no-print-directory cuda BUILD_ROOT="$root" ${CUDA_HOME:+CUDA_HOME="$CUDA_HOME"})
else build=(make -j"$cores" --no-print-directory BACKEND=cpu BUILD_ROOT="$root" all); fi
c_title="c build (${build[*]:0:2} ${build[3]})"
echo "${build[*]}" >>"$log"
timeout "$(cap 300)" "${build[@]}" >"$tmp/build.txt" 2>&1; rc=$?
cat "$tmp/build.txt" >>"$log"
built=""
if [ $rc -eq 0 ]; then
    built=yes
    record "$c_title" pass $(( $(date +%s) - t0 )) "$(ls "$root/$backend"/[0-9][0-9] "$root/$backend"/tests/test_* 2>/dev/null | grep -v '\.[od]$' | wc -l) binaries in $root/$backend"
else
    record "$c_title" FAIL $(( $(date +%s) - t0 )) "exit $rc: $(grep -m1 -E 'error|Error' "$tmp/build.txt" | cut -c1-150)"
    tail -20 "$tmp/build.txt" | sed 's/^/      | /'
fi
not_built() { record "$1" FAIL 0 "not run: the build failed"; }

# ---------------------------------------------------------------- f: NCCL
# One rank (one GPU): COMM=nccl chosen and the run passes; a rank alone holds no NCCL communicator
# (nothing to connect), and the run's line says so. With two GPUs or more, 2 ranks, one a GPU
# (NCCL refuses two ranks on one): the layouts whose order NCCL's lazy connection would hang
# without the links connected at creation (a GPipe pipeline, async TP's rings) and a ring of
# exchanges, each PARITY OK with NCCL's version line printed.
t0=$(date +%s)
section "f NCCL"
comm_f=nccl; [ "$backend" = cpu ] && comm_f=nccl-sim
f_runs=("1 01"); [ "$gpus" -ge 2 ] && f_runs+=("2 01" "2 05 --schedule gpipe --microbatches 4" "2 03 --async-tp" "2 06 --cp-method ring")
f_title="f NCCL (--check, COMM=$comm_f: NP=1 01$([ "$gpus" -ge 2 ] && echo "; NP=2 01, 05 gpipe, 03 async-tp, 06 ring"))"
if [ -n "$built" ] && ! out_of_time "$f_title" 30; then
    f_ok=yes; f_fig=""
    for run in "${f_runs[@]}"; do
        read -r np ch args <<<"$run"
        echo "COMM=$comm_f NCCL_DEBUG=VERSION mpirun -np $np $root/$backend/$ch --check $args" >>"$log"
        COMM=$comm_f NCCL_DEBUG=VERSION timeout "$(cap 120)" $mpirun_base -np "$np" "$root/$backend/$ch" --check $args \
            --out "$tmp/f$np$ch" </dev/null >"$tmp/f.txt" 2>&1; rc=$?
        cat "$tmp/f.txt" >>"$log"
        nccl_line=$(grep -m1 -o 'NCCL version [^ ]*' "$tmp/f.txt")
        comms=$(grep -m1 -o 'NCCL communicators on rank 0: [0-9]* groups\? of 2+ ranks and [0-9]* links\?' "$tmp/f.txt")
        why=""
        [ $rc -eq 0 ] && grep -q '^PARITY OK' "$tmp/f.txt" || why="exit $rc $(grep -m1 -E '^(error|PARITY)' "$tmp/f.txt")"
        [ -z "$why" ] && [ -z "$comms" ] && why="no line counting its NCCL communicators: COMM=$comm_f was not the backend"
        [ -z "$why" ] && [ "$np" -gt 1 ] && [ -z "$nccl_line" ] && [ "$backend" = cuda ] &&
            why="NCCL never printed its version (NCCL_DEBUG=VERSION): no communicator was made"
        if [ -z "$why" ]; then f_fig="$f_fig${f_fig:+; }NP=$np $ch PARITY OK (${comms#NCCL communicators on rank 0: }${nccl_line:+, $nccl_line})"
        else f_fig="$f_fig${f_fig:+; }NP=$np $ch FAILED: $why"; f_ok=""; tail -8 "$tmp/f.txt" | sed 's/^/      | /'; fi
    done
    record "$f_title" "$([ -n "$f_ok" ] && echo pass || echo FAIL)" $(( $(date +%s) - t0 )) "$f_fig"
elif [ -z "$built" ]; then not_built "$f_title"; fi

# ---------------------------------------------------------------- d: unit tests
t0=$(date +%s)
section "d unit tests"
if [ -n "$built" ] && ! out_of_time "d unit tests (COMM=mpi, <= $max_np ranks)" 60; then
    : >"$tmp/d.list"; skipped_np=0; skipped_fp8=""
    for src in tests/test_*.c; do
        name=$(basename "$src" .c)
        ranks=$(head -1 "$src" | sed -n 's#.*ranks:\([0-9 ]*\).*#\1#p')
        case "$name" in test_gemm_fp8|test_float8_linear)
            [ -z "$fp8_ok" ] && { skipped_fp8="$skipped_fp8 $name"; continue; } ;;
        esac
        for np in ${ranks:-1}; do
            if [ "$np" -gt "$max_np" ]; then skipped_np=$((skipped_np + 1)); continue; fi
            printf '%s\t%s\n' "$name.np$np" "COMM=mpi timeout @T@ $mpirun_base -np $np $root/$backend/tests/$name" >>"$tmp/d.list"
        done
    done
    pool "$tmp/d.list"
    np_=0; nf=0; nl=0
    while IFS=$'\t' read -r id cmd; do
        rc=$(cat "$tmp/pool/$id.rc"); echo "-- $id: exit $rc" >>"$log"; cat "$tmp/pool/$id.out" >>"$log"
        if [ "$rc" = skip ]; then nl=$((nl + 1)); elif [ "$rc" = 0 ]; then np_=$((np_ + 1)); else
            nf=$((nf + 1)); echo "  FAIL  ${id%.np*} (NP=${id##*.np}), exit $rc"; tail -8 "$tmp/pool/$id.out" | sed 's/^/      | /'
        fi
    done <"$tmp/d.list"
    fig="$np_ of $((np_ + nf)) runs pass"
    [ $skipped_np -gt 0 ] && fig="$fig; $skipped_np skipped (more than MAX_NP=$max_np ranks)"
    [ $nl -gt 0 ] && fig="$fig; $nl not run (the time budget, GPU_CHECK_SECONDS=$budget, was spent)"
    [ -n "$skipped_fp8" ] && fig="$fig; skipped:$skipped_fp8 (float8 GEMM needs compute capability 8.9, this GPU has $cc)"
    [ $nf -eq 0 ] && [ $np_ -gt 0 ] && r=pass || r=FAIL
    record "d unit tests (COMM=mpi, <= $max_np ranks)" $r $(( $(date +%s) - t0 )) "$fig"
elif [ -z "$built" ]; then not_built "d unit tests (COMM=mpi, <= $max_np ranks)"; fi

# ---------------------------------------------------------------- g: determinism
t0=$(date +%s)
section "g determinism"
if [ "$max_np" -ge 4 ]; then g_np=4; g_mesh="--dp-shard 2 --tp 2"
elif [ "$max_np" -ge 2 ]; then g_np=2; g_mesh="--tp 2"
else g_np=1; g_mesh=""; fi
g_flags="$g_mesh --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 5 --eval-every 0"
g_title="g determinism (08 x2 --dump, NP=$g_np, cmp)"
if [ -n "$built" ] && ! out_of_time "$g_title" 40; then
    ok=yes
    for k in 1 2; do
        echo "COMM=mpi mpirun -np $g_np $root/$backend/08 $g_flags --dump DIR$k" >>"$log"
        COMM=mpi timeout "$(cap 120)" $mpirun_base -np $g_np "$root/$backend/08" $g_flags --dump "$tmp/dump$k" --out "$tmp/g$k" \
            </dev/null >"$tmp/g$k.txt" 2>&1 || { ok=""; echo "run $k: exit $?" >>"$log"; }
        tail -3 "$tmp/g$k.txt" >>"$log"
    done
    differ=""; nfiles=0
    if [ -n "$ok" ] && [ -f "$tmp/dump1/losses.txt" ]; then
        for f in "$tmp"/dump1/*; do
            nfiles=$((nfiles + 1))
            cmp "$f" "$tmp/dump2/$(basename "$f")" >>"$log" 2>&1 || differ="$differ $(basename "$f")"
        done
    fi
    if [ -n "$ok" ] && [ $nfiles -gt 0 ] && [ -z "$differ" ]; then
        record "$g_title" pass $(( $(date +%s) - t0 )) "$g_mesh, 5 steps: the $nfiles files (losses.txt, grads_1, init, batches) identical bit for bit; last loss $(tail -1 "$tmp/dump1/losses.txt" | awk '{print $2}')"
    elif [ -z "$ok" ]; then
        record "$g_title" FAIL $(( $(date +%s) - t0 )) "a run failed: $(grep -h -m1 -E '^error' "$tmp"/g[12].txt | head -1)"
        tail -5 "$tmp/g1.txt" | sed 's/^/      | /'
    else
        record "$g_title" FAIL $(( $(date +%s) - t0 )) "the two runs differ in:$differ (losses: $(paste -d' ' "$tmp/dump1/losses.txt" "$tmp/dump2/losses.txt" 2>/dev/null | awk '$2 != $5 {print "step " $1 " " $2 " vs " $5; exit}'))"
    fi
elif [ -z "$built" ]; then not_built "$g_title"; fi

# ---------------------------------------------------------------- h: throughput
t0=$(date +%s)
section "h throughput"
. tools/bench_lib.sh   # steady_step_ms
if [ "$backend" = cuda ]; then
    # bench-baseline's size (tools/bench_baseline.sh), and a larger model for the trainer
    D=512 L=4 H=8 F=1408 V=256 T=256 B=8
    big="--dim 1024 --n-layers 8 --n-heads 16 --n-kv-heads 8 --ffn-dim 2816 --seq-len 512 --batch 16"
else D=64 L=2 H=4 F=128 V=256 T=32 B=4; big="--dim 64 --n-layers 2 --seq-len 64 --batch 8"; fi
# The mean of chapter 08's step lines after the first ("step    4 | loss ... | 7261 tok/s | 35.3 ms
# | MFU 15.0% | mem 11.40 MiB"): ms/step, tokens/s and MFU.
trainer_steps_summary() {
    awk -F'|' '/^step +[0-9]+ \|/ && $1 !~ /^step +1 / {
                for (i = 1; i <= NF; i++) { if ($i ~ /tok\/s/) { split($i, a, " "); tok += a[1] }
                                            if ($i ~ /MFU/) { split($i, a, " "); sub("%", "", a[2]); mfu += a[2] }
                                            if ($i ~ / ms *$/) { split($i, a, " "); ms += a[1] } }
                n++ }
             END { if (n) printf "%.1f ms/step, %.0f tokens/s, MFU %.1f%%", ms / n, tok / n, mfu / n }' "$1"
}
h_title="h throughput (1 rank: 01 bench size, 08 larger)"
if [ -n "$built" ] && ! out_of_time "$h_title" 60; then
    hfig=""; hok=yes
    COMM=mpi timeout "$(cap 120)" $mpirun_base -np 1 "$root/$backend/01" --dim $D --n-layers $L --n-heads $H --n-kv-heads $H \
        --ffn-dim $F --vocab $V --seq-len $T --batch $B --steps 6 --out "$tmp/h1" </dev/null >"$tmp/h1.txt" 2>&1 || hok=""
    cat "$tmp/h1.txt" >>"$log"
    ms=$(steady_step_ms <"$tmp/h1.txt" 2>/dev/null)
    if [ -n "$hok" ] && [ -n "$ms" ]; then
        # model FLOPs of a step, as bench_baseline.sh counts them: (6 N + 6 L T D) per token
        hfig=$(awk -v D=$D -v L=$L -v F=$F -v V=$V -v T=$T -v B=$B -v ms="$ms" -v peak="$peak" 'BEGIN {
            N = L * (4 * D * D + 3 * D * F + 2 * D) + D + V * D; f = (6 * N + 6 * L * T * D) * B * T
            printf "01 (dim %d, %d layers, seq %d, batch %d): %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s", D, L, T, B, ms, B * T / ms * 1e3, f / ms / 1e9
            if (peak > 0) printf ", MFU %.1f%%", 100 * f / ms / 1e9 / peak }')
    else hfig="01: failed"; hok=""; fi
    peak_flag=""; [ "$(awk -v p="$peak" 'BEGIN {print (p > 0)}')" = 1 ] && peak_flag="--peak-tflops $peak"
    # (--dtype fp32 against the fp32 peak computed above; 08's default on CUDA is bf16, below)
    COMM=mpi timeout "$(cap 120)" $mpirun_base -np 1 "$root/$backend/08" $big --dtype fp32 --steps 8 --eval-every 0 $peak_flag --out "$tmp/h8" \
        </dev/null >"$tmp/h8.txt" 2>&1 || hok=""
    cat "$tmp/h8.txt" >>"$log"
    f8=$(trainer_steps_summary "$tmp/h8.txt")
    if [ -n "$f8" ]; then hfig="$hfig; 08 (${big//--/}): $f8"; else hfig="$hfig; 08: failed"; hok=""; fi
    [ "$peak_flag" ] && hfig="$hfig (against $peak TFLOP/s fp32)"
    # 08's default on CUDA, bf16 (tensor cores), MFU against the datasheet's bf16 peak where the
    # trainer knows the GPU (else its GEMM probe): the line it prints says which
    COMM=mpi timeout "$(cap 120)" $mpirun_base -np 1 "$root/$backend/08" $big --steps 8 --eval-every 0 --out "$tmp/h8b" \
        </dev/null >"$tmp/h8b.txt" 2>&1 || hok=""
    cat "$tmp/h8b.txt" >>"$log"
    f8b=$(trainer_steps_summary "$tmp/h8b.txt")
    against=$(sed -n 's/^MFU against \([^,]*\).*/\1/p' "$tmp/h8b.txt" | head -1)
    if [ -n "$f8b" ]; then hfig="$hfig; 08 bf16 (its CUDA default): $f8b (against $against)"; else hfig="$hfig; 08 bf16: failed"; hok=""; fi
    if [ -n "$hok" ]; then record "$h_title" pass $(( $(date +%s) - t0 )) "$hfig"
    else record "$h_title" FAIL $(( $(date +%s) - t0 )) "$hfig"; tail -5 "$tmp/h8.txt" | sed 's/^/      | /'; fi
elif [ -z "$built" ]; then not_built "$h_title"; fi

# ---------------------------------------------------------------- e: chapter checks
t0=$(date +%s)
section "e chapter checks"
if [ -n "$built" ] && ! out_of_time "e chapter checks (COMM=mpi, <= $max_np ranks)" 40; then
    : >"$tmp/e.list"; skipped_ch=""
    # one job per layout, the chapters taken in turns (each chapter's first layout, then each
    # one's second, ...): a budget that runs out leaves every chapter tried, not four done and
    # four untouched (the first H100 run: 5 to 20 s a layout, 01, 02, 04 and 08 never reached)
    chapters=""
    for checks in [0-9][0-9]_*/checks.txt; do
        nn=$(basename "$(dirname "$checks")" | cut -c1-2)
        if [ "$nn" = 07 ] && [ -z "$fp8_ok" ]; then
            skipped_ch="chapter 07 skipped: float8 needs compute capability 8.9, this GPU has $cc"
            echo "  $skipped_ch"; continue
        fi
        awk -v m="$max_np" '$1 ~ /^[0-9]+$/ && $1 <= m {print NR}' "$checks" >"$tmp/lines_$nn"
        chapters="$chapters $nn"
    done
    turn=1
    while :; do
        added=0
        for nn in $chapters; do
            line=$(sed -n "${turn}p" "$tmp/lines_$nn")
            [ -n "$line" ] || continue
            printf '%s\t%s\n' "check-$nn.$line" "COMM=mpi MAX_NP=$max_np CHECKS_LINES=$line CHECKS_DEADLINE=$((deadline - 10)) MPIRUN_BASE='$mpirun_base' timeout @LEFT@ tests/run_checks.sh $backend $nn $root" >>"$tmp/e.list"
            added=1
        done
        [ $added = 1 ] || break
        turn=$((turn + 1))
    done
    pool "$tmp/e.list"
    cp_=0; cf=0; cs=0; cl=0; bad=""
    while IFS=$'\t' read -r id cmd; do
        o=$tmp/pool/$id.out; rc=$(cat "$tmp/pool/$id.rc"); ch=${id%.*}
        echo "-- $id: exit $rc" >>"$log"; cat "$o" >>"$log"
        if [ "$rc" = skip ]; then cl=$((cl + 1)); continue; fi   # not started: the budget was spent
        if grep -q '^ok ' "$o"; then cp_=$((cp_ + 1))
        elif grep -q '^FAIL ' "$o"; then cf=$((cf + 1)); [[ " $bad " == *" $ch "* ]] || bad="$bad $ch"; grep -A12 '^FAIL' "$o" | head -40
        else cl=$((cl + 1)); fi   # cut short by the deadline, or it printed nothing
    done <"$tmp/e.list"
    cs=$(for nn in $chapters; do awk -v m="$max_np" '$1 ~ /^[0-9]+$/ && $1 > m' "$(ls -d ${nn}_*/)checks.txt"; done | wc -l)
    fig="$cp_ layouts pass, $cf fail; $cs skipped (more than MAX_NP=$max_np ranks)"
    [ $cl -gt 0 ] && fig="$fig; $cl not run or cut short (the time budget, GPU_CHECK_SECONDS=$budget, was spent)"
    [ -n "$bad" ] && fig="$fig; failing:$bad"
    [ -n "$skipped_ch" ] && fig="$fig; $skipped_ch"
    [ $cf -eq 0 ] && [ $cp_ -gt 0 ] && r=pass || r=FAIL
    record "e chapter checks (COMM=mpi, <= $max_np ranks)" $r $(( $(date +%s) - t0 )) "$fig"
elif [ -z "$built" ]; then not_built "e chapter checks (COMM=mpi, <= $max_np ranks)"; fi

# ---------------------------------------------------------------- the verdict
total=$(( $(date +%s) - t_begin ))
npass=0; nfail=0; nskip=0
for r in "${results[@]}"; do case "$r" in pass) npass=$((npass + 1)) ;; skip) nskip=$((nskip + 1)) ;; *) nfail=$((nfail + 1)) ;; esac; done
verdict="gpu-check: $npass of ${#results[@]} parts pass, $nfail fail${nskip:+, $nskip skipped for time} in $total s (budget $budget s); summary $out, every part's output $log"
[ "$nskip" -eq 0 ] && verdict=${verdict/, 0 skipped for time/}
final=" in all"
write_summary
{ echo; echo "$verdict"; } >>"$out"
echo
echo "$verdict"
[ "$nfail" -eq 0 ]
