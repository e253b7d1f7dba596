#!/usr/bin/env bash
# t_gpu_setup.sh: what the build decides about a GPU, and what a CUDA binary says on a machine that
# cannot run it, checked without a GPU.
#   1. The Makefile's default BACKEND and the reason on the banner's first line, with fake
#      nvidia-smi and nvcc first on PATH (nothing is built: the banner target only): no GPU -> cpu;
#      GPU + driver 580.65.06 + nvcc -> cuda; GPU + driver 550.54 + nvcc -> cpu, naming the driver;
#      GPU + new driver without nvcc (CUDA_HOME an empty folder, so that a real
#      /usr/local/cuda/bin/nvcc does not count) -> cpu, naming nvcc; a BACKEND given is kept; and
#      BACKEND=cuda without nvcc stops with one line and status 2 before anything is compiled.
#   2. Chapter 00's CUDA binary ($BUILD_ROOT/cuda/00, built if missing) under mpirun on a machine
#      without a usable driver: status 2 and exactly one line, "error: ..." naming the driver, on
#      1 rank and on 2. Skipped without nvcc, or where a driver able to run it is installed.
#   3. The binary holds machine code for sm_75, sm_80 and sm_90 and the PTX of compute_90
#      (cuobjdump --list-elf / --list-ptx; where the toolkit has no cuobjdump, the same list read
#      from the fatbinary's entry headers).
set -u
cd "$(dirname "$0")/.."
# the settings of a make that runs this test (make test BACKEND=...) must not reach the makes below
unset MAKEFLAGS MFLAGS MAKELEVEL
. tests/check_lib.sh   # n, bad, $tmp and check
skips=""
skip() { echo "skip: $1"; skips="$skips; skipped: $1"; }

# ---- 1. the default backend, with fake nvidia-smi and nvcc
fake=$tmp/bin; mkdir -p "$fake" "$tmp/empty" "$tmp/b"
# nvidia-smi: two GPUs when FAKE_DRIVER is set (the driver version once per GPU, as the real one
# prints it), else what it prints where the driver is not loaded
cat >"$fake/nvidia-smi" <<'EOF'
#!/bin/sh
if [ -z "${FAKE_DRIVER:-}" ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9
fi
case "$*" in
*-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
      echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000001)" ;;
*driver_version*) echo "$FAKE_DRIVER"; echo "$FAKE_DRIVER" ;;
*) exit 2 ;;
esac
EOF
cat >"$fake/nvcc" <<'EOF'
#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release 13.0, V13.0.88"
EOF
chmod +x "$fake/nvidia-smi" "$fake/nvcc"
# banner_is "what" "expected first line" [env arguments: -u NAME first, then NAME=VALUE]: the
# first line of the banner that make prints under them
banner_is() {
    local what=$1 want=$2; shift 2
    check "$what: banner says '$want'" bash -c '
        want=$1; shift
        first=$(env "$@" PATH="'"$fake"':$PATH" make -s --no-print-directory BUILD_ROOT="'"$tmp/b"'" banner | sed -n 1p)
        echo "first line: $first"; [ "$first" = "$want" ]' _ "$want" "$@"
}
banner_is "no driver" "== build: backend cpu (no GPU visible)" -u FAKE_DRIVER -u BACKEND -u CUDA_HOME
banner_is "GPU, driver 580.65.06, nvcc" "== build: backend cuda (GPU, nvcc and driver 580.65.06 found)" \
    -u BACKEND -u CUDA_HOME FAKE_DRIVER=580.65.06
banner_is "GPU, driver 550.54.15, nvcc" \
    "== build: backend cpu (GPU found but driver 550.54.15 < 580 (CUDA 13 needs >= 580))" \
    -u BACKEND -u CUDA_HOME FAKE_DRIVER=550.54.15
banner_is "GPU, driver 580.65.06, no nvcc" "== build: backend cpu (GPU found but nvcc missing (set CUDA_HOME))" \
    -u BACKEND FAKE_DRIVER=580.65.06 CUDA_HOME="$tmp/empty"
banner_is "BACKEND=cpu given beside a usable GPU" "== build: backend cpu (BACKEND=cpu given)" \
    -u CUDA_HOME FAKE_DRIVER=580.65.06 BACKEND=cpu
banner_is "BACKEND=cuda given beside an old driver" "== build: backend cuda (BACKEND=cuda given)" \
    -u CUDA_HOME FAKE_DRIVER=550.54.15 BACKEND=cuda
# NCCL: next to nvcc ($fake/../include, here $tmp/include), else Debian's /usr/include/nccl.h
if [ -f /usr/include/nccl.h ]; then sys_nccl="NCCL .* (/usr/include/nccl.h)"; else sys_nccl="NCCL *missing"; fi
check "banner without nccl.h next to nvcc: '$sys_nccl'" bash -c \
    "tools/banner.sh cuda '$fake/nvcc' | tee /dev/stderr | grep -q '$sys_nccl'"
mkdir -p "$tmp/include"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n' >"$tmp/include/nccl.h"
check "banner with nccl.h next to nvcc names its version and path" bash -c \
    "tools/banner.sh cuda '$fake/nvcc' | tee /dev/stderr | grep -qF 'NCCL     2.27.3 ($tmp/include/nccl.h)'"
# what `make` would build: the cuda build only where the default is cuda
check "GPU, driver 580.65.06, nvcc: make builds into cuda/" bash -c \
    "env -u BACKEND -u CUDA_HOME PATH='$fake':\$PATH FAKE_DRIVER=580.65.06 make -n --no-print-directory BUILD_ROOT='$tmp/b' | grep -q -- '-o $tmp/b/cuda/00'"
check "GPU, driver 550.54.15, nvcc: make builds into cpu/" bash -c \
    "env -u BACKEND -u CUDA_HOME PATH='$fake':\$PATH FAKE_DRIVER=550.54.15 make -n --no-print-directory BUILD_ROOT='$tmp/b' | grep -q -- '-o $tmp/b/cpu/00'"
# BACKEND=cuda without nvcc: one line, status 2, nothing compiled
env -u BACKEND make --no-print-directory BUILD_ROOT="$tmp/b" BACKEND=cuda CUDA_HOME="$tmp/empty" >"$tmp/nonvcc.txt" 2>&1
st=$?
check "BACKEND=cuda without nvcc: status 2 (got $st)" [ "$st" = 2 ]
check "... one line naming nvcc and CUDA_HOME" bash -c \
    "cat '$tmp/nonvcc.txt'; [ \$(wc -l <'$tmp/nonvcc.txt') = 1 ] && grep -q 'BACKEND=cuda needs nvcc.*CUDA_HOME' '$tmp/nonvcc.txt'"
check "... nothing compiled" bash -c "[ -z \"\$(find '$tmp/b' -name '*.o')\" ]"
check "... make help still answers" env -u BACKEND make --no-print-directory BUILD_ROOT="$tmp/b" BACKEND=cuda CUDA_HOME="$tmp/empty" help

# ---- 2. and 3. the CUDA binary of chapter 00
# nvcc and CUDA_HOME as the Makefile finds them (its banner command names nvcc)
eval "args=($(make -n --no-print-directory BUILD_ROOT="$tmp/b" banner | sed -n 's/^\.\/tests\/banner\.sh //p'))"
nvcc=${args[1]:-}
root=${BUILD_ROOT:-build}
bin=$root/cuda/00
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
    skip "the CUDA binary's driver message and architectures (nvcc not found)"
elif ! make --no-print-directory -s BUILD_ROOT="$root" BACKEND=cuda "$bin" >"$tmp/build.txt" 2>&1; then
    n=$((n+1)); bad=$((bad+1))
    echo "FAIL: make BACKEND=cuda $bin"; sed 's/^/  | /' "$tmp/build.txt" | tail -8
else
    # 2. the driver message: what the machine's own driver is decides what to expect
    drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
    if [ -n "$drv" ] && [ "${drv%%.*}" -ge 580 ] 2>/dev/null; then
        skip "the driver message (this machine has a GPU and driver $drv, which can run $bin)"
    else
        mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
        for np in 1 2; do
            timeout 120 $mpirun_base -np $np "$bin" >"$tmp/run$np.txt" 2>&1
            st=$?
            check "$bin on $np rank(s) without a usable driver: status 2 (got $st)" [ "$st" = 2 ]
            check "... exactly one line, 'error:' naming the driver" bash -c \
                "cat '$tmp/run$np.txt'; [ \$(wc -l <'$tmp/run$np.txt') = 1 ] && grep -q '^error: .*driver' '$tmp/run$np.txt'"
        done
        cp "$tmp/run1.txt" "$tmp/message.txt"
        if [ -z "$drv" ] && ! nvidia-smi >/dev/null 2>&1; then
            check "... saying no driver was found and which one is needed" \
                grep -q '^error: no NVIDIA driver found (this build needs CUDA 13\.0: driver >= 580)' "$tmp/message.txt"
        elif [ -n "$drv" ]; then
            check "... naming the CUDA version driver $drv supports" \
                grep -q '^error: the NVIDIA driver supports CUDA [0-9.]*, this build needs 13\.0: install driver >= 580' "$tmp/message.txt"
        fi
    fi

    # 3. the architectures in the binary
    cuda_home=$(dirname "$(dirname "$nvcc")")
    cuobjdump=$cuda_home/bin/cuobjdump
    [ -x "$cuobjdump" ] || cuobjdump=$(command -v cuobjdump || true)
    if [ -n "$cuobjdump" ]; then
        how="cuobjdump"
        "$cuobjdump" --list-elf "$bin" >"$tmp/elf.txt" 2>&1
        "$cuobjdump" --list-ptx "$bin" >"$tmp/ptx.txt" 2>&1
    else
        # no cuobjdump in this toolkit: the fatbinary's own entry headers (section .nv_fatbin: a
        # header with magic 0xba55ed50, then entries of kind 1 = PTX or 2 = ELF, each naming its
        # architecture at byte 28), listed the way cuobjdump names them
        how="the fatbinary's headers (no cuobjdump in $cuda_home/bin)"
        python3 - "$bin" "$tmp/elf.txt" "$tmp/ptx.txt" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
shoff, = struct.unpack_from("<Q", data, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
def section(i):
    name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
    return name, off, size
_, stroff, _ = section(shstrndx)
fatbin = b""
for i in range(shnum):
    name, off, size = section(i)
    if data[stroff + name:data.index(b"\0", stroff + name)] == b".nv_fatbin":
        fatbin = data[off:off + size]
elf, ptx, p = [], [], 0
while p + 16 <= len(fatbin):
    magic, _version, header, size = struct.unpack_from("<IHHQ", fatbin, p)
    if magic != 0xBA55ED50:
        p += 8
        continue
    q, end = p + header, p + header + size
    while q < end:
        kind, _v, eheader, payload = struct.unpack_from("<HHIQ", fatbin, q)
        arch, = struct.unpack_from("<I", fatbin, q + 28)
        (elf if kind == 2 else ptx).append("sm_%d" % arch)
        q += eheader + payload
    p = end
open(sys.argv[2], "w").writelines("ELF file %d: 00.%d.%s.cubin\n" % (i + 1, i + 1, a) for i, a in enumerate(elf))
open(sys.argv[3], "w").writelines("PTX file %d: 00.%d.%s.ptx\n" % (i + 1, i + 1, a) for i, a in enumerate(ptx))
EOF
    fi
    for sm in 75 80 90; do
        check "$bin holds sm_$sm machine code ($how)" bash -c "cat '$tmp/elf.txt'; grep -q 'sm_$sm\.cubin' '$tmp/elf.txt'"
    done
    # cuobjdump names compute_90's PTX "<binary>.<n>.sm_90.ptx"
    check "$bin holds compute_90 PTX ($how)" bash -c "cat '$tmp/ptx.txt'; grep -Eq '(sm|compute)_90\.ptx' '$tmp/ptx.txt'"
    check "... and no PTX of an older architecture" bash -c "! grep -Ev '(sm|compute)_90\.ptx' '$tmp/ptx.txt' | grep -q '\.ptx'"
fi

echo "$((n-bad)) of $n GPU setup checks pass (default backend, driver message, architectures${skips})"
[ $bad -eq 0 ]
