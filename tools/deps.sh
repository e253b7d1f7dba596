#!/usr/bin/env bash
# deps.sh check|install [core|all]: the Debian/Ubuntu packages the tutorial needs.
#   check    exit 0 when everything is present, 1 (listing what is missing) otherwise
#   install  apt-get install what is missing (as root, or through sudo)
#   core     what building and running the chapters needs (make, make run-NN)
#   all      also PyTorch, which the test suite uses to re-run the --dump exports (default)
# BACKEND=cuda (the Makefile passes its own) leaves out what only the CPU backend links (oneDNN).
# CUDA and NCCL are not installed here: they come with the CUDA Toolkit (set CUDA_HOME).
set -u
mode=${1:-check}; scope=${2:-all}

# package : how we know it is there
missing=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_header() { echo "#include <$1>" | cc -E -x c - >/dev/null 2>&1; }
have_cmd mpicc && have_cmd mpirun        || missing+=(openmpi-bin libopenmpi-dev)
# OpenBLAS by what the build uses: tools/blas.sh compiles, links and runs a program calling
# openblas_* with the Makefile's BLAS flags. "Some cblas.h compiles" is not enough: the reference
# BLAS (libblas-dev) has a cblas.h without them. BLAS_CFLAGS/BLAS_LIBS override the flags.
"$(dirname "$0")/blas.sh" probe >/dev/null 2>&1 || missing+=(libopenblas-dev)
have_header cjson/cJSON.h                || missing+=(libcjson-dev)
# oneDNN 2.x: the bf16 GEMMs of the CPU backend (gemm_cpu.c); the CUDA build does not link it
if [ "${BACKEND:-cpu}" = cpu ]; then
    have_header oneapi/dnnl/dnnl.h       || missing+=(libdnnl-dev)
fi
have_header zlib.h                       || missing+=(zlib1g-dev)   # crc32: chapter 08's checkpoints
have_cmd gnuplot                         || missing+=(gnuplot-nox)
have_cmd make && have_cmd cc             || missing+=(build-essential)
# the outside check of the dumps: PyTorch reruns the exported steps (tests/reference_torch.py)
if [ "$scope" = all ]; then
    /usr/bin/python3 -c "import torch, numpy" >/dev/null 2>&1 || missing+=(python3-torch python3-numpy)
fi

if [ ${#missing[@]} -eq 0 ]; then
    [ "$mode" = install ] && echo "deps: everything is installed"
    exit 0
fi
if [ "$mode" = check ]; then
    echo "deps: missing ${missing[*]}"
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1; then sudo="sudo"
else
    echo "deps: please install as root: apt-get install ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: no apt-get here; install the equivalents of: ${missing[*]}" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
echo "deps: installed ${missing[*]}"
# what was installed must now be what the build finds
if ! why=$("$(dirname "$0")/blas.sh" probe 2>&1); then
    echo "deps: OpenBLAS is installed but the build cannot use it: $why" >&2
    echo "deps: set BLAS_CFLAGS to -I the directory of OpenBLAS's cblas.h (make BLAS_CFLAGS=-I...)" >&2
    exit 1
fi
