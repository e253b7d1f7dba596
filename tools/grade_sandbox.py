#!/usr/bin/env python3
"""grade_sandbox.py REF SUB WORK: the folder a submission is graded in (make grade, grade_many.sh).

WORK becomes a copy of REF, a fresh student copy made by make assignment-NN from this tutorial,
into which only the student's answers are put: in every source file of the chapter, the lines
between each "ANSWER BEGIN (assignment): TASK" line and its "ANSWER END (assignment): TASK" line
are taken from the same file of SUB, the student's folder, matched by TASK (and, for a task named
twice in a file, by its order), read only from a plain file (not through a link). Everything else comes
from REF: an edit of common/, of a test, of a script or of the graders cannot change the grade.
What the student changed outside the answers is listed, as ignored.

REF's build/ folder, if any, comes along (its objects older than the answers written here, so
make rebuilds only what an answer touched).

Writes WORK/.sandbox.json: {"answers": [[file, task], ...] taken, "markers_missing": [[file, task],
...] (the student removed or renamed an ANSWER line: that answer could not be taken, its TODO
stays), "ignored": ["path (changed|added|deleted)", ...]}. Exit status 0, or 2 with one line on
a folder that is not what it should be.
"""
import filecmp
import json
import os
import re
import shutil
import stat
import sys

BEGIN = re.compile(r"^\s*/\*\s*ANSWER BEGIN \(assignment\):\s*(.*?)\s*\*/\s*$")
END = re.compile(r"^\s*/\*\s*ANSWER END \(assignment\):\s*(.*?)\s*\*/\s*$")
SOURCES = (".c", ".cu", ".h")
# what a student's folder holds besides the copy: the build, the runs' outputs, the grade itself
NOT_COMPARED = {"build", "out", "grade.json", "grade.log", ".sandbox.json"}


def answers(lines):
    """{(task, n): (index of the ANSWER BEGIN line, index of its ANSWER END line)} of a file's
    lines, n counting the regions of the same task in the file (0 for the first)."""
    found, seen, open_at, open_task = {}, {}, None, None
    for i, line in enumerate(lines):
        b, e = BEGIN.match(line), END.match(line)
        if b:
            open_at, open_task = i, b.group(1)
        elif e and open_at is not None and e.group(1) == open_task:
            n = seen.get(open_task, 0)
            seen[open_task] = n + 1
            found[(open_task, n)] = (open_at, i)
            open_at, open_task = None, None
    return found


def regular(path):
    """True for a plain file that is not a symbolic link (a link's target is not the student's to name)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_lines(path):
    with open(path, errors="surrogateescape") as f:
        return f.read().split("\n")


def splice(ref_file, sub_file, work_file, rel, taken, missing):
    ref = read_lines(ref_file)
    slots = answers(ref)
    if not slots:
        return False
    theirs = []
    if regular(sub_file):
        try:
            theirs = read_lines(sub_file)
        except OSError:
            theirs = []
    given = answers(theirs)
    out, i = [], 0
    for key, (b, e) in sorted(slots.items(), key=lambda kv: kv[1][0]):
        out += ref[i:b + 1]
        if key in given:
            sb, se = given[key]
            out += theirs[sb + 1:se]
            taken.append([rel, key[0]])
        else:
            out += ref[b + 1:e]
            missing.append([rel, key[0]])
        i = e
    out += ref[i:]
    with open(work_file, "w", errors="surrogateescape") as f:
        f.write("\n".join(out))
    return True


def main():
    if len(sys.argv) != 4:
        print("usage: grade_sandbox.py REF SUB WORK", file=sys.stderr)
        return 2
    ref, sub, work = sys.argv[1:]
    for what, d in (("REF", ref), ("SUB", sub)):
        if not os.path.isfile(os.path.join(d, ".student-copy")):
            print(f"grade_sandbox: {what}={d} is not a student copy (no .student-copy)", file=sys.stderr)
            return 2
    if os.path.exists(work):
        print(f"grade_sandbox: WORK={work} exists", file=sys.stderr)
        return 2
    shutil.copytree(ref, work, symlinks=True)
    taken, missing, spliced = [], [], set()
    for root, dirs, files in os.walk(ref):
        dirs[:] = [d for d in dirs if d not in NOT_COMPARED or root != ref]
        for name in files:
            if name.endswith(SOURCES):
                rel = os.path.relpath(os.path.join(root, name), ref)
                if splice(os.path.join(ref, rel), os.path.join(sub, rel), os.path.join(work, rel), rel, taken, missing):
                    spliced.add(rel)
    # what else the student changed: listed, not used
    ignored = []
    def walk(top):
        for root, dirs, files in os.walk(top):
            if root == top:
                dirs[:] = [d for d in dirs if d not in NOT_COMPARED and d != ".git"]
                files = [f for f in files if f not in NOT_COMPARED]
            for name in files:
                yield os.path.relpath(os.path.join(root, name), top)
    theirs = set(walk(sub))
    for rel in sorted(theirs):
        w, mine = os.path.join(work, rel), os.path.join(sub, rel)
        if not regular(mine):
            ignored.append(f"{rel} (not a plain file: a link or other, not used)")
        elif not os.path.lexists(w):
            ignored.append(f"{rel} (added)")
        else:
            try:
                same = filecmp.cmp(mine, w, shallow=False)
            except OSError:
                same = False
            if not same:
                ignored.append(f"{rel} (changed)")
    for rel in sorted(set(walk(ref)) - theirs):
        ignored.append(f"{rel} (deleted)")
    with open(os.path.join(work, ".sandbox.json"), "w") as f:
        json.dump({"answers": taken, "markers_missing": missing, "ignored": ignored}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
