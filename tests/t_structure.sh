#!/usr/bin/env bash
# t_structure.sh: the shape rules of docs/design.md that a script can hold, read from the headers:
#   - llama_plan (common/model/plan.h) has no member named after a chapter or a technique (`fsdp`,
#     `pipeline`, `float8`, ...) and no state slot (`*_ctx`): each operator carries its own state,
#     and a technique installs operators, it does not get a field;
#   - every operator struct of the plan (`*_ops`) starts with `void *state`, so that a technique
#     that wraps it can call what it wrapped with that operator's own state;
#   - run_options (common/harness/run.h) has no function pointer and no `void *` context: the
#     harness is called by the chapters, it does not call back.
# (No member counts: a cap says nothing about the design, and a new operator such as the
# projection groups must be able to join the plan.)
# `t_structure.sh --self-test` runs the same checks on planted violations and fails if any passes.
set -u
check() {   # check PLAN_H RUN_H: prints one line per violation, returns their count
    python3 - "$1" "$2" <<'EOF'
import re, sys
plan_h, run_h = open(sys.argv[1]).read(), open(sys.argv[2]).read()

def strip_comments(s):
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", s, flags=re.S), flags=re.S)

def body(src, opening, closing):
    """The text between `opening ... {` and its matching `}`."""
    m = re.search(opening, src)
    if not m: return None
    i = src.index("{", m.start()) + 1; depth = 1; j = i
    while depth:
        depth += {"{": 1, "}": -1}.get(src[j], 0); j += 1
    return src[i:j - 1]

def members(text):
    """Top-level member declarations: one per declarator (`int a, b;` counts two)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{(": depth += 1
        if ch in "})": depth -= 1
        if ch == ";" and depth == 0:
            decl = " ".join(cur.split())
            if decl:
                # split the declarators at top-level commas
                parts, d, p = [], 0, ""
                for c in decl:
                    if c in "({[": d += 1
                    if c in ")}]": d -= 1
                    if c == "," and d == 0: parts.append(p); p = ""
                    else: p += c
                parts.append(p)
                out += [decl] * len(parts)
            cur = ""
        else:
            cur += ch
    return out

bad = 0
plan, run = strip_comments(plan_h), strip_comments(run_h)
b = body(plan, r"struct\s+llama_plan\s*\{", "}")
if b is None:
    print("plan.h: struct llama_plan not found"); bad += 1
else:
    technique_words = r"megatron|fsdp|zero|ddp|hsdp|pipeline|pp|cp|context|float8|fp8|async|ring|sp|tp"
    for d in members(b):
        name = re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", d)
        name = name[0] if name else d
        if re.search(r"\b\w+_ctx\b", d):
            print(f"plan.h: llama_plan has a state slot `{d}`: a technique's state travels with its operators"); bad += 1
        elif re.search(r"(^|_)(" + technique_words + r")(_|$)", name):
            print(f"plan.h: llama_plan has a member named after a technique, `{d}`: techniques install operators"); bad += 1
for name in re.findall(r"\}\s*(\w+_ops)\s*;", plan):
    # the body of the typedef that ends with `} name;`
    m = re.search(r"typedef\s+struct\s*\{((?:(?!typedef).)*?)\}\s*" + name + r"\s*;", plan, re.S)
    first = members(m.group(1))[0] if m else ""
    if not re.fullmatch(r"void \*state", first):
        print(f"plan.h: {name} does not start with `void *state` (it starts with `{first}`)"); bad += 1
m = re.search(r"typedef\s+struct\s*\{((?:(?!typedef).)*?)\}\s*run_options\s*;", run, re.S)
if not m:
    print("run.h: run_options not found"); bad += 1
else:
    ms = members(m.group(1))
    for d in sorted(set(ms)):
        if re.search(r"\(\s*\*", d) or re.search(r"\bvoid\s*\*", d):
            print(f"run.h: run_options holds a callback or a context, `{d}`: the harness must not call back into a chapter"); bad += 1
sys.exit(min(bad, 100))
EOF
}

if [ "${1:-}" = --self-test ]; then
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    fails=0
    # each planted violation must be reported
    sed 's/^    plan_stack applied;/    plan_stack applied;\n    void *dp_ctx;/' common/model/plan.h >"$tmp/ctx.h"
    check "$tmp/ctx.h" common/harness/run.h >/dev/null && { echo "self-test: a *_ctx slot passed"; fails=1; }
    sed 's/^    plan_stack applied;/    plan_stack applied;\n    bool fsdp_prefetch;/' common/model/plan.h >"$tmp/named.h"
    check "$tmp/named.h" common/harness/run.h >/dev/null && { echo "self-test: a member named after a technique passed"; fails=1; }
    python3 -c 'import sys; s=open("common/model/plan.h").read(); print(s.replace("typedef struct {\n    void *state;\n    int saved_per_row;", "typedef struct {\n    int saved_per_row;", 1))' >"$tmp/nostate.h"
    check "$tmp/nostate.h" common/harness/run.h >/dev/null && { echo "self-test: an operator without state passed"; fails=1; }
    sed 's/^} run_options;/    void (*after_step)(void *ctx);\n} run_options;/' common/harness/run.h >"$tmp/cb.h"
    check common/model/plan.h "$tmp/cb.h" >/dev/null && { echo "self-test: a callback in run_options passed"; fails=1; }
    [ $fails = 0 ] && echo "t_structure self-test: 4 planted violations, each reported"
    exit $fails
fi

out=$(check common/model/plan.h common/harness/run.h); rc=$?
[ -n "$out" ] && echo "$out"
if [ $rc = 0 ]; then
    bash "$0" --self-test >/dev/null || { echo "t_structure: the self-test failed (bash tests/t_structure.sh --self-test)"; exit 1; }
    echo "t_structure: llama_plan has no member named after a technique and no *_ctx slot, every *_ops starts with its state; run_options has no callback (self-test: 4 planted violations caught)"
fi
exit $rc
