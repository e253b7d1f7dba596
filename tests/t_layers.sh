#!/usr/bin/env bash
# t_layers.sh [--self-test]: no dependency points up or sideways. The layers, bottom up:
#
#   common/backend  common/kernels  common/parallel  common/model  common/harness  NN_* chapters
#
# A file may include headers of its own layer or of one below. A chapter may use (include, and
# link through its chapter.mk's LINKS_NN) only the technique files of an EARLIER chapter, never a
# later chapter's and never another chapter's private files (main.c, reports, checks, the
# trainer, ...). Each chapter.mk names its technique in TECHNIQUE_NN (the .c files; a header or a
# CUDA twin with the same stem, X.h, X_cpu.c, X_cuda.cu, is public with it); a technique file
# itself includes only technique files, so a later chapter that links it links nothing private.
# The unit tests stand above every chapter and are not checked (a test may test a private file).
#
# Checked: every `#include "..."` of common/ and of the chapters (resolved as the compiler does:
# the file's own folder first, then common/*/, the -I list), and every LINKS_NN (read by make
# from the chapter.mk files, as the Makefile reads them). Each violation is one line, FILE:LINE,
# what it uses and why that is not allowed; the last line is the summary.
# Without arguments it checks the repository, then runs the self-test: a copy of the sources in a
# temporary folder with five violations planted, each of which must be reported.
set -u
cd "$(dirname "$0")/.."

# check ROOT: the violations under ROOT, one per line; exit 1 if any
check() {
    local root=$1
    # LINKS_NN and TECHNIQUE_NN as make reads them (chapter.mk may use +=, continuation lines)
    make -s --no-print-directory -C "$root" -f - <<'EOF' >"$tmp/lists.txt" || return 2
include $(sort $(wildcard [0-9][0-9]_*/chapter.mk))
nums := $(sort $(foreach c,$(wildcard [0-9][0-9]_*/),$(firstword $(subst _, ,$(c)))))
all:
	@$(foreach n,$(nums),echo "TECHNIQUE $(n) $(TECHNIQUE_$(n))"; echo "LINKS $(n) $(LINKS_$(n))";)
EOF
    python3 - "$root" "$tmp/lists.txt" <<'EOF'
import glob, os, re, sys
root, lists = sys.argv[1], sys.argv[2]
os.chdir(root)
LAYERS = ["backend", "kernels", "parallel", "model", "harness"]   # bottom up; chapters above
INCLUDE_DIRS = sorted(glob.glob("common/*/"))                       # the Makefile's -I list, in its order

def stem(path):    # float8_linear_cpu.c, float8_linear.h -> float8_linear
    return re.sub(r"_(cpu|cuda)$", "", os.path.splitext(os.path.basename(path))[0])

technique, links = {}, {}
for line in open(lists):
    what, nn, *files = line.split()
    if what == "TECHNIQUE": technique[nn] = {stem(f) for f in files}
    else: links[nn] = files

def place(path):   # ("common", layer index) or ("chapter", "NN"); None outside both
    parts = path.split("/")
    if parts[0] == "common" and len(parts) == 3 and parts[1] in LAYERS: return ("common", LAYERS.index(parts[1]))
    m = re.match(r"(\d\d)_", parts[0])
    return ("chapter", m.group(1)) if m and len(parts) == 2 else None

def describe(p):
    return "common/" + LAYERS[p[1]] if p[0] == "common" else "chapter " + p[1]

def public(path):
    p = place(path)
    return p and p[0] == "chapter" and stem(path) in technique.get(p[1], ())

def why_not(user, used):
    """Why the file `user` may not use the file `used`, or None if it may."""
    a, b = place(user), place(used)
    if b is None: return "outside common/ and the chapters"
    if a[0] == "common":
        if b[0] == "chapter": return "upward: common/ never uses a chapter"
        if b[1] > a[1]: return "upward: %s may use %s only" % (describe(a), ", ".join("common/" + l for l in LAYERS[:a[1] + 1]))
        return None
    if b[0] == "common" or a[1] == b[1]:
        if b[0] == "chapter" and public(user) and not public(used):
            return "a technique file of chapter %s uses the chapter's private %s (a later chapter linking it would need it)" % (a[1], os.path.basename(used))
        return None
    if b[1] > a[1]: return "sideways: chapter %s uses a later chapter (%s)" % (a[1], b[1])
    if not public(used):
        return "sideways: %s is private to chapter %s (its technique, TECHNIQUE_%s: %s)" % (
            os.path.basename(used), b[1], b[1], ", ".join(sorted(technique.get(b[1], ()))) or "none")
    return None

violations, n_includes, n_links = [], 0, 0
sources = sorted(glob.glob("common/*/*.[ch]") + glob.glob("common/*/*.cu") +
                 glob.glob("[0-9][0-9]_*/*.[ch]") + glob.glob("[0-9][0-9]_*/*.cu"))
for src in sources:
    for lineno, line in enumerate(open(src, encoding="utf-8", errors="replace"), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m: continue
        n_includes += 1
        name = m.group(1)
        candidates = [os.path.join(os.path.dirname(src), name)] + [d + name for d in INCLUDE_DIRS]
        found = next((os.path.normpath(c) for c in candidates if os.path.isfile(c)), None)
        reason = why_not(src, found) if found else "no such file in the tree"
        if reason: violations.append('%s:%d: includes "%s" (%s): %s' % (src, lineno, name, found or "?", reason))
for nn, files in sorted(links.items()):
    mk = glob.glob(nn + "_*/chapter.mk")[0]
    for f in files:
        n_links += 1
        reason = why_not(mk, f) if os.path.isfile(f) else "no such file"
        if reason: violations.append("%s: LINKS_%s links %s: %s" % (mk, nn, f, reason))
for v in violations: print(v)
print("%d includes and %d links checked: %d upward or sideways" % (n_includes, n_links, len(violations)))
sys.exit(1 if violations else 0)
EOF
}

# self_test: plant one violation of each kind in a copy of the sources; all must be reported
self_test() {
    local t=$tmp/tree
    mkdir -p "$t"
    for f in common/*/* [0-9][0-9]_*/*.[ch] [0-9][0-9]_*/*.cu [0-9][0-9]_*/chapter.mk; do
        [ -f "$f" ] && mkdir -p "$t/$(dirname "$f")" && cp "$f" "$t/$f"
    done
    echo '#include "run.h"' >>"$t/common/kernels/kernels.h"                                  # upward in common
    echo '#include "../03_sequence_parallel/sequence_parallel.h"' >>"$t/02_loss_parallel/vocab_parallel.c"   # a later chapter
    echo '#include "../02_loss_parallel/loss_report.h"' >>"$t/04_fsdp/main.c"                  # another chapter's private file
    printf 'LINKS_05 += 06_context_parallel/context_parallel.c 04_fsdp/dp_report.c\n' >>"$t/05_pipeline/chapter.mk"
    local want=(
        'common/kernels/kernels.h:[0-9]*: includes "run.h" .*: upward'
        '02_loss_parallel/vocab_parallel.c:[0-9]*: includes .*sequence_parallel.h.*: sideways: chapter 02 uses a later chapter'
        '04_fsdp/main.c:[0-9]*: includes .*loss_report.h.*: sideways: loss_report.h is private to chapter 02'
        'LINKS_05 links 06_context_parallel/context_parallel.c: sideways: chapter 05 uses a later chapter'
        'LINKS_05 links 04_fsdp/dp_report.c: sideways: dp_report.c is private to chapter 04')
    check "$t" >"$tmp/self.txt"
    local rc=$? caught=0 w
    for w in "${want[@]}"; do
        if grep -q -- "$w" "$tmp/self.txt"; then caught=$((caught+1)); else echo "self-test: not reported: $w"; fi
    done
    [ $rc -eq 1 ] || echo "self-test: the check exited $rc with violations planted, want 1"
    echo "self-test: $caught of ${#want[@]} planted violations reported"
    [ $rc -eq 1 ] && [ $caught -eq ${#want[@]} ]
}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ "${1:-}" = --self-test ]; then self_test; exit; fi
check . >"$tmp/repo.txt"; rc=$?
head -n -1 "$tmp/repo.txt"
self_test >"$tmp/st.txt"; st=$?
[ $st -eq 0 ] || head -n -1 "$tmp/st.txt"
echo "$(tail -1 "$tmp/repo.txt"); $(tail -1 "$tmp/st.txt")"
[ $rc -eq 0 ] && [ $st -eq 0 ]
