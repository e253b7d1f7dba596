#!/usr/bin/env bash
# t_deps.sh: OpenBLAS is detected by what the build uses, not by "some cblas.h exists".
#   1. with the flags the Makefile uses (tools/blas.sh), the probe compiles, links and runs a
#      program calling openblas_set_num_threads and openblas_get_corename, and deps.sh agrees;
#   2. pointed (BLAS_CFLAGS) at a directory holding only the reference BLAS's cblas.h, the probe
#      fails, deps.sh check names libopenblas-dev as missing (so deps.sh install would install
#      it), and the banner does not claim OpenBLAS;
#   3. the Makefile compiles the BLAS-calling file with exactly those flags and links with them.
set -u
cd "$(dirname "$0")/.."
. tests/check_lib.sh   # n, bad, $tmp and check

# the reference BLAS's cblas.h: Debian's libblas-dev installs it as cblas-netlib.h; without it,
# a stand-in with the same kind of declarations (cblas_* only, no openblas_*)
ref=$tmp/reference; mkdir -p "$ref"
netlib=$(ls /usr/include/*-linux-gnu/cblas-netlib.h 2>/dev/null | head -1)
if [ -n "$netlib" ]; then cp "$netlib" "$ref/cblas.h"; src="$netlib"
else
    src="a stand-in"
    cat >"$ref/cblas.h" <<'EOF'
/* stand-in for the reference BLAS's cblas.h: no openblas_* functions */
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int,
                 float, const float *, int, const float *, int, float, float *, int);
EOF
fi

# 1. the real flags
check "probe with the build's flags ($(tools/blas.sh cflags) $(tools/blas.sh libs))" tools/blas.sh probe
cp "$tmp/out.txt" "$tmp/probe.txt"
check "probe names OpenBLAS and its core" grep -q "OpenBLAS.*(core " "$tmp/probe.txt"
tools/blas.sh probe >/dev/null 2>&1 && check "deps.sh does not ask for libopenblas-dev" \
    bash -c '! tools/deps.sh check core | grep -q libopenblas-dev'
check "banner names OpenBLAS" bash -c 'tools/banner.sh cpu "" | grep -q "BLAS *OpenBLAS"'

# 2. only the reference cblas.h visible
check "probe fails with only the reference cblas.h ($src)" bash -c "! BLAS_CFLAGS=-I$ref tools/blas.sh probe"
check "... and says why" bash -c "BLAS_CFLAGS=-I$ref tools/blas.sh probe | grep -q \"not OpenBLAS's\""
check "deps.sh check core fails and names libopenblas-dev" \
    bash -c "! BLAS_CFLAGS=-I$ref tools/deps.sh check core > $tmp/d.txt; grep -q libopenblas-dev $tmp/d.txt"
check "deps.sh check all names libopenblas-dev too" \
    bash -c "BLAS_CFLAGS=-I$ref tools/deps.sh check all | grep -q libopenblas-dev"
check "banner does not claim OpenBLAS" \
    bash -c "BLAS_CFLAGS=-I$ref tools/banner.sh cpu '' | grep BLAS | grep -q 'no usable OpenBLAS'"

# 3. the Makefile's compile and link lines carry the same flags
cf=$(tools/blas.sh cflags); lb=$(tools/blas.sh libs)
make -n --no-print-directory BUILD_ROOT="$tmp/b" BACKEND=cpu "$tmp/b/cpu/common/backend/device_cpu.o" \
    "$tmp/b/cpu/tests/test_gemm" >"$tmp/make.txt" 2>&1
check "make compiles device_cpu.c with '$cf'" grep -qF -- "$cf" <(grep device_cpu "$tmp/make.txt")
check "make links with '$lb'" grep -qF -- "$lb" <(grep -- "-o $tmp/b/cpu/tests/test_gemm" "$tmp/make.txt")
make -n --no-print-directory BUILD_ROOT="$tmp/b" BACKEND=cpu BLAS_CFLAGS="-I$ref" \
    "$tmp/b/cpu/common/backend/device_cpu.o" >"$tmp/make2.txt" 2>&1
check "make BLAS_CFLAGS=... overrides the compile flags" grep -qF -- "-I$ref" "$tmp/make2.txt"

# 4. AVX-512 kernels on a CPU OpenBLAS does not recognise: decided from the CPU's flags. The
# detection stands back when the caller set OPENBLAS_CORETYPE, so these checks run without it
# (as on a machine whose environment does not set it), but for the one about that rule.
printf 'flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl\n' >"$tmp/avx512"
printf 'flags\t\t: fpu sse2 avx avx2 fma avx512f\n' >"$tmp/avx512f_only"
clean="env -u OPENBLAS_CORETYPE"
check "coretype: SkylakeX on a CPU with AVX-512" $clean bash -c "[ \"\$(CPUINFO=$tmp/avx512 tools/blas.sh coretype)\" = SkylakeX ]"
check "coretype: nothing without the whole AVX-512 set" $clean bash -c "[ -z \"\$(CPUINFO=$tmp/avx512f_only tools/blas.sh coretype)\" ]"
check "coretype: the user's OPENBLAS_CORETYPE stands" \
    bash -c "[ -z \"\$(OPENBLAS_CORETYPE=Haswell CPUINFO=$tmp/avx512 tools/blas.sh coretype)\" ]"
check "mpirun_base.sh passes OPENBLAS_CORETYPE=SkylakeX to the ranks" \
    $clean bash -c "CPUINFO=$tmp/avx512 tools/mpirun_base.sh | grep -q -- '-x OPENBLAS_CORETYPE=SkylakeX'"
check "make's mpirun passes it too" \
    $clean bash -c "CPUINFO=$tmp/avx512 make -n --no-print-directory run-00 2>/dev/null | grep -q -- '-x OPENBLAS_CORETYPE=SkylakeX'"
# the banner says so where OpenBLAS's own choice on this machine is not SkylakeX already (an AMD
# EPYC, which OpenBLAS 0.3.21 takes for Haswell); where it is (an Intel Xeon with AVX-512), the
# runs need nothing and the banner says nothing (tools/banner.sh compares the probe's core)
if $clean tools/blas.sh probe 2>/dev/null | grep -q '(core SkylakeX)'; then
    check "the banner says nothing: OpenBLAS picks SkylakeX on this CPU by itself" \
        $clean bash -c "! CPUINFO=$tmp/avx512 tools/banner.sh cpu '' | grep -q 'runs set OPENBLAS_CORETYPE'"
else
    check "the banner says so" $clean bash -c "CPUINFO=$tmp/avx512 tools/banner.sh cpu '' | grep -q 'runs set OPENBLAS_CORETYPE=SkylakeX'"
fi
check "the banner names a user's OPENBLAS_CORETYPE" \
    bash -c "OPENBLAS_CORETYPE=Haswell CPUINFO=$tmp/avx512 tools/banner.sh cpu '' | grep -q 'OPENBLAS_CORETYPE=Haswell is set in your environment'"

echo "$((n-bad)) of $n OpenBLAS detection checks pass (reference cblas.h: $src)"
[ $bad -eq 0 ]
