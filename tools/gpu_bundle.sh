#!/usr/bin/env bash
# gpu_bundle.sh: Open MPI and cJSON as Debian packages carried to a GPU machine that has neither
# and no package registry (a CUDA/PyTorch image: nvcc, gcc, glibc, no MPI). `make gpu-bundle`
# runs `download` then `verify` on a machine with Debian 12's registry; `make gpu-check` runs
# `unpack` and `env` on the GPU machine (tests/gpu_check.sh), so what `verify` tests here is the
# code the GPU machine runs.
#
#   download [DIR]      apt-get download the packages below into DIR/debs (default gpu-bundle/,
#                       ignored by git), write DIR/MANIFEST (package versions, the glibc the
#                       libraries need), print the size, then run verify: all of it in a new
#                       folder beside DIR, which replaces DIR only once it has verified (an
#                       existing bundle is never left half-replaced; a failure leaves no trace)
#   verify [DIR]        unpack DIR into a temporary prefix and show that it works without the
#                       system's copy: mpirun -np 2 hostname, and mpicc compiles and links a tiny
#                       MPI + cJSON program that runs on 2 ranks and loads Open MPI's components
#                       from the prefix. As root with unshare(1), in a private mount namespace
#                       where every file of the bundled packages installed on this machine is
#                       hidden; otherwise PATH alone leaves the system's mpicc out. Also checks,
#                       file by file, that every library the bundle's programs and plugins load
#                       is in the bundle or in the base system of any Debian/Ubuntu image with a
#                       C compiler (BASE_PACKAGES).
#   unpack DIR ROOT     dpkg-deb -x every DIR/debs/*.deb into ROOT (ar + tar where dpkg-deb is
#                       missing) and make the links the packages' maintainer scripts would have
#                       made (mpicc -> mpicc.openmpi, ...); does nothing when ROOT already holds
#                       exactly these .deb files
#   env ROOT            the export lines (for eval) that make ROOT's Open MPI and cJSON the ones
#                       the build and mpirun use, relocated (OPAL_PREFIX and friends)
#
# The packages (Debian 12, Open MPI 4.1.4), worked out with apt-cache depends and readelf -d:
#   openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev   mpirun/orterun, mpicc (opal_wrapper),
#       libmpi and its components, the wrapper data, mpi.h. libopenmpi-dev's own Depends (the
#       -dev packages of hwloc, libevent, PMIx, ibverbs; gfortran) are left out: mpicc links
#       -lmpi alone and mpi.h includes nothing of theirs.
#   libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2   what libmpi,
#       libopen-rte, libopen-pal and PMIx need to load at all (libmunge2: PMIx's own dependency).
#   libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
#       libpsm2-2 libpsm-infinipath1 libnuma1   what the network components need (ofi, ucx,
#       openib, psm, psm2, reachable_netlink). Open MPI loads every component of a framework it
#       opens, used or not, and prints "unable to open mca_..." for each that fails to load, on
#       every run: without these, a single-node run printed such lines (verify catches them).
#   libcjson1 libcjson-dev   cJSON.
#   zlib1g zlib1g-dev        zlib (chapter 08's checkpoint checksums link -lz): the runtime comes
#                            too, since the -dev package's libz.so points at its own version.
# Left out: openssh-client (a run on one node needs no ssh: env selects the plm that launches
# locally when there is none), libhwloc-plugins (optional hwloc plugins that pull in X11,
# libxml2, OpenCL), and BASE_PACKAGES below.
set -u
BUNDLE_PACKAGES="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
 libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2
 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
 libpsm2-2 libpsm-infinipath1 libnuma1
 libcjson1 libcjson-dev zlib1g zlib1g-dev"
# what the bundle takes from the system: glibc, gcc's runtime libraries, libudev (hwloc),
# libuuid (psm): in the base of every Debian and Ubuntu image, and gcc's with any C compiler
BASE_PACKAGES="libc6 libgcc-s1 libstdc++6 libudev1 libuuid1 libatomic1"
here=$(cd "$(dirname "$0")" && pwd)

# the multiarch directory the packages use (x86_64-linux-gnu, aarch64-linux-gnu, ...)
triplet() {
    local d
    for d in "$1"/usr/lib/*-linux-gnu*/; do [ -d "$d" ] && { d=${d%/}; echo "${d##*/}"; return; }; done
    echo x86_64-linux-gnu
}

unpack() {
    local dir=$1 root=$2 stamp deb
    ls "$dir"/debs/*.deb >/dev/null 2>&1 || { echo "gpu_bundle: no .deb files in $dir/debs"; return 1; }
    # the .deb files by name and size: unpacked once, again only when they change
    stamp=$(cd "$dir/debs" && ls -l -- *.deb | awk '{print $5, $NF}')
    if [ -f "$root/.unpacked" ] && [ "$(cat "$root/.unpacked")" = "$stamp" ]; then return 0; fi
    rm -rf "$root" && mkdir -p "$root" || { echo "gpu_bundle: cannot create $root"; return 1; }
    for deb in "$dir"/debs/*.deb; do
        if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$deb" "$root" 2>/dev/null || { echo "gpu_bundle: dpkg-deb -x $deb failed"; return 1; }
        else   # a .deb is an ar archive: debian-binary, control.tar.*, data.tar.*
            local data unz
            data=$(ar t "$deb" 2>/dev/null | grep '^data\.tar')
            case "$data" in *.xz) unz="xz -dc" ;; *.gz) unz="gzip -dc" ;; *.zst) unz="zstd -dc" ;; *) unz=cat ;; esac
            [ -n "$data" ] && ar p "$deb" "$data" | $unz | (cd "$root" && tar -x -f - --no-same-owner) ||
                { echo "gpu_bundle: unpacking $deb with ar and tar failed"; return 1; }
        fi
    done
    # update-alternatives, as the maintainer scripts would run it: the plain names
    local f t=$(triplet "$root")
    for f in "$root"/usr/bin/*.openmpi; do
        [ -e "$f" ] && ln -sfn "$(basename "$f")" "${f%.openmpi}"
    done
    for f in "$root"/usr/lib/libpsm1/libpsm_infinipath.so.1.*; do
        [ -e "$f" ] && mkdir -p "$root/usr/lib/$t" && ln -sfn "../libpsm1/$(basename "$f")" "$root/usr/lib/$t/libpsm_infinipath.so.1"
    done
    echo "$stamp" >"$root/.unpacked"
}

env_lines() {
    local root usr t lib
    root=$(cd "$1" && pwd) || return 1
    usr=$root/usr; t=$(triplet "$root")
    lib=$usr/lib/$t
    # libraries: /usr/lib/<triplet> and /lib/<triplet> (Debian 12 keeps libnl there)
    echo "export PATH='$usr/bin':\"\$PATH\""
    echo "export LD_LIBRARY_PATH='$lib:$root/lib/$t'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    # Open MPI finds its components, help files and wrapper data under OPAL_PREFIX; its
    # configuration file (Debian's: the ucx, ofi and openib transports off) under OPAL_SYSCONFDIR
    echo "export OPAL_PREFIX='$usr'"
    echo "export OPAL_SYSCONFDIR='$root/etc/openmpi'"
    # PMIx's plugins: its paths are absolute in Debian's build, only this variable moves them
    echo "export PMIX_MCA_mca_base_component_path='$lib/pmix2/lib/pmix'"
    # mpicc's link line: the prefix's libmpi.so and libcjson.so before any on the system
    echo "export OMPI_LDFLAGS='-L$lib/openmpi/lib -L$lib'"
    # <cjson/cJSON.h> for gcc and for nvcc's host compiler; -lcjson for links outside mpicc
    echo "export C_INCLUDE_PATH='$usr/include'\${C_INCLUDE_PATH:+:\$C_INCLUDE_PATH}"
    echo "export CPLUS_INCLUDE_PATH='$usr/include'\${CPLUS_INCLUDE_PATH:+:\$CPLUS_INCLUDE_PATH}"
    echo "export LIBRARY_PATH='$lib'\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
    # mpirun's default launcher needs ssh or rsh even on one node; without either, the local one
    if ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
        echo "export OMPI_MCA_plm=isolated"
    fi
}

# the highest GLIBC_x.y symbol version any file of ROOT asks for
glibc_needed() {
    find "$1" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 |
        xargs -0 objdump -T 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1
}

# Into a new folder beside DIR, verified there, then put in DIR's place: an existing bundle stays
# whole until the new one is complete (a download that fails, offline say, leaves it as it was),
# and a failed attempt leaves nothing behind, so it can simply be run again.
download() {
    local dir=${1%/} new
    command -v apt-get >/dev/null || { echo "gpu_bundle: apt-get not found: run make gpu-bundle on Debian 12 (bookworm)"; return 2; }
    new=$dir.new.$$
    rm -rf "$new" && mkdir -p "$new/debs" || { echo "gpu_bundle: cannot create $new beside $dir"; return 2; }
    trap 'rm -rf "$new"; echo "gpu_bundle: interrupted; $dir is as it was"; exit 130' INT TERM HUP
    if ! fill "$new" || ! verify "$new"; then
        rm -rf "$new"
        echo "gpu_bundle: no new bundle made; $([ -d "$dir" ] && echo "$dir is as it was" || echo "nothing was written")"
        return 1
    fi
    rm -rf "$new/root"   # (verify unpacks elsewhere; a stale root would only be unpacked again)
    if [ -e "$dir" ]; then
        mv "$dir" "$dir.old.$$" && mv "$new" "$dir" && rm -rf "$dir.old.$$" ||
            { echo "gpu_bundle: could not put $new in place of $dir"; return 1; }
    else
        mv "$new" "$dir" || { echo "gpu_bundle: could not rename $new to $dir"; return 1; }
    fi
    trap - INT TERM HUP
    echo "gpu-bundle: $dir ready"
}

# The packages and their MANIFEST into the empty folder DIR.
fill() {
    local dir=$1
    # apt-get download writes into the current directory; the _apt user may not read it
    if ! (cd "$dir/debs" && apt-get download $BUNDLE_PACKAGES) >"$dir/download.log" 2>&1; then
        echo "gpu_bundle: apt-get download failed (no network, or run apt-get update first?):"
        grep -E '^(E|W):' "$dir/download.log" | grep -v unsandboxed | head -5
        return 1
    fi
    local tmp glibc
    tmp=$(mktemp -d) && unpack "$dir" "$tmp/root" >/dev/null && glibc=$(glibc_needed "$tmp/root")
    rm -rf "$tmp"
    {
        echo "# gpu-bundle: made by tools/gpu_bundle.sh download on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(date -u +%Y-%m-%d)"
        echo "glibc >= ${glibc:-?}"
        (cd "$dir/debs" && for f in *.deb; do dpkg-deb -W --showformat='${Package} ${Version}\n' "$f"; done)
    } >"$dir/MANIFEST"
    local n size
    n=$(ls "$dir"/debs/*.deb | wc -l)
    size=$(du -cb "$dir"/debs/*.deb | tail -1 | cut -f1)
    printf 'gpu-bundle: %d packages, %.1f MiB (the libraries need glibc >= %s)\n' \
        "$n" "$(awk -v s="$size" 'BEGIN {print s / 1048576}')" "${glibc:-?}"
    echo "  $(sed -n '3,$p' "$dir/MANIFEST" | awk '{print $1}' | paste -sd' ')"
    [ "$size" -lt $((32 * 1048576)) ] || { echo "gpu_bundle: the bundle is over 32 MiB: too big to carry"; return 1; }
}

# every DT_NEEDED library of every ELF file under ROOT: in ROOT, or from a package of
# BASE_PACKAGES on this machine. Prints what comes from the system; fails naming anything else.
check_closure() {
    local root=$1 have so f pkg bad=0 from_base=""
    have=$(find "$root" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)
    while read -r so; do
        echo "$have" | grep -qxF "$so" && continue
        pkg=$(dpkg -S "*/$so" 2>/dev/null | grep -v i386 | head -1 | cut -d: -f1)
        if [ -n "$pkg" ] && [[ " $BASE_PACKAGES " == *" $pkg "* ]]; then from_base="$from_base $so"
        else
            f=$(grep -lF "$so" /dev/null $(find "$root" -type f -name '*.so*') 2>/dev/null | head -1)
            echo "  FAIL: $so (package ${pkg:-unknown}) is needed by ${f#$root/} and is neither bundled nor in BASE_PACKAGES"
            bad=1
        fi
    done < <(find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 |
             xargs -0 readelf -d 2>/dev/null | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | sort -u)
    echo "  from the system:$(echo "$from_base" | tr ' ' '\n' | sort -u | paste -sd' ' | sed 's/^/ /')"
    return $bad
}

verify() {
    local dir=$1 tmp root ok=0
    tmp=$(mktemp -d) || return 1
    # (a RETURN trap outlives the function in bash: it removes itself, or it would fire again
    # when download() returns, with tmp out of scope)
    trap 'rm -rf "$tmp"; trap - RETURN' RETURN
    root=$tmp/root
    unpack "$dir" "$root" || return 1
    echo "gpu-bundle verify: unpacked into a temporary prefix, $(du -sm "$root" | cut -f1) MiB"
    check_closure "$root" || ok=1
    cat >"$tmp/probe.c" <<'EOF'
/* a tiny MPI + cJSON program: an all-reduce, a JSON line, and where Open MPI's components came from */
#include <mpi.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, sum = 0, prefix = 0, other = 0, other_pmix = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "r-xp") && (strstr(line, "/mca_") || strstr(line, "/pmix_mca_") || strstr(line, "/libmpi.so"))) {
            if (strstr(line, argv[1])) prefix++;
            else if (strstr(line, "/pmix_mca_")) other_pmix++;
            else other++;
        }
    if (maps) fclose(maps);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", rank);
    cJSON_AddNumberToObject(o, "ranks", size);
    cJSON_AddNumberToObject(o, "sum", sum);
    cJSON_AddNumberToObject(o, "libraries_from_prefix", prefix);
    cJSON_AddNumberToObject(o, "libraries_from_elsewhere", other + other_pmix);
    char *text = cJSON_PrintUnformatted(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
    MPI_Finalize();
    /* argv[2] "strict": PMIx's plugins too (with the system's copy visible, its PMIx
     * configuration file names its own plugin folder, which wins) */
    return other != 0 || (argc > 2 && strcmp(argv[2], "strict") == 0 && other_pmix != 0);
}
EOF
    cat >"$tmp/run.sh" <<EOF
set -u
eval "\$(bash '$here/gpu_bundle.sh' env '$root')"
cd '$tmp'
fail=0
check() { local what=\$1; shift; if "\$@" >out.txt 2>err.txt && [ ! -s err.txt ]; then echo "  ok    \$what"; sed 's/^/        /' out.txt | head -4
          else echo "  FAIL  \$what"; sed 's/^/        | /' out.txt err.txt | head -12; fail=1; fi; }
root_flag=""; [ "\$(id -u)" = 0 ] && root_flag=--allow-run-as-root
strict=\${1:-}; what="Open MPI's components"; [ "\$strict" = strict ] && what="every component (Open MPI's, PMIx's)"
check "mpicc and mpirun are the prefix's" bash -c '[ "\$(command -v mpicc)" = "$root/usr/bin/mpicc" ] && [ "\$(command -v mpirun)" = "$root/usr/bin/mpirun" ] && echo "\$(command -v mpicc)" && echo "\$(command -v mpirun)"'
check "mpicc --showme names the prefix (OPAL_PREFIX honoured)" bash -c 'mpicc --showme | grep -F "$root/usr/lib" && mpirun --version | head -1'
check "mpirun -np 2 hostname" mpirun \$root_flag -np 2 hostname
check "mpicc compiles and links an MPI + cJSON program" mpicc probe.c -o probe -lcjson
check "it runs on 2 ranks, \$what from the prefix, nothing on stderr" mpirun \$root_flag -np 2 ./probe "$root/" \$strict
exit \$fail
EOF
    if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
        echo "  the system's copy hidden: a private mount namespace (unshare -m) with every installed file of the bundled packages emptied"
        # an empty tmpfs over the directories only these packages fill, an empty file over
        # each of their other files; /usr/bin/mpicc then runs nothing
        cat >"$tmp/hide.sh" <<EOF
: >'$tmp/empty'
t=\$(gcc -print-multiarch 2>/dev/null); t=\${t:-x86_64-linux-gnu}
for d in /usr/lib/\$t/openmpi /usr/lib/\$t/pmix2 /usr/lib/\$t/ucx /usr/lib/\$t/libfabric /usr/lib/\$t/libibverbs \
         /usr/share/openmpi /etc/openmpi /usr/include/cjson /usr/lib/libpsm1; do
    [ -d "\$d" ] && mount -t tmpfs none "\$d"
done
dpkg -L $(echo $BUNDLE_PACKAGES) 2>/dev/null | sort -u | while read -r f; do
    [ -f "\$f" ] && [ ! -L "\$f" ] && mount --bind '$tmp/empty' "\$f" 2>/dev/null
done
if /usr/bin/mpicc --version >/dev/null 2>&1; then echo "  FAIL  /usr/bin/mpicc still runs"; exit 1; fi
echo "  ok    /usr/bin/mpicc no longer runs"
exec env -i HOME="\$HOME" PATH=/usr/bin:/bin TMPDIR=/tmp bash '$tmp/run.sh' strict
EOF
        unshare -m bash "$tmp/hide.sh" || ok=1
    else
        echo "  (not root or no unshare: the system's mpicc is left out of PATH only; its libraries stay visible)"
        mkdir -p "$tmp/bin"
        for c in bash sh gcc cc as ld hostname grep sed head cat id; do
            [ -x "$(command -v $c)" ] && ln -s "$(command -v $c)" "$tmp/bin/$c"
        done
        env -i HOME="$HOME" PATH="$tmp/bin" bash "$tmp/run.sh" || ok=1
    fi
    [ $ok = 0 ] && echo "gpu-bundle verify: ok" || echo "gpu-bundle verify: FAILED"
    return $ok
}

case "${1:-}" in
download) download "${2:-gpu-bundle}" ;;
verify) verify "${2:-gpu-bundle}" ;;
unpack) [ $# -eq 3 ] || { echo "usage: gpu_bundle.sh unpack DIR ROOT"; exit 2; }; unpack "$2" "$3" ;;
env) [ $# -eq 2 ] || { echo "usage: gpu_bundle.sh env ROOT"; exit 2; }; env_lines "$2" ;;
*) echo "usage: gpu_bundle.sh download [DIR] | verify [DIR] | unpack DIR ROOT | env ROOT"; exit 2 ;;
esac
