#!/usr/bin/env bash
# banner.sh BACKEND NVCC [WHY]: one short block saying what the build found, and what to install
# for anything missing. WHY is the Makefile's BACKEND_WHY (why this backend: given by the user,
# or what the default found: GPU, nvcc, driver), shown on the first line.
backend=$1; nvcc=$2; why=${3:-}
found() { printf '  %-8s %s\n' "$1" "$2"; }
echo "== build: backend $backend${why:+ ($why)}"
if command -v mpicc >/dev/null; then found MPI "$(mpirun --version 2>/dev/null | head -1)"
else found MPI "missing: apt-get install openmpi-bin libopenmpi-dev (or make deps)"; fi
# the BLAS really used: a probe built with the Makefile's BLAS flags runs and names OpenBLAS's
# version and the kernels it picked for this CPU (tools/blas.sh)
if [ "$backend" = cuda ]; then found BLAS "cuBLAS (CUDA Toolkit)"
elif blas=$("$(dirname "$0")/blas.sh" probe 2>&1); then
    found BLAS "$blas, built with $("$(dirname "$0")/blas.sh" cflags) $("$(dirname "$0")/blas.sh" libs)"
    core=$("$(dirname "$0")/blas.sh" coretype)
    case "$blas" in *"(core $core)"*) core="" ;; esac
    [ -n "$core" ] && found "" "this CPU has AVX-512, which OpenBLAS's choice above does not use: runs set OPENBLAS_CORETYPE=$core (its AVX-512 kernels)"
    [ -n "${OPENBLAS_CORETYPE:-}" ] && found "" "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is set in your environment: the runs keep your choice"
else found BLAS "no usable OpenBLAS: $blas; apt-get install libopenblas-dev (or make deps)"; fi
if [ -n "$nvcc" ] && [ -x "$nvcc" ]; then
    found nvcc "$("$nvcc" --version | tail -1)"
    # NCCL next to nvcc (NVIDIA's own packages, or a tarball in the toolkit), else where Debian's
    # and Ubuntu's libnccl-dev puts it; nvcc and the linker search both places.
    inc=""
    for h in "$(dirname "$(dirname "$nvcc")")/include/nccl.h" /usr/include/nccl.h; do
        [ -f "$h" ] && { inc=$h; break; }
    done
    if [ -n "$inc" ]; then
        v=$(awk '/define NCCL_MAJOR/{a=$3}/define NCCL_MINOR/{b=$3}/define NCCL_PATCH/{c=$3}END{print a"."b"."c}' "$inc")
        found NCCL "$v ($inc)"
    else found NCCL "missing: install NCCL (libnccl-dev) for BACKEND=cuda"; fi
else found nvcc "not found: CPU backend only (install the CUDA Toolkit and set CUDA_HOME for BACKEND=cuda)"; fi
if command -v gnuplot >/dev/null; then found gnuplot "$(gnuplot --version)"
else found gnuplot "missing: apt-get install gnuplot-nox (needed by make plot-NN)"; fi
