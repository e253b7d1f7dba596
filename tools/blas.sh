#!/usr/bin/env bash
# blas.sh cflags|libs|probe|coretype: the OpenBLAS the CPU backend is built with, found one way
# for the Makefile, tools/deps.sh and tools/banner.sh alike.
#   cflags  the compiler flags: pkg-config's for openblas, else -I the directory that holds
#           OpenBLAS's own headers (openblas_config.h sits beside its cblas.h), else nothing
#   libs    the linker flags: pkg-config's for openblas, else -lopenblas
#   probe   compile, link and run a tiny program with exactly those flags: it includes
#           <cblas.h>, calls openblas_set_num_threads(1), openblas_get_config() and
#           openblas_get_corename() and one cblas_sgemm. Prints "OpenBLAS 0.3.21 ... (core
#           Haswell)" and exits 0, or prints why not and exits 1.
#   coretype  the OPENBLAS_CORETYPE the runs should set, or nothing: "SkylakeX" on a CPU with
#           AVX-512 (the flags avx512f, avx512cd, avx512bw, avx512dq and avx512vl in /proc/cpuinfo,
#           or in the file CPUINFO names), unless OPENBLAS_CORETYPE is set already. OpenBLAS picks
#           its kernels by the CPU's model, and a version older than the CPU (Debian 12's 0.3.21
#           on AMD Zen 4, for one) takes it for an AVX2 machine and runs its Haswell/Zen kernels;
#           the SkylakeX kernels use AVX-512 and made a training step about 1.6x faster there.
#           On CPUs that OpenBLAS already runs with AVX-512 kernels, SkylakeX is the same sgemm.
# BLAS_CFLAGS and BLAS_LIBS in the environment replace what cflags and libs would find (the
# Makefile passes on a `make BLAS_CFLAGS=...`; tests/t_deps.sh points them at a directory that
# holds only the reference BLAS's cblas.h to see the probe fail).
#
# Why not "does some cblas.h compile": Debian's reference BLAS (libblas-dev) also installs a
# cblas.h, at the path the alternatives system points <cblas.h> to, and it has no openblas_*
# functions. OpenBLAS's own cblas.h lives in its own directory; pkg-config names it.
set -u
cflags() {
    if pkg-config --exists openblas 2>/dev/null; then echo $(pkg-config --cflags openblas); return; fi
    local d
    for d in /usr/include/*-linux-gnu/openblas-pthread /usr/include/*-linux-gnu/openblas-openmp \
             /usr/include/*-linux-gnu/openblas-serial /usr/include/openblas /usr/local/include; do
        if [ -f "$d/openblas_config.h" ] && [ -f "$d/cblas.h" ]; then echo "-I$d"; return; fi
    done
    echo ""
}
libs() {
    if pkg-config --exists openblas 2>/dev/null; then echo $(pkg-config --libs openblas); return; fi
    echo "-lopenblas"
}
CF=${BLAS_CFLAGS-$(cflags)}
LB=${BLAS_LIBS-$(libs)}

case "${1:-}" in
coretype)
    [ -n "${OPENBLAS_CORETYPE:-}" ] && exit 0   # the user's choice stands
    flags=$(grep -m1 '^flags' "${CPUINFO:-/proc/cpuinfo}" 2>/dev/null)
    for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
        case " $flags " in *" $f "*) ;; *) exit 0 ;; esac
    done
    echo SkylakeX ;;
cflags) echo "$CF" ;;
libs) echo "$LB" ;;
probe)
    tmp=$(mktemp -d) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    cat >"$tmp/probe.c" <<'EOF'
#include <cblas.h>
#include <stdio.h>
int main(void) {
    openblas_set_num_threads(1);
    float a = 2.0f, b = 3.0f, c = 0.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    printf("%s (core %s)\n", openblas_get_config(), openblas_get_corename());
    return c == 6.0f ? 0 : 1;
}
EOF
    # implicit declarations are errors here as in gcc 14: with the reference cblas.h the
    # openblas_* calls are undeclared, and -lopenblas would otherwise still link them
    # shellcheck disable=SC2086
    if ! cc -std=c11 -Werror=implicit-function-declaration $CF "$tmp/probe.c" -o "$tmp/probe" $LB \
            >"$tmp/cc.txt" 2>&1; then
        if grep -q "openblas_" "$tmp/cc.txt"; then
            echo "the <cblas.h> found with '${CF}' is not OpenBLAS's (no openblas_* functions; the reference BLAS's?)"
        elif grep -q "cblas.h" "$tmp/cc.txt"; then
            echo "no <cblas.h> found with '${CF}'"
        else
            echo "cannot compile and link against OpenBLAS with '${CF} ${LB}': $(grep -m1 -E 'error|cannot find' "$tmp/cc.txt")"
        fi
        exit 1
    fi
    if ! OPENBLAS_NUM_THREADS=1 "$tmp/probe"; then
        echo "a program linked with '${LB}' does not run (or computes 2 x 3 wrong)"
        exit 1
    fi
    ;;
*) echo "usage: $0 cflags|libs|probe|coretype" >&2; exit 2 ;;
esac
