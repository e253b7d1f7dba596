#!/usr/bin/env python3
"""mutations.py [NN ...]: every exercise proves its grader. Each chapter's wrong answers
(docs/instructor/mutations/NN.txt, kept out of the student copy) are planted one at a time in a
sandbox of the reference solution, the chapter rebuilt, and the exercise's own layouts run
(tests/run_checks.sh, stopping at the first that does not behave). Each wrong answer must:
  - lie inside one of its exercise's regions (between BEGIN/END ASSIGNMENT, the region whose
    task text names the exercise in exercises.txt): what a student could write;
  - build (a wrong answer, not a typo);
  - fail one of the exercise's layouts, with a line that matches its `expect` pattern: the
    message points at the mistake;
  - cost the exercise points in tools/grade.py (the layouts not run counted as passing: the
    most generous grade those results allow).
And every exercise has at least two wrong answers. Run from the tutorial's root after `make`
(the sandbox starts from $BUILD_ROOT/cpu's objects, so only the planted file is compiled again).
One line per wrong answer (MUTATIONS_SHOW=1: with the failing layout's report, to choose a telling
EXPECT); the last line "N of N wrong answers ...". Exit 0 when all hold.

The file, one block per wrong answer:
    === NAME | EXERCISE | EXPECT
    --- PATH
    <the lines of the reference, exactly, once in PATH>
    +++
    <the lines the wrong answer writes instead>
  NAME     a short id; EXERCISE its exercises.txt name; EXPECT a Python regular expression the
           failing layout's report (run_checks.sh's lines) must match: what names the mistake (the
           first step whose loss differs: 1 for a forward, 2 for a backward; the formula's MISMATCH;
           the unit test's message), \n to tie a line to the failing layout's line above it
  a block may hold several --- / +++ pairs (files or places); a line starting with "# " (or a
  lone "#") is a comment wherever it is.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BEGIN = re.compile(r"/\*\s*BEGIN ASSIGNMENT:\s*(.*?)\s*\*/")
END = re.compile(r"/\*\s*END ASSIGNMENT\s*\*/")


def parse(path):
    """[{name, exercise, expect, hunks: [(file, old text, new text)], line}]"""
    muts, cur, mode, hunk = [], None, None, None
    with open(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for n, line in enumerate(lines, 1):
        if line.startswith("# ") or line == "#":
            continue   # a comment, anywhere (no C line starts with "# ")
        if line.startswith("=== "):
            fields = [x.strip() for x in line[4:].split(" | ", 2)]
            if len(fields) != 3 or not all(fields):
                raise SystemExit(f"{path}:{n}: expected '=== NAME | EXERCISE | EXPECT'")
            cur = {"name": fields[0], "exercise": fields[1], "expect": fields[2], "hunks": [], "line": n}
            muts.append(cur)
            mode = None
        elif cur is None:
            if line.strip():
                raise SystemExit(f"{path}:{n}: text before the first '=== ' block")
        elif line.startswith("--- "):
            hunk = [line[4:].strip(), [], []]
            cur["hunks"].append(hunk)
            mode = 1
        elif line == "+++" and mode == 1:
            mode = 2
        elif mode in (1, 2):
            hunk[mode].append(line)
        elif line.strip():
            raise SystemExit(f"{path}:{n}: a line outside a '--- PATH' hunk")
    for m in muts:
        if not m["hunks"] or any(not old for _, old, _ in m["hunks"]):
            raise SystemExit(f"{path}:{m['line']}: {m['name']}: a hunk with no reference lines")
    # trailing blank lines separate blocks: not part of either text; each text as it is looked for
    # and written, whole lines
    for m in muts:
        for h in m["hunks"]:
            for lines in (h[1], h[2]):
                while lines and not lines[-1].strip():
                    lines.pop()
        m["hunks"] = [(f, "\n".join(old) + "\n", "\n".join(new) + "\n" if new else "") for f, old, new in m["hunks"]]
    return muts


def all_passing(chapter_dir, path):
    """checks.txt as the results of a run in which every layout passed (grade.py's input)."""
    with open(path, "w") as out:
        for n, line in enumerate(open(os.path.join(chapter_dir, "checks.txt")), 1):
            parts = line.split()
            if parts and not parts[0].startswith("#"):
                out.write(f"{n}\t{parts[0]}\t{parts[1]}\t{' '.join(parts[2:])}\tok\t-\n")


def build_targets(chapter_dir, nn):
    """What make build-NN builds: the chapter's binary and the unit tests its checks.txt runs."""
    units = [line.split()[2] for line in open(os.path.join(chapter_dir, "checks.txt"))
             if len(line.split()) > 2 and line.split()[1] == "unit"]
    return [f"build/cpu/{nn}"] + [f"build/cpu/tests/{u}" for u in units]


def grade(nn, results, gj, cwd="."):
    """tools/grade.py on RESULTS: {exercise name: its grade.json entry (points, possible, regions,
    layouts)}, or None with grade.py's last words printed."""
    rc, text = sh(f"python3 tools/grade.py {nn} {results} --json {gj} --quiet", cwd)
    if rc != 0:
        print(f"FAIL  {nn}: tools/grade.py: {text.strip()[-300:]}")
        return None
    return {e["name"]: e for e in json.load(open(gj))["exercises"]}


def region_task(text, start):
    """The task text of the BEGIN ASSIGNMENT region holding offset start, or None."""
    b = None
    for m in BEGIN.finditer(text, 0, start):
        b = m
    if b is None:
        return None
    e = END.search(text, b.end())
    return b.group(1) if e and e.start() >= start else None


def sh(cmd, cwd, env=None, timeout=900):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, shell=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")


def main():
    tmp = tempfile.mkdtemp(prefix="mutations.")
    try:
        return run(sys.argv[1:], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(want, tmp):
    files = sorted(glob.glob("docs/instructor/mutations/[0-9][0-9].txt"))
    chapters = sorted(d[:2] for d in glob.glob("[0-9][0-9]_*/exercises.txt"))
    bad, total, ok = 0, 0, 0
    # every chapter with exercises has its wrong answers, every exercise two at least
    plan, missing = {}, []
    for nn in chapters:
        if want and nn not in want:
            continue
        chapter_dir = glob.glob(f"{nn}_*/")[0]
        path = f"docs/instructor/mutations/{nn}.txt"
        if path not in files:
            if want:   # asked for by name: its wrong answers must exist
                print(f"FAIL  {nn}: no {path}: every exercise needs two wrong answers its grader rejects")
                bad += 1
            else:
                missing.append(nn)
            continue
        # the exercises (points, regions, the layouts that grade them): grade.py's, from results in
        # which every layout passed
        allok = os.path.join(tmp, f"ok{nn}.tsv")
        all_passing(chapter_dir, allok)
        exs = grade(nn, allok, os.path.join(tmp, f"g{nn}.json"))
        if exs is None:
            bad += 1
            continue
        muts = parse(path)
        for name in exs:
            k = sum(1 for m in muts if m["exercise"] == name)
            if k < 2:
                print(f"FAIL  {nn} {name}: {k} wrong answer(s) in {path}, at least 2 wanted")
                bad += 1
        for m in muts:
            m["valid"] = False
            if m["exercise"] not in exs:
                print(f"FAIL  {path}:{m['line']}: {m['name']}: no exercise '{m['exercise']}' in {chapter_dir}exercises.txt")
                bad += 1
                continue
            try:
                re.compile(m["expect"])
            except re.error as e:
                print(f"FAIL  {path}:{m['line']}: {m['name']}: expect '{m['expect']}': {e}")
                bad += 1
                continue
            # each hunk: its reference lines once in the file, inside a region of the exercise
            m["valid"] = True
            for f, old, _ in m["hunks"]:
                if not os.path.isfile(f):
                    print(f"FAIL  {path}:{m['line']}: {m['name']}: no file {f}")
                    bad += 1; m["valid"] = False
                    continue
                text = open(f).read()
                if text.count(old) != 1:
                    print(f"FAIL  {path}:{m['line']}: {m['name']}: its reference lines occur {text.count(old)} times in {f} (once wanted)")
                    bad += 1; m["valid"] = False
                    continue
                task = region_task(text, text.index(old))
                if task is None or not any(r in task for r in exs[m["exercise"]]["regions"]):
                    print(f"FAIL  {path}:{m['line']}: {m['name']}: its lines in {f} are not in a region of exercise "
                          f"{m['exercise']} ({'in: ' + task if task else 'outside every ASSIGNMENT region'})")
                    bad += 1; m["valid"] = False
        plan[nn] = (chapter_dir, exs, [m for m in muts if m["valid"]], allok)
        total += sum(1 for m in muts if not m["valid"])

    box = os.path.join(tmp, "tutorial")
    # the sandbox: the tutorial's tracked files (tests/check_lib.sh's tracked_copy), and
    # build/cpu with its times kept, so that make compiles only what a wrong answer changes
    rc, text = sh(f'. tests/check_lib.sh && tracked_copy "{box}"', ".")
    if rc != 0:
        print(f"FAIL  the sandbox: {text.strip()[-300:]}")
        return 1
    shutil.copytree(os.path.join(os.environ.get("BUILD_ROOT") or "build", "cpu"), os.path.join(box, "build/cpu"),
                    symlinks=True)
    env = dict(os.environ)
    base = env.get("MPIRUN_BASE") or subprocess.run("tools/mpirun_base.sh", shell=True, stdout=subprocess.PIPE,
                                                   text=True).stdout.strip()
    # a wrong answer that leaves a rank waiting (a collective one rank skips) ends within 30 s
    env["MPIRUN_BASE"] = base + " -x GUARD_TIMEOUT=30"
    env.pop("CHECKS_LINES", None)
    env.pop("GRADE", None)
    for nn, (chapter_dir, exs, muts, allok) in plan.items():
        gj = os.path.join(tmp, f"g{nn}.json")
        targets = build_targets(chapter_dir, nn)
        for m in muts:
            total += 1
            t0 = time.time()
            saved = {}
            # what the wrong answer's build rewrites, kept with its times and put back after it: the
            # planted files' objects and the binaries that link them; with each planted file's time
            # put back too, the next wrong answer's make compiles its own file only, not this one's
            # again (a .h is left to make: every object that includes it is rebuilt)
            kept = {}   # path in the sandbox -> its copy (None: it was not there)
            objects = [os.path.join("build/cpu", f[:-2] + ".o") for f, _, _ in m["hunks"] if f.endswith(".c")]
            for i, rel in enumerate(dict.fromkeys(objects + targets)):
                path = os.path.join(box, rel)
                kept[path] = os.path.join(tmp, f"kept_{i}") if os.path.exists(path) else None
                if kept[path]:
                    shutil.copy2(path, kept[path])
            for f, old, new in m["hunks"]:
                p = os.path.join(box, f)
                with open(p) as fh:
                    text = fh.read()
                saved.setdefault(p, (text, os.stat(p)))
                with open(p, "w") as fh:        # read before opening for writing, which empties the file
                    fh.write(text.replace(old, new, 1))
            what = f"{nn} {m['exercise']}/{m['name']}"
            try:
                # -O1: the same bits as the default -O3 (Makefile), compiled faster; what make
                # build-NN builds (the chapter's binary, the unit tests its checks.txt names),
                # named directly: without build-NN's banner and dependency check, a second apiece
                rc, text = sh(f"CFLAGS='-O1 -g -fno-math-errno' make --no-print-directory -s BACKEND=cpu BUILD_ROOT=build "
                              f"{' '.join(targets)}", box)
                if rc != 0:
                    print(f"FAIL  {what}: the wrong answer does not build (a wrong answer must compile):")
                    print("\n".join("      | " + x for x in text.strip().split("\n")[-12:]))
                    bad += 1
                    continue
                res = os.path.join(tmp, "results.tsv")
                if os.path.exists(res):
                    os.remove(res)
                lines = " ".join(str(x) for x in exs[m["exercise"]]["layouts"])
                e2 = dict(env, CHECKS_LINES=lines, STOP_AT_FIRST_FAILURE="1", CHECKS_RESULTS=res)
                rc, report = sh(f"./tests/run_checks.sh cpu {nn} build", box, env=e2)
                secs = time.time() - t0
                failing = [x for x in report.split("\n") if x.startswith("FAIL")]
                if rc == 0 or not failing:
                    print(f"FAIL  {what}: every layout of the exercise behaves with this wrong answer ({secs:.0f} s)")
                    bad += 1
                    continue
                if not re.search(m["expect"], report):
                    print(f"FAIL  {what}: caught, but no line of the report matches '{m['expect']}':")
                    print("\n".join("      | " + x for x in report.strip().split("\n")[-14:]))
                    bad += 1
                    continue
                # the grade: the layouts not run counted as passing
                ran = {}
                if os.path.exists(res):
                    for x in open(res):
                        ran[x.split("\t")[0]] = x
                merged = os.path.join(tmp, "merged.tsv")
                with open(merged, "w") as out:
                    for x in open(allok):
                        out.write(ran.get(x.split("\t")[0], x))
                graded = grade(nn, merged, gj, box)
                g = graded[m["exercise"]] if graded else {"points": "?", "possible": "?"}
                if not graded or g["points"] >= g["possible"]:
                    print(f"FAIL  {what}: caught, but the exercise keeps {g['points']} of {g['possible']} points")
                    bad += 1
                    continue
                mark = " ".join(re.search(m["expect"], report).group(0).split())   # (an EXPECT may span lines: \n)
                print(f"ok    {what}: {g['points']:g} of {g['possible']:g} points; {failing[0][6:].split('  (exit')[0].strip()}: "
                      f"'{mark[:80]}' ({secs:.0f} s)")
                ok += 1
                if os.environ.get("MUTATIONS_SHOW"):   # the report, to choose a telling EXPECT
                    print("\n".join("      | " + x for x in report.strip().split("\n")))
            finally:
                for p, (text, st) in saved.items():
                    with open(p, "w") as fh:
                        fh.write(text)
                    if p.endswith(".c"):
                        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))   # as before the wrong answer
                for path, copy in kept.items():
                    if copy:
                        shutil.copy2(copy, path)      # (copy2 keeps the times)
                    elif os.path.exists(path):
                        os.remove(path)               # (not there before: make builds it again)
    n_ex = sum(len(exs) for _, exs, _, _ in plan.values())
    print(f"{ok} of {total} wrong answers lose their exercise's points with a message naming the mistake "
          f"({n_ex} exercises of {len(plan)} chapters, each with two at least"
          + (f"; chapters without wrong answers yet: {' '.join(missing)})" if missing else ")"))
    return 0 if ok == total and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
