#!/usr/bin/env bash
# t_gpu_check.sh: make gpu-check where it cannot run, and the bundle's unpacking, without a GPU
# and without the network (a few seconds):
#   1. make gpu-check on a machine without nvidia-smi prints one line on stdout and nothing on
#      stderr but make's own "Error 2" line, and exits 2 (the script itself: one line, exit 2);
#      the same when nvidia-smi lists no GPU (a stand-in that fails as it does without a driver)
#   2. with a GPU listed (a stand-in nvidia-smi) but no Open MPI and no gpu-bundle/: one line
#      saying what to do, exit 2; with a bundle whose libraries need a newer glibc: one line, 2
#   3. tools/gpu_bundle.sh unpack and env on a tiny fake .deb built with dpkg-deb: the files land
#      under the prefix, the links update-alternatives would make are there, the env lines put
#      the prefix's mpicc first on PATH with OPAL_PREFIX and the library, include and plugin
#      paths pointing into it; a second unpack of the same .deb files does nothing, a changed one
#      unpacks again; without dpkg-deb (ar + tar) the same files land; a broken .deb is refused
#   4. gpu_check.sh itself unpacks a bundle (GPU_BUNDLE) and uses it: a fake bundle with mpicc
#      but no mpirun is unpacked, its env applied, and the run stops with one line naming
#      what is still missing
#   5. make gpu-bundle without a network (apt-get failing) over an existing bundle: it fails,
#      the old bundle's files are all unchanged, and no temporary folder is left
#   6. the whole check on the CPU build (GPU_CHECK_BACKEND=cpu) with a 50 s budget: done in time,
#      the summary in OUT, no part failed (about 50 s)
set -u
cd "$(dirname "$0")/.."
. tests/check_lib.sh   # n, bad, $tmp and check
lines() { grep -c '' "$1"; }   # lines of a file, the last one with or without its newline

# ---------------------------------------------------------------- 1. no GPU
no_smi=""; command -v nvidia-smi >/dev/null 2>&1 && no_smi=$tmp/nowhere/nvidia-smi   # a GPU machine: pretend
NVIDIA_SMI=${no_smi:-nvidia-smi} make --no-print-directory gpu-check >"$tmp/m.out" 2>"$tmp/m.err"; rc=$?
check "make gpu-check without nvidia-smi: exit 2 (got $rc)" [ $rc -eq 2 ]
check "... one line on stdout ($(lines "$tmp/m.out")): $(head -1 "$tmp/m.out")" [ "$(lines "$tmp/m.out")" -eq 1 ]
check "... saying there is no GPU" grep -q '^gpu-check: no GPU here (nvidia-smi not found)' "$tmp/m.out"
check "... stderr holds make's Error 2 line alone" bash -c "[ \$(grep -c '' $tmp/m.err) -eq 1 ] && grep -q 'gpu-check\] Error 2' $tmp/m.err"
NVIDIA_SMI=${no_smi:-nvidia-smi} bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
check "tests/gpu_check.sh alone: exit 2, one line in all ($(lines "$tmp/s.out"))" [ $rc -eq 2 -a "$(lines "$tmp/s.out")" -eq 1 ]

mkdir -p "$tmp/smi"
cat >"$tmp/smi/none" <<'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
EOF
cat >"$tmp/smi/one" <<'EOF'
#!/bin/sh
case "$*" in
-L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
*query-gpu*) echo "NVIDIA H100 80GB HBM3, 580.159.04, 9.0, 81559, 1980" ;;
*) echo "a stand-in nvidia-smi" ;;
esac
EOF
chmod +x "$tmp/smi/none" "$tmp/smi/one"
NVIDIA_SMI=$tmp/smi/none bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
check "nvidia-smi listing no GPU: exit 2, one line ($(head -1 "$tmp/s.out" | cut -c1-80)...)" \
    bash -c "[ $rc -eq 2 ] && [ \$(grep -c '' $tmp/s.out) -eq 1 ] && grep -q 'nvidia-smi lists none' $tmp/s.out"

# ---------------------------------------------------------------- 2. a GPU, no Open MPI
# PATH: the commands gpu_check.sh and gpu_bundle.sh use before the build, without mpicc and mpirun
mkdir -p "$tmp/bin"
for c in bash sh env nproc mktemp rm grep head cut gcc cc as ld cat sed ls awk getconf date dirname \
         basename wc sort tr mkdir ln tail paste dpkg-deb ar tar xz gzip zstd id hostname; do
    p=$(command -v "$c") && ln -sf "$p" "$tmp/bin/$c"
done
nompi="env PATH=$tmp/bin NVIDIA_SMI=$tmp/smi/one"
$nompi GPU_BUNDLE="$tmp/no-bundle" bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
check "a GPU, no Open MPI, no bundle: exit 2 (got $rc), one line ($(lines "$tmp/s.out"))" [ $rc -eq 2 -a "$(lines "$tmp/s.out")" -eq 1 ]
check "... naming Open MPI and make gpu-bundle" grep -q 'Open MPI (mpicc, mpirun) missing.*make gpu-bundle' "$tmp/s.out"

# a fake package: Open MPI's layout in miniature (Debian 12's paths), mpicc a script that says
# which OPAL_PREFIX it sees
fake_deb() {   # fake_deb DIR NAME VERSION [with-mpirun]
    local d=$tmp/pkg-$2
    rm -rf "$d"; mkdir -p "$d/DEBIAN" "$d/usr/bin" "$d/usr/lib/x86_64-linux-gnu/openmpi/lib" \
        "$d/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix" "$d/usr/lib/libpsm1" "$d/lib/x86_64-linux-gnu" \
        "$d/usr/include/cjson" "$d/etc/openmpi"
    printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: t_gpu_check <t@example.org>\nDescription: a fake package\n' \
        "$2" "$3" >"$d/DEBIAN/control"
    printf '#!/bin/sh\necho "fake opal_wrapper %s: OPAL_PREFIX=$OPAL_PREFIX"\n' "$3" >"$d/usr/bin/opal_wrapper"
    chmod +x "$d/usr/bin/opal_wrapper"
    ln -s opal_wrapper "$d/usr/bin/mpicc.openmpi"
    if [ "${4:-}" = with-mpirun ]; then cp "$d/usr/bin/opal_wrapper" "$d/usr/bin/orterun"; ln -s orterun "$d/usr/bin/mpirun.openmpi"; fi
    echo "not a library" >"$d/usr/lib/x86_64-linux-gnu/libmpi.so.40"
    ln -s ../../libmpi.so.40 "$d/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so"
    echo "not a library" >"$d/usr/lib/libpsm1/libpsm_infinipath.so.1.16"
    echo "not a library" >"$d/lib/x86_64-linux-gnu/libnl-3.so.200"
    echo "not a plugin" >"$d/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib.so"
    echo "/* fake */" >"$d/usr/include/cjson/cJSON.h"
    echo "btl = ^openib" >"$d/etc/openmpi/openmpi-mca-params.conf"
    mkdir -p "$1/debs"
    dpkg-deb --root-owner-group -b "$d" "$1/debs/$2_$3_all.deb" >/dev/null
}
fake_deb "$tmp/old-glibc" fake-openmpi 1.0 with-mpirun
printf '# fake\nglibc >= 99.0\n' >"$tmp/old-glibc/MANIFEST"
$nompi GPU_BUNDLE="$tmp/old-glibc" bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
check "a bundle needing glibc 99.0: exit 2 (got $rc), one line naming glibc" \
    bash -c "[ $rc -eq 2 ] && [ \$(grep -c '' $tmp/s.out) -eq 1 ] && grep -q 'need glibc >= 99.0' $tmp/s.out"

# ---------------------------------------------------------------- 3. unpack and env
b=$tmp/bundle; r=$tmp/bundle/root
fake_deb "$b" fake-openmpi 1.0 with-mpirun
check "unpack a fake .deb" bash tools/gpu_bundle.sh unpack "$b" "$r"
check "its files land under the prefix" test -f "$r/usr/include/cjson/cJSON.h" -a -f "$r/lib/x86_64-linux-gnu/libnl-3.so.200" \
    -a -f "$r/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_pcompress_zlib.so"
check "mpicc -> mpicc.openmpi and mpirun -> mpirun.openmpi, as update-alternatives makes them" \
    test "$(readlink "$r/usr/bin/mpicc")" = mpicc.openmpi -a "$(readlink "$r/usr/bin/mpirun")" = mpirun.openmpi -a -x "$r/usr/bin/mpicc"
check "libpsm_infinipath.so.1 -> libpsm1's, as update-alternatives makes it" test -f "$r/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
bash tools/gpu_bundle.sh env "$r" >"$tmp/env.sh"
check "env: mpicc resolves to the prefix and sees OPAL_PREFIX there" bash -c ". $tmp/env.sh; [ \"\$(command -v mpicc)\" = $r/usr/bin/mpicc ] && mpicc | grep -qx 'fake opal_wrapper 1.0: OPAL_PREFIX=$r/usr'"
check "env: LD_LIBRARY_PATH holds /usr/lib/<triplet> and /lib/<triplet> of the prefix" \
    bash -c ". $tmp/env.sh; case \":\$LD_LIBRARY_PATH:\" in *:$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu:*) ;; *) exit 1;; esac"
check "env: OPAL_SYSCONFDIR, PMIx's plugins, OMPI_LDFLAGS, the include and library paths point into the prefix" \
    bash -c ". $tmp/env.sh; [ -f \$OPAL_SYSCONFDIR/openmpi-mca-params.conf ] && [ -f \$PMIX_MCA_mca_base_component_path/pmix_mca_pcompress_zlib.so ] &&
             [ \"\$OMPI_LDFLAGS\" = '-L$r/usr/lib/x86_64-linux-gnu/openmpi/lib -L$r/usr/lib/x86_64-linux-gnu' ] &&
             [ -f \${C_INCLUDE_PATH%%:*}/cjson/cJSON.h ] && [ -f \${CPLUS_INCLUDE_PATH%%:*}/cjson/cJSON.h ] && [ \${LIBRARY_PATH%%:*} = $r/usr/lib/x86_64-linux-gnu ]"
touch "$r/marker"
check "a second unpack of the same .deb files does nothing" bash -c "bash tools/gpu_bundle.sh unpack $b $r && [ -f $r/marker ]"
fake_deb "$b" fake-openmpi 1.0-changed with-mpirun; rm "$b/debs/fake-openmpi_1.0_all.deb"
check "a changed .deb is unpacked again" bash -c "bash tools/gpu_bundle.sh unpack $b $r && [ ! -f $r/marker ] && . <(bash tools/gpu_bundle.sh env $r) && mpicc | grep -q 'opal_wrapper 1.0-changed'"
rm -f "$tmp/bin/dpkg-deb"
check "without dpkg-deb (ar and tar): the same files" bash -c "PATH=$tmp/bin bash tools/gpu_bundle.sh unpack $b $tmp/root2 &&
    diff <(cd $r && find . ! -name .unpacked | sort) <(cd $tmp/root2 && find . ! -name .unpacked | sort)"
mkdir -p "$tmp/broken/debs"; echo "not a deb" >"$tmp/broken/debs/broken_1_all.deb"
bash tools/gpu_bundle.sh unpack "$tmp/broken" "$tmp/root3" >"$tmp/s.out" 2>&1; rc=$?
check "a broken .deb: refused with one line ($(head -1 "$tmp/s.out"))" [ $rc -ne 0 -a "$(lines "$tmp/s.out")" -eq 1 ]
mkdir -p "$tmp/empty"; bash tools/gpu_bundle.sh unpack "$tmp/empty" "$tmp/root4" >"$tmp/s.out" 2>&1; rc=$?
check "... and a bundle without .deb files ($(head -1 "$tmp/s.out"))" [ $rc -ne 0 -a "$(lines "$tmp/s.out")" -eq 1 ]
ln -sf "$(command -v dpkg-deb)" "$tmp/bin/dpkg-deb"

# ---------------------------------------------------------------- 4. gpu_check.sh uses the bundle
fake_deb "$tmp/half" fake-openmpi 1.0   # mpicc, no mpirun
$nompi GPU_BUNDLE="$tmp/half" bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
check "gpu_check.sh unpacks GPU_BUNDLE into its root/ and applies it" test -x "$tmp/half/root/usr/bin/mpicc"
check "... then names what is still missing: exit 2 (got $rc), one line ($(head -1 "$tmp/s.out" | cut -c1-90)...)" \
    bash -c "[ $rc -eq 2 ] && [ \$(grep -c '' $tmp/s.out) -eq 1 ] && grep -q 'still missing after unpacking' $tmp/s.out"

# ---------------------------------------------------------------- 5. make gpu-bundle offline, over a bundle
# apt-get fails as it does without a network: the bundle there stays whole, nothing is left beside it
old=$tmp/kept; fake_deb "$old" fake-openmpi 1.0 with-mpirun; printf '# kept\nglibc >= 2.36\nfake-openmpi 1.0\n' >"$old/MANIFEST"
before=$(cd "$old" && find . -type f | sort | xargs md5sum)
mkdir -p "$tmp/offline"
printf '#!/bin/sh\necho "E: Failed to fetch http://deb.debian.org/debian/pool/main/o/openmpi/openmpi-bin.deb  Temporary failure resolving deb.debian.org"\nexit 100\n' >"$tmp/offline/apt-get"
chmod +x "$tmp/offline/apt-get"
PATH=$tmp/offline:$PATH bash tools/gpu_bundle.sh download "$old" >"$tmp/s.out" 2>&1; rc=$?
check "gpu-bundle offline over an existing bundle: exit 1 (got $rc), saying the bundle is as it was" \
    bash -c "[ $rc -eq 1 ] && grep -q 'apt-get download failed' $tmp/s.out && grep -q 'is as it was' $tmp/s.out"
check "... every file of the old bundle unchanged (debs, MANIFEST)" bash -c "[ \"\$(cd $old && find . -type f | sort | xargs md5sum)\" = '$before' ]"
check "... and no new or old folder left beside it" bash -c "! ls -d $old.new.* $old.old.* 2>/dev/null | grep -q ."

# ---------------------------------------------------------------- 6. the whole check within its budget
# The plumbing of every part on the CPU build (GPU_CHECK_BACKEND=cpu) under the stand-in nvidia-smi,
# with a 50 s budget: it ends in time, writes its summary where OUT says, every part passes or is
# skipped for time, and the chapters' layouts stop being started when the budget is spent.
if command -v mpirun >/dev/null && [ -x "${BUILD_ROOT:-build}/cpu/01" ]; then
    t0=$(date +%s)
    GPU_CHECK_BACKEND=cpu NVIDIA_SMI=$tmp/smi/one GPU_CHECK_SECONDS=50 OUT="$tmp/gc/summary.txt" \
        bash tests/gpu_check.sh >"$tmp/s.out" 2>&1; rc=$?
    secs=$(( $(date +%s) - t0 ))
    check "gpu_check.sh with a 50 s budget: exit 0 (got $rc) in at most 55 s ($secs s)" [ $rc -eq 0 -a $secs -le 55 ]
    check "... its summary in OUT, ending with the verdict" bash -c "tail -1 $tmp/gc/summary.txt | grep -q '^gpu-check: [0-9]* of 8 parts pass, 0 fail'"
    check "... and every part's output beside it (OUT's .log)" test -s "$tmp/gc/summary.log"
    check "... every part there: pass or skipped for time, none failed" \
        bash -c "[ \$(grep -cE '^[a-h]  .* (pass|skip) ' $tmp/gc/summary.txt) -eq 8 ]"
    check "... the NCCL part ran one rank under the emulation, no communicator" \
        grep -q '^f  NCCL.*NP=1 01 PARITY OK (0 groups of 2+ ranks and 0 links)' "$tmp/gc/summary.txt"
else echo "skip: the budgeted run (no mpirun or no CPU build)"; fi

echo "$((n-bad)) of $n gpu-check checks pass (no GPU: one line and exit 2; the bundle unpacked from a fake .deb)"
[ $bad -eq 0 ]
