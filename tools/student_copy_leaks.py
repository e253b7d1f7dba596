#!/usr/bin/env python3
"""student_copy_leaks.py SRC DEST NN: does the student copy DEST (made by `make assignment-NN` from
the tutorial at SRC) still give away what it removed?

The removed lines are those of SRC's files that the copy lost (every file of the copy compared
with its original, line by line): chapter NN's BEGIN ASSIGNMENT regions and the BEGIN SOLUTION
passages stripped for NN. Each is normalised (comments stripped, whitespace collapsed) and, when
it is long enough to be telling (at least MIN_LEN characters, not a line every C file has), looked
for in every text file of the copy, normalised the same way; a line the copy holds in
COMMON_FILES files or more is an idiom (a loop header over the batch), not an answer, and skipped. A hit names the file and line of the
copy, and the original file and line it repeats.

The string literals of the removed C and CUDA lines are looked for too (at least MIN_LITERAL characters, with a
blank and some letters: a formula the code prints, as chapter 08's traffic table prints rank 0's
ring sends): a README's output block shows what the solved program printed, and that line would
give the exercise away. `--scrub` (make_assignment.sh) replaces each such literal in the copy's markdown
by SCRUBBED instead of reporting it, so the copy's READMEs keep their blocks without the answer.

Also a hit: a marker line left in the copy's sources or markdown (BEGIN/END ASSIGNMENT, BEGIN/END
SOLUTION), a chapter folder after NN, a hints/ folder, docs/instructor/.

The answers that are not removed lines: a derivation's result written another way (a README's
table of the asked counts, the formula in words, another file's code computing it) is declared in
docs/instructor/leaks/NN.txt (out of the copy; a chapter without one declares none), one line each:
    NN | exercise | a Python regular expression | what it gives away
and looked for in every text file of the copy, each line with its whitespace collapsed.

A hit that is the course so far (an earlier chapter's solved code that an exercise of NN reuses
on purpose) is declared in tools/student_copy_allow.txt, one line each:
    NN | path of the copy (fnmatch pattern) | a substring of the normalised line | why
Exit status: 0 when nothing leaks, 1 when something does (listed), 2 on bad arguments.
    student_copy_leaks.py --scrub SRC DEST NN     rewrite DEST's markdown instead (exit 0)
"""
import difflib
import fnmatch
import os
import re
import sys

MIN_LEN = 20
MIN_LITERAL = 12
SCRUBBED = "(an exercise's answer: removed from this copy)"
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
COMMON = {
    "return 0;", "return NULL;", "return;", "} else {", "break;", "continue;",
}
TEXT_EXT = {".c", ".h", ".cu", ".md", ".txt", ".sh", ".py", ".mk", ".gp", ".json", ".csv"}
MARKER_C = re.compile(r"^\s*(/\*|//)\s*(BEGIN|END) (ASSIGNMENT|SOLUTION)\b")
MARKER_MD = re.compile(r"^\s*<!--\s*(BEGIN|END) SOLUTION\b.*-->\s*$")
COMMON_FILES = 3   # a line found in this many files of the copy or more is an idiom, not an answer


def is_text(path):
    base = os.path.basename(path)
    return os.path.splitext(base)[1] in TEXT_EXT or base in ("Makefile",)


def normalise_lines(lines):
    """Each line with /* */, // and <!-- --> comments removed and whitespace collapsed."""
    out = []
    in_block = False
    for line in lines:
        s = line
        res = ""
        i = 0
        while i < len(s):
            if in_block:
                j = s.find("*/", i)
                if j < 0:
                    i = len(s)
                else:
                    in_block = False
                    i = j + 2
                continue
            j = s.find("/*", i)
            k = s.find("//", i)
            h = s.find("<!--", i)
            cands = [x for x in (j, k, h) if x >= 0]
            if not cands:
                res += s[i:]
                break
            m = min(cands)
            # "//" inside a URL (http://) is not a comment
            if m == k and m > 0 and s[m - 1] == ":":
                res += s[i:m + 2]
                i = m + 2
                continue
            res += s[i:m]
            if m == j:
                in_block = True
                i = m + 2
            elif m == h:
                e = s.find("-->", m)
                i = len(s) if e < 0 else e + 3
            else:
                break
        out.append(" ".join(res.split()))
    return out


# lines every C file has, whatever the exercise: a counted loop's header, a malloc'd buffer
IDIOMS = [
    re.compile(r"^for \(int \w+ = 0; \w+ < [\w\->.]+; \w+\+\+\) ?\{?$"),
    re.compile(r"^[\w ]+\*\w+ = malloc\([^;]*\);$"),
]


def telling(n):
    if len(n) < MIN_LEN or n in COMMON or any(r.match(n) for r in IDIOMS):
        return False
    return sum(ch.isalnum() for ch in n) >= 10   # a table rule | --- | says nothing


def telling_literal(text):
    """A string literal worth looking for: long, with a blank and letters (a formula, a sentence)."""
    return len(text) >= MIN_LITERAL and " " in text and sum(ch.isalpha() for ch in text) >= 6 and "%" not in text


def walk(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in (".git", "build", "out")]
        for f in files:
            p = os.path.join(d, f)
            if is_text(p):
                yield os.path.relpath(p, root)


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().split("\n")
    except OSError:
        return None


def main():
    args = sys.argv[1:]
    scrub = bool(args) and args[0] == "--scrub"
    if scrub:
        args = args[1:]
    if len(args) != 3:
        print(__doc__)
        return 2
    src, dest, nn = args
    allow = []
    allow_file = os.path.join(src, "tools", "student_copy_allow.txt")
    for line in read(allow_file) or []:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [x.strip() for x in line.split("|")]
        if len(parts) >= 3 and parts[0] == nn:
            allow.append((parts[1], parts[2]))

    declared = []   # (exercise, compiled pattern, what)
    leaks_file = os.path.join(src, "docs", "instructor", "leaks", f"{nn}.txt")
    for n, line in enumerate(read(leaks_file) or [], 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [x.strip() for x in re.split(r"\s\|\s", line, maxsplit=3)]
        if len(parts) != 4 or not all(parts):
            print(f"{leaks_file}:{n}: expected 'NN | exercise | pattern | what it gives away'")
            return 2
        if parts[0] != nn:   # a line copied from another chapter's file would guard nothing
            print(f"{leaks_file}:{n}: chapter '{parts[0]}' in chapter {nn}'s file")
            return 2
        try:
            declared.append((parts[1], re.compile(parts[2]), parts[3]))
        except re.error as e:
            print(f"{leaks_file}:{n}: pattern '{parts[2]}': {e}")
            return 2

    hits = []
    # what the copy may not hold at all
    for d in sorted(os.listdir(dest)):
        if re.match(r"^[0-9][0-9]_", d) and os.path.isdir(os.path.join(dest, d)):
            if d[:2] > nn:
                hits.append(f"{d}/: chapter {d[:2]} comes after {nn}")
            if os.path.isdir(os.path.join(dest, d, "hints")):
                hits.append(f"{d}/hints/: the instructor's hints")
    if os.path.isdir(os.path.join(dest, "docs", "instructor")):
        hits.append("docs/instructor/: the answer key")

    # the removed lines, by comparing every file of the copy with its original
    needles = {}  # normalised line -> "file:line" of the original
    literals = {}  # a telling string literal of a removed line, whitespace collapsed -> "file:line"
    copy_files = list(walk(dest))
    for rel in copy_files:
        a = read(os.path.join(src, rel))
        b = read(os.path.join(dest, rel))
        if a is None or b is None or a == b:
            continue
        na = normalise_lines(a)
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        for tag, i1, i2, _, _ in sm.get_opcodes():
            if tag in ("delete", "replace"):
                for i in range(i1, i2):
                    if telling(na[i]):
                        needles.setdefault(na[i], f"{rel}:{i + 1}")
                    if os.path.splitext(rel)[1] not in (".c", ".h", ".cu"):
                        continue   # a string the code prints: not a README's quoted flag
                    for lit in LITERAL.findall(a[i]):
                        lit = " ".join(lit.split())
                        if telling_literal(lit):
                            literals.setdefault(lit, f"{rel}:{i + 1}")

    if scrub:   # the copy's markdown: each literal replaced, in place
        for rel in copy_files:
            if not rel.endswith(".md"):
                continue
            path = os.path.join(dest, rel)
            lines = read(path)
            new = []
            for line in lines:
                for lit in literals:
                    flat = " ".join(line.split())
                    if lit in flat and not any(fnmatch.fnmatch(rel, pat) and sub in flat for pat, sub in allow):
                        # the literal as the line spells it (its blanks may be runs), as whole
                        # words: "4 L x N D x 4" is not inside "14 L x N D x 40"
                        pattern = r"(?<![\w.])" + r"\s+".join(re.escape(w) for w in lit.split()) + r"(?![\w.])"
                        line = re.sub(pattern, SCRUBBED, line)
                new.append(line)
            if new != lines:
                with open(path, "w", encoding="utf-8") as f:
                    f.write("\n".join(new))
        return 0
    for lit, origin in literals.items():
        needles.setdefault(lit, origin)

    # every text file of the copy: markers, and the removed lines
    found = {}  # needle -> [(file, line, normalised line)]
    for rel in sorted(copy_files):
        lines = read(os.path.join(dest, rel))
        if lines is None:
            continue
        ext = os.path.splitext(rel)[1]
        for i, line in enumerate(lines):
            if ext in (".c", ".h", ".cu") and MARKER_C.search(line):
                hits.append(f"{rel}:{i + 1}: a marker line left: {line.strip()}")
            if ext == ".md" and MARKER_MD.search(line):
                hits.append(f"{rel}:{i + 1}: a marker line left: {line.strip()}")
            flat = " ".join(line.split())
            for ex, pat, what in declared:
                if pat.search(flat):
                    hits.append(f"{rel}:{i + 1}: gives exercise {ex} away ({what}): {flat[:100]}")
        norm = normalise_lines(lines)
        for i, n in enumerate(norm):
            if len(n) < MIN_LEN:
                continue
            for needle, origin in needles.items():
                if needle in n:
                    found.setdefault(needle, []).append((rel, i + 1, n))
    idioms = 0
    for needle, where in found.items():
        if len({rel for rel, _, _ in where}) >= COMMON_FILES:
            idioms += 1
            continue
        for rel, line, n in where:
            if any(fnmatch.fnmatch(rel, pat) and sub in n for pat, sub in allow):
                continue
            hits.append(f"{rel}:{line}: repeats the removed line {needles[needle]}: {needle}")
    for h in hits:
        print(h)
    print(f"student copy {nn}: {len(needles)} removed line(s) and {len(declared)} declared answer(s) looked for "
          f"({idioms} found in {COMMON_FILES} files or more: idioms, skipped), {len(hits)} leak(s)")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
