#!/usr/bin/env python3
"""grade.py NN RESULTS [--json FILE] [--quiet]: chapter NN's grade per exercise, from the layouts
tests/run_checks.sh ran (RESULTS: one line per layout of checks.txt, tab-separated: line number,
ranks, expect, flags, ok|FAIL, detail) and the chapter's exercises.txt. Run from the tutorial's
root (or a student copy's); run_checks.sh calls it.

exercises.txt, one exercise a line, fields separated by " | " (a "|" with a space on each side;
a regular expression may hold "|" without spaces):
    name | points | regions | checks | units
  name     a short id (no spaces), the column of `make grade`'s CSV
  points   what the exercise is worth
  regions  ";"-separated substrings of the TODO (assignment) lines a student copy holds for it
           (its regions' BEGIN ASSIGNMENT task text): while one is left and a layout fails, the
           exercise is "unfinished" and the TODO is named (so is an answer left empty: its TODO
           deleted, nothing but comments between its ANSWER lines). A "TODO (removed from the student copy
           ...)" placeholder (a solution passage of the text) is nobody's unfinished work: code
           the student must write is an assignment region, so that make grade takes it
  checks   ";"-separated regular expressions (Python re.search) over checks.txt's layout lines
           with the whitespace collapsed ("2 pass --schedule 1f1b --microbatches 4 --steps 3"):
           the layouts that grade the exercise; empty for none
  units    ";"-separated names of checks.txt's unit and script lines (test_trainer,
           check_resume.sh) that grade it too
A layout may grade several exercises; one no exercise names is run and reported, not scored.

Points: an exercise earns points x the share of its layouts that behave (a pass, unit or script
layout that passes, a fail layout whose deliberate bug is caught), and 0 while none of its pass,
unit and script layouts passes: an exercise not written earns nothing even where the deliberate
bug is caught anyway. Code that goes around the operator a fault replaces loses the share of the
bug it hides, with a line that says so. A layout that matched the baseline and failed only on its
measured-beside-formula figures (run_checks.sh's detail formulas-only) behaves for an exercise with
no TODO left while another exercise it grades still has its TODO (a formula not yet written).
Blame: a failing layout that grades several exercises costs the one most likely at fault (see
"Blame" below: an exercise seen to work elsewhere keeps it when another explains its failures and
does worse). Points and totals to 2 decimals; in grade.json a deliberate bug's layout reads
"caught" or "not caught". Prints the table; --json writes the machine-readable result. Exit 0, or 2 when
exercises.txt is malformed (a check that matches no layout, a unit not in checks.txt).
"""
import glob
import json
import os
import re
import sys


ANSWER_BEGIN = re.compile(r"^\s*/\*\s*ANSWER BEGIN \(assignment\):\s*(.*?)\s*\*/\s*$")
ANSWER_END = re.compile(r"^\s*/\*\s*ANSWER END \(assignment\):\s*(.*?)\s*\*/\s*$")


def fail(msg):
    print(f"grade: {msg}", file=sys.stderr)
    sys.exit(2)


def split(field):
    return [x.strip() for x in field.split(";") if x.strip()]


def main():
    args = sys.argv[1:]
    quiet = "--quiet" in args
    args = [a for a in args if a != "--quiet"]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        fail(__doc__)
    nn, results_file = args
    dirs = glob.glob(f"{nn}_*/")
    if not dirs:
        fail(f"no chapter {nn}")
    chapter_dir = dirs[0]
    ex_file = os.path.join(chapter_dir, "exercises.txt")
    if not os.path.exists(ex_file):
        fail(f"{ex_file} does not exist")

    layouts = []
    with open(results_file) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            lineno, np_, expect, flags, result, detail = parts[:6]
            text = " ".join(f"{np_} {expect} {flags}".split())
            layouts.append({"line": int(lineno), "ranks": int(np_), "expect": expect, "flags": flags,
                            "text": text, "passed": result == "ok", "detail": detail, "exercises": []})

    exercises = []
    with open(ex_file) as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = [x.strip() for x in re.split(r"(?<=\s)\|(?=\s|$)", line.rstrip("\n"))]
            fields += [""] * (5 - len(fields))
            name, points, regions, checks, units = fields[:5]
            try:
                points = float(points)
            except ValueError:
                fail(f"{ex_file}:{n}: points '{points}' is not a number")
            ex = {"name": name, "possible": points, "regions": split(regions), "layouts": []}
            for pat in split(checks):
                try:
                    r = re.compile(pat)
                except re.error as e:
                    fail(f"{ex_file}:{n}: check '{pat}': {e}")
                hit = [lay for lay in layouts if lay["expect"] in ("pass", "fail") and r.search(lay["text"])]
                if not hit and layouts:
                    fail(f"{ex_file}:{n}: check '{pat}' matches no layout of {chapter_dir}checks.txt")
                for lay in hit:
                    if lay not in ex["layouts"]:
                        ex["layouts"].append(lay)
            for unit in split(units):
                hit = [lay for lay in layouts if lay["expect"] in ("unit", "script")
                       and lay["flags"].split()[:1] == [unit]]
                if not hit and layouts:
                    fail(f"{ex_file}:{n}: unit '{unit}' is not a unit or script line of {chapter_dir}checks.txt")
                for lay in hit:
                    if lay not in ex["layouts"]:
                        ex["layouts"].append(lay)
            for lay in ex["layouts"]:
                lay["exercises"].append(name)
            exercises.append(ex)

    # the TODOs a student copy still holds, each given to the exercise whose region it names. Only
    # an exercise's own TODO (assignment) counts: a "TODO (removed from the student copy: ...)"
    # placeholder stands for a solution passage taken out of the text (a printed formula, a
    # comment), which a student does not write and make grade's sandbox puts back as it was, so it
    # would mark a finished exercise unfinished for ever
    # An answer left empty (its TODO deleted, nothing but comments between its ANSWER lines) is
    # unfinished too: it would otherwise count as written code.
    todos = []
    for src in sorted(glob.glob(os.path.join(chapter_dir, "*.c")) + glob.glob(os.path.join(chapter_dir, "*.cu"))):
        with open(src, errors="replace") as f:
            lines = f.read().split("\n")
        task, start, body = None, 0, []
        for n, line in enumerate(lines, 1):
            if "TODO (assignment)" in line:
                todos.append((f"{src}:{n}", line.strip()))
            b, e = ANSWER_BEGIN.match(line), ANSWER_END.match(line)
            if b:
                task, start, body = b.group(1), n, []
            elif e and task is not None:
                code = re.sub(r"/\*.*?\*/|//[^\n]*", "", "\n".join(body), flags=re.S).strip()
                if not code and not any("TODO (assignment)" in x for x in body):
                    todos.append((f"{src}:{start}", f"TODO (assignment): {task} (an empty answer)"))
                task = None
            elif task is not None:
                body.append(line)
    unclaimed = []
    for where, text in todos:
        owners = [ex for ex in exercises if any(r in text for r in ex["regions"])]
        for ex in owners:
            ex.setdefault("todo", []).append(where)
        if not owners:
            unclaimed.append(where)

    # A layout that matched the baseline and failed only on a measured figure beside its formula
    # (run_checks.sh's detail "formulas-only") counts as behaving for an exercise with no TODO left
    # when another exercise it grades still has its TODO: the formula it misses is that one's (04's
    # memory and traffic formulas fail every layout until they are written, the warm-ups' too).
    for ex in exercises:
        ex.setdefault("todo", [])
    by_name = {ex["name"]: ex for ex in exercises}
    def credited_formulas(lay, ex):
        return (lay["detail"] == "formulas-only" and not ex["todo"]
                and any(o is not ex and o["todo"] for o in exercises if o["name"] in lay["exercises"]))
    # Blame: a failing layout that grades several exercises costs the one most likely at fault, not
    # every one. How far an exercise's code is seen to work: 2 when one of its pass, unit or script
    # layouts passed, 1 when one at best matched the baseline and failed only on a formula, 0 when
    # none did; it is convicted when a failing layout grades it alone. An exercise is worse off than
    # another when it still has its TODO (and the other not), else when it is convicted (and the
    # other not), else when its code is seen to work less. Exercise X keeps a failing layout's share
    # when X has no TODO left, its code is seen to work (1 or 2), and another exercise Y of the
    # layout explains every failure of X (each layout X fails, Y grades and fails) and is worse off.
    # (06: a wrong ring fails the ring's layouts, which the merge grades too; the merge passes the
    # all-gather's: the ring loses them, the merge keeps them.) Where nothing tells them apart, each
    # loses it; one of a failing layout's exercises always does (worse off is a strict order).
    fails = {ex["name"]: {lay["line"] for lay in ex["layouts"] if not lay["passed"]} for ex in exercises}
    seen = {ex["name"]: max([0] + [2 if lay["passed"] else 1 if lay["detail"] == "formulas-only" else 0
                                   for lay in ex["layouts"] if lay["expect"] != "fail"]) for ex in exercises}
    convicted = {ex["name"]: any(not lay["passed"] and lay["exercises"] == [ex["name"]] for lay in ex["layouts"])
                 for ex in exercises}
    badness = {ex["name"]: (bool(ex["todo"]), convicted[ex["name"]], -seen[ex["name"]]) for ex in exercises}
    def worse(o, ex):
        return fails[ex["name"]] <= fails[o["name"]] and badness[o["name"]] > badness[ex["name"]]
    def blamed_on(lay, ex):
        """The exercises of failing layout lay that take the blame instead of ex, or []."""
        if ex["todo"] or not seen[ex["name"]]:
            return []
        return [o for o in (by_name[n] for n in lay["exercises"] if n != ex["name"]) if worse(o, ex)]
    def behaves(lay, ex):
        if lay["passed"]:
            return True
        return credited_formulas(lay, ex) or bool(blamed_on(lay, ex))

    total = possible = 0.0
    for ex in exercises:
        p_lays = [lay for lay in ex["layouts"] if lay["expect"] != "fail"]
        f_lays = [lay for lay in ex["layouts"] if lay["expect"] == "fail"]
        ex["credited"] = sum(credited_formulas(lay, ex) for lay in ex["layouts"] if not lay["passed"])
        ex["blamed"] = []   # the exercises whose fault its failing layouts are counted as
        for lay in ex["layouts"]:
            if not lay["passed"] and not credited_formulas(lay, ex):
                for o in blamed_on(lay, ex):
                    if o["name"] not in ex["blamed"] and not blamed_on(lay, o):
                        ex["blamed"].append(o["name"])
        ex["excused"] = sum(not lay["passed"] and not credited_formulas(lay, ex) and bool(blamed_on(lay, ex))
                            for lay in ex["layouts"])
        share = sum(behaves(lay, ex) for lay in ex["layouts"]) / len(ex["layouts"]) if ex["layouts"] else 0.0
        if p_lays and not any(behaves(lay, ex) for lay in p_lays):
            share = 0.0   # a bug caught by code that does nothing earns nothing
        ex["points"] = round(ex["possible"] * share, 2)
        ex["passed"] = sum(behaves(lay, ex) for lay in ex["layouts"])
        ex["total"] = len(ex["layouts"])
        ex.setdefault("todo", [])
        if ex["total"] and ex["passed"] == ex["total"]:
            ex["status"] = "done"
        elif ex["todo"]:
            ex["status"] = "unfinished"
        else:
            ex["status"] = "failing"
        total += ex["points"]
        possible += ex["possible"]

    if not quiet:
        w = max([len(ex["name"]) for ex in exercises] + [8])
        print(f"grade-{nn}: points per exercise ({ex_file}; partial credit: the share of its layouts that behave)")
        for ex in exercises:
            line = f"  {ex['name']:<{w}}  {ex['points']:5.2f} / {ex['possible']:<4g}  {ex['passed']:3d}/{ex['total']:<3d} layouts  {ex['status']}"
            if ex["status"] == "unfinished":
                line += ": TODO at " + ", ".join(ex["todo"])
            if ex["credited"]:
                line += (f" ({ex['credited']} of them matched the baseline and failed only on the formulas of an "
                         f"unfinished exercise: counted)")
            if ex["excused"]:
                line += (f" ({ex['excused']} of them failed, blamed on {', '.join(ex['blamed'])}: every layout this "
                         f"exercise fails grades that one too, which does worse; counted)")
            if ex["status"] == "failing" and not (ex["credited"] or ex["excused"]):
                shared = [o["name"] for o in exercises if o is not ex and o["status"] == "unfinished"
                          and any(lay in o["layouts"] and not lay["passed"] for lay in ex["layouts"])]
                if shared:
                    line += f": no TODO left; its failing layouts also grade {', '.join(shared)}, still unfinished"
                else:
                    line += ": no TODO left, but layouts fail (above)"
            print(line)
        for lay in layouts:
            if lay["expect"] == "fail" and not lay["passed"] and lay["detail"] == "matched-baseline":
                names = ", ".join(lay["exercises"]) or "none named"
                print(f"  the deliberate bug of `{lay['text']}` was not caught: the run matched the baseline "
                      f"with the bug in. Your code for exercise {names} may go around the operator the fault "
                      f"replaces (a collective of its own, or a copy of the result it should compute), so "
                      f"turning that operator off changes nothing.")
        free = [lay for lay in layouts if not lay["exercises"]]
        if free:
            print(f"  not part of an exercise (the chapter's own code): {sum(lay['passed'] for lay in free)}"
                  f"/{len(free)} layouts behave")
        if unclaimed:
            print(f"  TODO left that no exercise names: {', '.join(unclaimed)}")
        print(f"grade-{nn}: {round(total, 2):g} of {round(possible, 2):g} points")

    if json_out:
        doc = {
            "chapter": nn,
            "points": round(total, 2),
            "possible": round(possible, 2),
            "exercises": [{k: ex[k] for k in ("name", "points", "possible", "status", "passed", "total", "todo", "regions")}
                          | ({"blamed_on": ex["blamed"]} if ex["blamed"] else {})
                          | {"layouts": [lay["line"] for lay in ex["layouts"]]} for ex in exercises],
            "layouts": [{"line": lay["line"], "layout": lay["text"], "expect": lay["expect"],
                         # a deliberate bug's layout reads as what happened to the bug
                         "result": ("caught" if lay["passed"] else "not caught") if lay["expect"] == "fail"
                                   else ("pass" if lay["passed"] else "fail"),
                         **({"detail": lay["detail"]} if lay["detail"] != "-" else {}),
                         "exercises": lay["exercises"]} for lay in layouts],
        }
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        if not quiet:
            print(f"wrote {json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
