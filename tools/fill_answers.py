#!/usr/bin/env python3
"""fill_answers.py CHAPTER_DIR COPY [TASK_LEFT]: write the tutorial's own answers into a student copy.

For every assignment region of CHAPTER_DIR's C files (between "BEGIN ASSIGNMENT: <task>" and
"END ASSIGNMENT" in this tutorial), the lines between the copy's "ANSWER BEGIN (assignment): <task>"
and "ANSWER END (assignment): <task>" (the TODO) are replaced by the region's lines: the copy
becomes a submission that should earn full marks. The region whose task contains TASK_LEFT keeps
its TODO (a partial submission). Used by tests/t_grade.sh (sample submissions) and
tools/bench_grade.sh (a class of them, timed). Run from the tutorial's root.
"""
import glob
import os
import re
import sys


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    chapter, sub = sys.argv[1], sys.argv[2]
    left = sys.argv[3] if len(sys.argv) == 4 else ""
    for src in sorted(glob.glob(os.path.join(chapter, "*.c"))):
        text = open(src).read()
        regions = dict(re.findall(r"BEGIN ASSIGNMENT: *(.*?) *\*/[^\n]*\n(.*?)\n[^\n]*END ASSIGNMENT", text, re.S))
        if not regions:
            continue
        dst = os.path.join(sub, src)
        lines = open(dst).read().split("\n")
        out = []
        i = 0
        while i < len(lines):
            m = re.match(r"\s*/\* ANSWER BEGIN \(assignment\): (.*?) \*/", lines[i])
            out.append(lines[i])
            i += 1
            if m and not (left and left in m.group(1)):
                while "ANSWER END (assignment)" not in lines[i]:
                    i += 1   # the TODO goes
                out.append(regions[m.group(1)])
        with open(dst, "w") as f:
            f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
