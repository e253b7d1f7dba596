#!/usr/bin/env python3
# readme_outputs.py: the README blocks of program output, checked against (or rewritten from)
# real runs, and every reference of the READMEs (links, file names) checked to resolve.
#
#   tools/readme_outputs.py --check  [--file F] [--chapter NN] [--block README:LINE] [--quick]
#                                    [--jobs N] [--root DIR]
#   tools/readme_outputs.py --update [--file F] [--chapter NN] [--block README:LINE]
#   tools/readme_outputs.py --list                   the blocks, their commands, what --quick skips
#   tools/readme_outputs.py --refs                   only the references
# BUILD_ROOT (environment, or --build-root) is the build to run, default `build`, backend cpu;
# `make readme-outputs` builds and runs --update, `make check-readme` builds and runs --check, and
# tests/t_readme.sh (make test) runs --check --quick: not make check-NN, not the 8-rank runs.
#
# MARKERS. A fenced block of README.md or NN_*/README.md is program output when the line just
# before its opening ``` is
#     <!-- output: COMMAND -->            (several commands: COMMAND ; COMMAND ; ...)
#     <!-- output, exact: COMMAND -->     the same, and the times it prints are compared too
#                                         (they are computed, not measured: 08's --plan)
#     <!-- output, blas Zen: COMMAND -->  the block depends on the machine beyond the rules below
#                                         (float8 after step 1, ties at a rounding midpoint, 500
#                                         training steps): it was made with OpenBLAS's Zen kernels
#                                         and is run only where the build's OpenBLAS picks those
#                                         (openblas_get_corename(); OPENBLAS_CORETYPE forces it),
#                                         else counted as skipped
#     <!-- measured: WHAT, WHERE -->      a measurement (a benchmark, a timing study, a long run):
#                                         recorded, never re-run by this script
# Blocks without a marker (code, diagrams, formulas, command lists) are not looked at.
# COMMAND is what the prose quotes, run from the repository root:
#   make run-NN [NP=N] [ARGS="..."]   what the Makefile's run-NN runs (run_cmd and the chapter.mk's
#                                     RUN_NP_NN, RUN_FLAGS_NN, RUN_ARGS_NN) on BUILD_ROOT's binary,
#                                     without building: the mpirun line make echoes, the run's
#                                     output, and on a non-zero exit tools/exit_status.sh's line
#                                     (make's own closing "make: *** ... Error N" is not reproduced)
#   make check-NN                     tests/run_checks.sh cpu NN BUILD_ROOT
#   anything else                     bash, with `mpirun` replaced by tools/mpirun_base.sh's line,
#                                     build/cpu/ by BUILD_ROOT/cpu/, and /tmp/ by a private
#                                     directory (mapped back to /tmp/ in the output)
# Every command runs under timeout(1) (--timeout, default 600 s), stdin /dev/null, stdout and
# stderr together, in a scratch copy of the repository's top level (symbolic links; out/ is left
# out, so runs write their CSVs there, not into the checkout). One run serves every block that
# quotes the same command; --jobs N runs N blocks at once (their commands in order). A block whose lines begin with `$ ` is a transcript: each `$ COMMAND`
# line (a trailing "  (note)" and `\` continuations allowed) is the next command of the marker,
# in order, and the lines up to the next `$ ` line are that command's output; `$ cat FILE` of a
# FILE the repository does not have shows the file (it is written as shown, for the commands
# after it: chapter 07's enc.c). A block without `$ ` lines is the output of its commands, one
# after the other.
#
# MATCHING. A block line `...` stands for any number of output lines. The other lines come in
# runs between the `...` lines; each run must equal consecutive output lines, and the runs must
# come in order. The block is a window: its first run may start anywhere in the output and its
# last may end before the output does. Two lines are equal when
#   - their text outside the numbers is the same once every run of blanks is one blank (the
#     tables' column widths move with the numbers), and --allow-run-as-root and --oversubscribe
#     are dropped (make adds them for root and for more ranks than cores);
#   - and each pair of numbers agrees. A number is digits with an optional fraction and exponent,
#     not glued to a letter, digit, `_` or `.` before it (so `w1`, `e4m3`, `layers.0` are text).
#     Integers must be equal. Numbers with a fraction or an exponent must agree to a relative
#     1e-5: the loss tolerance of every chapter's parity check, the size of a float32 sum taken
#     in another order (the BLAS kernel decides that order); a changed value, a changed
#     formula or a changed seed moves them by far more.
#   - Except the numbers that depend on the machine, which are not compared (any value passes):
#       T  a time or a rate: a number followed by ms, us, s, tokens/s, tok/s, GFLOP/s, TFLOP/s,
#          GB/s (not in an `output, exact` block);
#       S  a share of time: a percentage after `MFU`, after `idle share`, or closing a list of
#          times (`communication 0.2 ms, 8%`);
#       D  a rounding-level difference: a number in e-notation (`2.819e-07`, `|diff| 4.8e-07`)
#          when both values are below 1e-3. Every tolerance of the parity checks is at most 1e-4,
#          so a real failure still shows in the verdict words beside it (`ok`/`FAIL`), which are
#          text and compared, and in the values it moves; below the tolerances the value is the
#          rounding of this machine's BLAS;
#       N  the tensor a rounding-level difference names: NAME in `worst relative difference D
#          (NAME), after AdamW steps` when D is rounding-level (rule D), and P and NAME in the
#          parameter check's `at most P% of a tensor, NAME; allowed 1%` when P is below the 1%
#          allowed (which elements of which tensor land past lr/10 is the rounding's doing).
#   A reader tells the machine's digits by the same rule: times, rates, shares of time, and
#   differences printed in e-notation below 1e-3 (with the tensor they name) are this machine's;
#   everything else (losses to 1e-5, counts, bytes, formulas, verdicts) is the code's.
#
# REPORTS. --check prints, for each stale block, the README file:line of the first block line
# that did not match, the command, that line and the nearest output line; it exits 1 when a block
# is stale or a reference does not resolve. --update rewrites each block from a new run: every
# line that is not `...` is replaced by the output line it matched (integers and text must still
# match for a line to be aligned; decimals, times and names may change), the `...` and `$ `
# lines are kept; a block whose lines cannot be aligned is reported and left as it is.
#
# REFERENCES. In the READMEs, outside fenced blocks:
#   - every link or image `[x](target)` that is not http(s) or mailto must name a file or folder
#     of the repository (relative to the README), and its `#anchor`, if any, a heading of the
#     target (GitHub's slugs: lower case, punctuation but `-` and `_` dropped, blanks to `-`);
#   - every `code span` that is one word and looks like a repository path must exist: it contains
#     a `/`, no `* < > { } [ ] = $ |`, does not start with `/`, `-` or `~` (flags and example paths
#     such as /tmp/d01), and its first component is an entry of the README's folder or of the
#     repository's top level other than build/ and out/ (generated; a `../` path is taken from the
#     README's folder and must land on such an entry: `../student-01` is beside the repository);
#     a `:LINE` suffix is dropped, and `name.h/.c` stands for name.h and name.c. So bare names
#     (`tp.c`, another project's `train.py`) and the files a run writes (`loss.csv`, `out/NN/...`,
#     `DIR/...`, `/tmp/d01`) are not checked.
import argparse
import concurrent.futures
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ README files and blocks

MARKER_RE = re.compile(r'^<!--\s*(output|measured)((?:\s*,\s*(?:exact|blas\s+\w+))*)\s*:\s*(.*?)\s*-->\s*$')
FENCE_RE = re.compile(r'^(```+|~~~+)')


class Block:
    def __init__(self, path, rel, fence_line, marker_line, kind, quals, text, lines):
        self.path, self.rel = path, rel
        self.fence_line = fence_line          # 1-based line number of the opening fence
        self.marker_line = marker_line        # 1-based, or None
        self.kind = kind
        self.exact = bool(re.search(r'\bexact\b', quals))
        m = re.search(r'\bblas\s+(\w+)', quals)
        self.blas = m.group(1) if m else None
        self.commands = [c for c in (s.strip() for s in re.split(r'\s;\s', text)) if c] if kind == 'output' else []
        self.marker_text = text
        self.lines = lines                    # the block's content lines (no fences)

    def line_no(self, i):                     # README line number of content line i
        return self.fence_line + 1 + i


def readme_files(root, files=None, chapters=None):
    found = []
    if os.path.isfile(os.path.join(root, 'README.md')):
        found.append('README.md')
    for d in sorted(os.listdir(root)):
        if re.match(r'^\d\d_', d) and os.path.isfile(os.path.join(root, d, 'README.md')):
            found.append(d + '/README.md')
        if re.match(r'^\d\d_', d) and os.path.isfile(os.path.join(root, d, 'APPENDIX.md')):
            found.append(d + '/APPENDIX.md')   # a chapter's reference material, checked like its lesson
    if os.path.isfile(os.path.join(root, 'docs', 'performance.md')):
        found.append('docs/performance.md')    # the root README's performance sections
    if files:
        want = set(os.path.normpath(os.path.relpath(os.path.abspath(f), root)) if os.path.exists(f)
                   else os.path.normpath(f) for f in files)
        found = [f for f in found if os.path.normpath(f) in want]
    if chapters:
        found = [f for f in found if f[:2] in chapters or (f in ('README.md', 'docs/performance.md') and 'root' in chapters)]
    return found


def parse_blocks(root, rel):
    path = os.path.join(root, rel)
    with open(path, encoding='utf-8') as fh:
        text = fh.read().split('\n')
    blocks, errors = [], []
    i = 0
    while i < len(text):
        m = FENCE_RE.match(text[i])
        if not m:
            if MARKER_RE.match(text[i]) and not (i + 1 < len(text) and FENCE_RE.match(text[i + 1])):
                errors.append('%s:%d: a marker must be on the line just before a block\'s opening ```' % (rel, i + 1))
            i += 1
            continue
        fence = m.group(1)
        j = i + 1
        while j < len(text) and not text[j].startswith(fence):
            j += 1
        mk = MARKER_RE.match(text[i - 1]) if i > 0 else None
        if mk:
            b = Block(path, rel, i + 1, i, mk.group(1), mk.group(2) or '', mk.group(3), text[i + 1:j])
            if b.kind == 'output' and not b.commands:
                errors.append('%s:%d: an output marker without a command' % (rel, i))
            blocks.append(b)
        i = j + 1
    return blocks, errors, text


# ------------------------------------------------------------------ transcripts

def is_prompt(line):
    return line.startswith('$ ')


def split_transcript(block):
    """[(command or None, [(content index, line)], inline_file)] for the block's commands."""
    lines = block.lines
    if not any(is_prompt(l) for l in lines):
        return None
    sections, i = [], 0
    while i < len(lines) and not is_prompt(lines[i]):
        i += 1          # lines before the first prompt: not allowed, reported by the caller
    pre = i
    while i < len(lines):
        cmd = lines[i][2:]
        while cmd.rstrip().endswith('\\') and i + 1 < len(lines):
            i += 1
            cmd = cmd.rstrip()[:-1] + ' ' + lines[i].strip()
        cmd = re.sub(r'\s{2,}\([^()]*\)\s*$', '', cmd)      # "  (ring, cp 2)": a note
        i += 1
        body = []
        while i < len(lines) and not is_prompt(lines[i]):
            body.append((i, lines[i]))
            i += 1
        sections.append((norm_cmd(cmd), body))
    return pre, sections


def norm_cmd(c):
    return ' '.join(c.replace('\\\n', ' ').split())


# ------------------------------------------------------------------ running commands

class Runner:
    def __init__(self, root, build_root, timeout, verbose=False):
        self.root = root
        br = build_root or os.environ.get('BUILD_ROOT') or 'build'
        self.build = br if os.path.isabs(br) else os.path.join(root, br)
        self.timeout = timeout
        self.verbose = verbose
        self.cache = {}
        self.lock = threading.Lock()
        # One run of a chapter at a time: its runs share the default --out (out/NN), which a
        # run locks while it writes (a second one at once is refused: "another run is writing").
        self.chapter_locks = {nn: threading.Lock() for nn in ('%02d' % i for i in range(100))}
        self.tmp = tempfile.mkdtemp(prefix='readme_outputs.')
        self.work = os.path.join(self.tmp, 'work')
        self.tmpdir = os.path.join(self.tmp, 'tmp')
        os.makedirs(self.work)
        os.makedirs(self.tmpdir)
        for e in os.listdir(root):
            if e in ('out', '.git'):
                continue
            os.symlink(os.path.join(root, e), os.path.join(self.work, e))
        self.mpirun_base = subprocess.run(['bash', os.path.join(root, 'tools/mpirun_base.sh')],
                                          capture_output=True, text=True).stdout.strip()
        self.nproc = os.cpu_count() or 1
        self.blas = blas_core(self.build)

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def chapter_var(self, nn, name):
        d = [x for x in os.listdir(self.root) if x.startswith(nn + '_')]
        if not d:
            return None
        mk = os.path.join(self.root, d[0], 'chapter.mk')
        if not os.path.isfile(mk):
            return None
        for line in open(mk, encoding='utf-8'):
            m = re.match(r'^\s*%s_%s\s*:?=\s*(.*?)\s*$' % (name, nn), line)
            if m:
                return m.group(1)
        return None

    def translate(self, cmd):
        """(argv for bash, text make echoes first or None, what to call the run on failure)"""
        try:
            words = shlex.split(cmd)
        except ValueError:
            words = []
        if len(words) >= 2 and words[0] == 'make' and re.match(r'^run-\d\d$', words[1]):
            nn = words[1][4:]
            np_given, args = None, None
            for w in words[2:]:
                if w.startswith('NP='):
                    np_given = w[3:]
                elif w.startswith('ARGS='):
                    args = w[5:]
                else:
                    raise ValueError('make run-NN takes NP= and ARGS= here, not %r' % w)
            run_np = self.chapter_var(nn, 'RUN_NP')
            flags = self.chapter_var(nn, 'RUN_FLAGS') or '--check'
            if not args:
                args = self.chapter_var(nn, 'RUN_ARGS') or ''
            if run_np:
                launcher = '%s -np %s' % (self.mpirun_base, np_given or run_np)
            else:
                np_ = int(np_given or 2)
                root_flag = '--allow-run-as-root ' if os.getuid() == 0 else ''
                over = '--oversubscribe ' if np_ > self.nproc else ''
                launcher = ('mpirun -q %s%s--mca btl_vader_single_copy_mechanism none '
                            '-x OPENBLAS_NUM_THREADS=1 -np %d' % (root_flag, over, np_))
            echo = ' '.join(('%s build/cpu/%s %s %s' % (launcher, nn, flags, args)).split())
            run = '%s %s %s %s' % (launcher, shlex.quote(os.path.join(self.build, 'cpu', nn)), flags, args)
            return run, echo, 'run-' + nn
        if len(words) == 2 and words[0] == 'make' and re.match(r'^check-\d\d$', words[1]):
            return 'tests/run_checks.sh cpu %s %s' % (words[1][6:], shlex.quote(self.build)), None, None
        c = cmd
        c = re.sub(r'(^|&&\s*|;\s*)mpirun(?=\s)', lambda m: m.group(1) + self.mpirun_base, c)
        c = re.sub(r'(?<![\w/.-])/tmp/', self.tmpdir + '/', c)
        c = re.sub(r'(?<![\w/.-])build/cpu/', self.build.rstrip('/') + '/cpu/', c)
        return c, None, None

    def run(self, cmd):
        """(output lines, exit status, seconds); one run per command, shared by the threads."""
        key = norm_cmd(cmd)
        with self.lock:
            fut = self.cache.get(key)
            mine = fut is None
            if mine:
                fut = self.cache[key] = concurrent.futures.Future()
        if not mine:
            return fut.result()
        try:
            res = self._run(key)
        except BaseException as e:
            fut.set_exception(e)
            raise
        fut.set_result(res)
        return res

    def _run(self, key):
        try:
            bash, echo, what = self.translate(key)
        except ValueError as e:
            return (['error: ' + str(e)], 2, 0.0)
        t0 = time.time()
        env = dict(os.environ, OPENBLAS_NUM_THREADS='1', BUILD_ROOT=self.build, MPIRUN_BASE=self.mpirun_base)
        env.pop('MAKEFLAGS', None)
        # Each run gets Open MPI session directories of its own. With --jobs, mpiruns start and end at
        # once, and the last one out removes the shared /tmp/ompi.HOST.UID: a run creating its pid.N
        # inside it at that moment fails ("ORTE_ERROR_LOG ... session_dir.c", seen once in CI).
        sessions = tempfile.mkdtemp(prefix='o', dir=self.tmp)
        env['OMPI_MCA_orte_tmpdir_base'] = sessions
        chapters = sorted(set(re.findall(r'(?:run-|check-|plot-|bench-|/cpu/)(\d\d)\b', bash)))
        held = [self.chapter_locks[nn] for nn in chapters]   # sorted: no two runs wait on each other
        for l in held:
            l.acquire()
        try:
            p = subprocess.run(['timeout', '-k', '10', str(self.timeout), 'bash', '-c', bash], cwd=self.work,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env)
        finally:
            for l in reversed(held):
                l.release()
            shutil.rmtree(sessions, ignore_errors=True)
        rc = p.returncode
        out = p.stdout.decode('utf-8', 'replace')
        if echo is not None:
            out = echo + '\n' + out
            if rc != 0:
                st = subprocess.run(['bash', os.path.join(self.root, 'tools/exit_status.sh'), str(rc), what],
                                    capture_output=True, text=True).stdout
                out += st
        if rc == 124:
            out += '\n(readme_outputs: timed out after %d s)\n' % self.timeout
        out = out.replace(self.build.rstrip('/') + '/', 'build/').replace(self.tmpdir + '/', '/tmp/')
        out = out.replace(self.tmpdir, '/tmp').replace(self.work + '/', '')
        lines = [l.rstrip() for l in out.split('\n')]
        while lines and lines[-1] == '':
            lines.pop()
        res = (lines, rc, time.time() - t0)
        if self.verbose:
            print('  ran (%.1f s, exit %d): %s' % (res[2], rc, key), file=sys.stderr)
        return res

    def write_inline(self, name, lines):
        path = os.path.join(self.work, name)
        with open(path, 'w', encoding='utf-8') as fh:
            fh.write('\n'.join(lines) + '\n')


def blas_core(build):
    """The kernels OpenBLAS picks for the build's binaries here (openblas_get_corename), or None."""
    import ctypes
    lib = None
    for b in sorted(os.listdir(os.path.join(build, 'cpu'))) if os.path.isdir(os.path.join(build, 'cpu')) else []:
        path = os.path.join(build, 'cpu', b)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            ldd = subprocess.run(['ldd', path], capture_output=True, text=True).stdout
            m = re.search(r'(\S*openblas\S*)\s+=>\s+(\S+)', ldd)
            if m:
                lib = m.group(2)
            break
    try:
        l = ctypes.CDLL(lib or 'libopenblas.so.0')
        l.openblas_get_corename.restype = ctypes.c_char_p
        return l.openblas_get_corename().decode().strip()
    except (OSError, AttributeError):
        return None


def inline_file(root, cmd):
    """`cat FILE` of a file the repository does not have: the block shows the file."""
    w = cmd.split()
    if len(w) == 2 and w[0] == 'cat' and not w[1].startswith('/') and '..' not in w[1] \
            and not os.path.exists(os.path.join(root, w[1])):
        return w[1]
    return None


# ------------------------------------------------------------------ comparing lines

NUM_RE = re.compile(r'(?<![A-Za-z0-9_.])(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?')
TIME_AFTER = re.compile(r'\s*(?:ms|us|µs|s|tokens/s|tok/s|GFLOP/s|TFLOP/s|GB/s)(?![\w/])')
SHARE_BEFORE = re.compile(r'(?:MFU|idle share|ms,)\s*$')
DROP_WORDS = re.compile(r'\s--(?:allow-run-as-root|oversubscribe)(?=\s|$)')
# rule N: the tensor a rounding-level difference names
NAME_RULES = [
    re.compile(r'(worst relative difference )(?P<num>\S+)( \()(?P<name>.*)(\), after AdamW steps)'),
    re.compile(r'(at most )(?P<num>[\d.]+)(% of a tensor, )(?P<name>[^;]*)(; allowed 1%)'),
]
SMALL = 1e-3
REL_TOL = 1e-5
if os.environ.get('READMEOUT_STRICT'):
    SMALL, REL_TOL = 0.0, 0.0


def is_float_text(s):
    return '.' in s or 'e' in s or 'E' in s


def names_free(line):
    """The line with rule N's names cut out when their difference is rounding-level, and the spans."""
    for rx in NAME_RULES:
        m = rx.search(line)
        if m:
            try:
                v = float(m.group('num'))
            except ValueError:
                continue
            if 'e' in m.group('num'):
                if v < SMALL:                 # the difference itself stays a number (rule D)
                    line = line[:m.start('name')] + '*' + line[m.end('name'):]
            elif v < 1.0:                     # below the 1% allowed: the share and the name
                line = line[:m.start('num')] + '*' + line[m.end('num'):m.start('name')] + '*' + line[m.end('name'):]
    return line


class Line:
    __slots__ = ('raw', 'skel', 'nums', 'name_small')

    def __init__(self, raw):
        self.raw = raw
        s = DROP_WORDS.sub('', ' ' + raw)[1:]
        s = names_free(s)
        nums, parts, last = [], [], 0
        for m in NUM_RE.finditer(s):
            parts.append(s[last:m.start()])
            parts.append('#')
            txt = m.group(0)
            before, after = s[:m.start()], s[m.end():]
            kind = 'int'
            if is_float_text(txt):
                kind = 'float'
            if re.search(r'[eE][-+]?\d+$', txt):
                kind = 'enote'
            timeish = bool(TIME_AFTER.match(after))
            share = after.startswith('%') and bool(SHARE_BEFORE.search(before))
            nums.append((txt, float(txt), kind, timeish, share))
            last = m.end()
        parts.append(s[last:])
        self.skel = ' '.join(''.join(parts).split())
        self.nums = nums


def nums_agree(a, b, exact, key_only=False):
    """a from the README, b from the output (Line.nums entries)."""
    if len(a) != len(b):
        return False
    for (ta, va, ka, tim, shr), (tb, vb, kb, _, _) in zip(a, b):
        if not exact and (tim or shr):
            continue
        if ka == 'enote' and kb == 'enote' and abs(va) < SMALL and abs(vb) < SMALL:
            continue
        if ka == 'int' and kb == 'int':
            if va != vb:
                return False
            continue
        if key_only:
            continue
        if va == vb:
            continue
        if abs(va - vb) > REL_TOL * max(abs(va), abs(vb)):
            return False
    return True


def line_match(rl, ol, exact, key_only=False):
    return rl.skel == ol.skel and nums_agree(rl.nums, ol.nums, exact, key_only)


def segments(body):
    """[(run of (index, Line))] between the `...` lines."""
    segs, cur = [], []
    for idx, text in body:
        if text.strip() == '...':
            if cur:
                segs.append(cur)
            cur = []
        else:
            cur.append((idx, Line(text)))
    if cur:
        segs.append(cur)
    return segs


def find_segment(seg, out, start, exact, key_only):
    n = len(seg)
    for p in range(start, len(out) - n + 1):
        if all(line_match(seg[k][1], out[p + k], exact, key_only) for k in range(n)):
            return p
    return None


def align(body, out_lines, exact, key_only=False):
    """Align a section with an output: ([(content index, output index)], None) or (None, failure)."""
    out = [Line(l) for l in out_lines]
    pos, pairs = 0, []
    for seg in segments(body):
        p = None
        if key_only:
            p = find_segment(seg, out, pos, exact, False)
        if p is None:
            p = find_segment(seg, out, pos, exact, key_only)
        if p is None:
            return None, failure(seg, out, pos, exact, key_only)
        pairs += [(seg[k][0], p + k) for k in range(len(seg))]
        pos = p + len(seg)
    return pairs, None


def failure(seg, out, start, exact, key_only):
    """(content index of the first line that did not match, the nearest output line or None)"""
    best_len, best_p = -1, None
    for p in range(start, len(out)):
        k = 0
        while k < len(seg) and p + k < len(out) and line_match(seg[k][1], out[p + k], exact, key_only):
            k += 1
        if k > best_len and k > 0:
            best_len, best_p = k, p
    if best_p is not None and best_len < len(seg):
        k = best_len
        near = out[best_p + k].raw if best_p + k < len(out) else '(the output ends here)'
        return seg[k][0], near
    # no line of the run matched anywhere: the output line most like its first line
    first = seg[0][1].raw
    cands = [o.raw for o in out[start:]] or [o.raw for o in out]
    near = None
    best = 0.0
    for c in cands:
        sm = difflib.SequenceMatcher(None, first, c, autojunk=False)
        if sm.real_quick_ratio() <= best or sm.quick_ratio() <= best:
            continue
        r = sm.ratio()
        if r > best:
            best, near = r, c
    return seg[0][0], near if near is not None else '(no output)'


# ------------------------------------------------------------------ references

SKIP_TOP = {'build', 'out', '.git'}


def slugify(heading):
    h = heading.strip().lower()
    h = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', h)
    h = h.replace('`', '')
    h = re.sub(r'[^\w\- ]', '', h)
    return h.replace(' ', '-')


_slug_cache = {}


def outside_fences(lines):
    """(line number from 1, line) for each line of markdown outside ``` / ~~~ code fences."""
    fence = None
    for ln, line in enumerate(lines, 1):
        m = FENCE_RE.match(line)
        if m:
            fence = None if fence and line.startswith(fence) else (fence or m.group(1))
        elif not fence:
            yield ln, line


def anchors(path):
    if path not in _slug_cache:
        seen, slugs = {}, set()
        with open(path, encoding='utf-8') as f:
            prose = [line for _, line in outside_fences(f)]
        for line in prose:
            m = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
            if m:
                s = slugify(m.group(1))
                n = seen.get(s, 0)
                slugs.add(s if n == 0 else '%s-%d' % (s, n))
                seen[s] = n + 1
        _slug_cache[path] = slugs
    return _slug_cache[path]


def inside(root, path):
    r = os.path.realpath(root)
    p = os.path.realpath(path)
    return p == r or p.startswith(r + os.sep)


def check_refs(root, rel, text):
    """[(line, reference, problem)] and the number of references checked."""
    base = os.path.dirname(os.path.join(root, rel))
    problems, n = [], 0
    top = set(os.listdir(root)) - SKIP_TOP
    here = set(os.listdir(base))
    for ln, line in outside_fences(text):
        spans = re.findall(r'(?<!`)`([^`]+)`(?!`)', line)
        bare = re.sub(r'`[^`]*`', '``', line)
        for target in re.findall(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', bare):
            if re.match(r'^(https?:|mailto:)', target):
                continue
            n += 1
            path, _, anchor = target.partition('#')
            full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(root, rel)
            if not inside(root, full) or not os.path.exists(full):
                problems.append((ln, target, 'no such file or folder in the repository'))
            elif anchor and full.endswith('.md') and anchor not in anchors(full):
                problems.append((ln, target, 'no heading with the anchor #%s in %s' % (anchor, os.path.relpath(full, root))))
        for s in spans:
            s = s.strip()
            if not s or re.search(r'\s', s) or s[0] in '/-~' or re.search(r'[*<>{}\[\]=$|]', s) or '://' in s:
                continue
            s = re.sub(r'(:\d+)+$', '', s).rstrip(',;:')
            paths = []
            if '/' in s:
                m = re.match(r'^(.*)\.(\w+)/\.(\w+)$', s)
                cand = ['%s.%s' % (m.group(1), m.group(2)), '%s.%s' % (m.group(1), m.group(3))] if m else [s]
                for c in cand:
                    first = c.split('/')[0]
                    if first in ('..', '.'):
                        full = os.path.normpath(os.path.join(base, c))
                        if inside(root, full) and os.path.relpath(full, root).split(os.sep)[0] in top:
                            paths.append(full)
                    elif first in here and base != root:
                        paths.append(os.path.normpath(os.path.join(base, c)))
                    elif first in top:
                        paths.append(os.path.normpath(os.path.join(root, c)))
                for p in paths:
                    n += 1
                    if not os.path.exists(p):
                        problems.append((ln, s, 'no such file or folder in the repository'))
    return problems, n


# ------------------------------------------------------------------ the checks

QUICK_SKIP_NOTE = ('--quick skips the blocks whose commands take long here: make check-NN, '
                   'tests/run_checks.sh, and runs on 8 ranks')


def expensive(cmd):
    c = norm_cmd(cmd)
    if re.match(r'^make check-\d\d$', c) or 'run_checks.sh' in c:
        return True
    if re.search(r'(^|\s)-np\s+8\b', c) or re.search(r'\bNP=8\b', c):
        return True
    if re.match(r'^make run-08\b', c) and 'NP=' not in c and '--plan' not in c:
        return True
    return False


def block_commands_ok(b, root):
    """For a transcript: its $ lines must be the marker's commands, in order."""
    t = split_transcript(b)
    if t is None:
        return None, [(None, [(i, l) for i, l in enumerate(b.lines)])]
    pre, sections = t
    if pre:
        return 'lines before the first `$ ` line of a transcript (line %d)' % b.line_no(0), None
    cmds = [norm_cmd(c) for c in b.commands]
    got = [c for c, _ in sections]
    if cmds != got:
        return ('the marker\'s commands (%s) are not the block\'s `$ ` lines (%s)'
                % (' ; '.join(cmds), ' ; '.join(got))), None
    return None, sections


def process(args):
    root = os.path.abspath(args.root)
    files = readme_files(root, args.file, args.chapter)
    if not files:
        print('readme_outputs: no README matched', file=sys.stderr)
        return 2
    all_blocks, errors, texts = [], [], {}
    if args.block:
        bfile, _, bline = args.block.rpartition(':')
        files = [f for f in files if os.path.normpath(f) == os.path.normpath(bfile)]
        if not files or not bline.isdigit():
            print('readme_outputs: --block wants README:LINE, one of ' + ', '.join(readme_files(root)), file=sys.stderr)
            return 2
    for f in files:
        blocks, errs, text = parse_blocks(root, f)
        if args.block:
            n = int(bline)
            blocks = [b for b in blocks if b.fence_line - 1 <= n <= b.fence_line + len(b.lines) + 1]
        all_blocks += blocks
        errors += errs
        texts[f] = text
    for e in errors:
        print('ERROR ' + e)

    if args.list:
        for b in all_blocks:
            tag = b.kind + (', exact' if b.exact else '') + (', blas ' + b.blas if b.blas else '')
            skip = ' (skipped by --quick)' if b.kind == 'output' and any(expensive(c) for c in b.commands) else ''
            print('%s:%d  %s%s: %s' % (b.rel, b.fence_line, tag, skip, b.marker_text))
        return 0

    n_refs, ref_problems = 0, []
    if not args.no_refs:
        for f in files:
            probs, n = check_refs(root, f, texts[f])
            n_refs += n
            ref_problems += [(f, ln, ref, why) for ln, ref, why in probs]
        for f, ln, ref, why in ref_problems:
            print('BROKEN %s:%d: %s: %s' % (f, ln, ref, why))
    if args.refs:
        print('readme: %d references in %d files, %d do not resolve' % (n_refs, len(files), len(ref_problems)))
        return 1 if ref_problems or errors else 0

    runner = Runner(root, args.build_root, args.timeout, args.verbose)
    if args.save_outputs:
        os.makedirs(args.save_outputs, exist_ok=True)
    checked = stale = skipped = measured = updated = unaligned = 0
    t0 = time.time()

    def gather(b):
        """Run a block's commands (in order): (problem, [(command, section, output lines)])."""
        problem, sections = block_commands_ok(b, root)
        if problem:
            return problem, None
        if sections[0][0] is None:
            outs = []
            for c in b.commands:
                outs += runner.run(c)[0]
            return None, [(' ; '.join(b.commands), sections[0][1], outs)]
        plan = []
        for c, body in sections:
            name = inline_file(root, c)
            if name:
                runner.write_inline(name, [l for _, l in body])
                continue
            plan.append((c, body, runner.run(c)[0]))
        return None, plan

    todo, other_blas = [], 0
    for b in all_blocks:
        if b.kind == 'measured':
            measured += 1
        elif args.quick and any(expensive(c) for c in b.commands):
            skipped += 1
        elif b.blas and b.blas.lower() != (runner.blas or '').lower():
            other_blas += 1
            if args.verbose or args.update:
                print('SKIPPED %s:%d: recorded with OpenBLAS\'s %s kernels, this build runs %s'
                      % (b.rel, b.fence_line, b.blas, runner.blas or 'an unknown BLAS'))
        else:
            todo.append(b)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(gather, b) for b in todo]
            for b, fut in zip(todo, futures):
                problem, plan = fut.result()
                if problem:
                    checked += 1
                    stale += 1
                    unaligned += 1
                    print('STALE %s:%d: %s' % (b.rel, b.fence_line, problem))
                    continue
                checked += 1
                if args.save_outputs:
                    with open(os.path.join(args.save_outputs, '%s_%d.txt' % (b.rel.replace('/', '_'), b.fence_line)), 'w') as fh:
                        for c, body, outs in plan:
                            fh.write('$ %s\n%s\n' % (c, '\n'.join(outs)))
                bad = None
                for c, body, outs in plan:
                    pairs, fail = align(body, outs, b.exact)
                    if fail:
                        bad = (c, fail)
                        break
                if args.update:
                    new = list(b.lines)
                    ok = True
                    for c, body, outs in plan:
                        pairs, fail = align(body, outs, b.exact, key_only=True)
                        if fail:
                            ok = False
                            idx, near = fail
                            unaligned += 1
                            print('UNALIGNED %s:%d: not rewritten\n  command: %s\n  README:  %s\n  output:  %s'
                                  % (b.rel, b.line_no(idx), c, b.lines[idx], near))
                            break
                        for idx, o in pairs:
                            new[idx] = outs[o]
                    if ok and new != b.lines:
                        text = texts[b.rel]
                        text[b.fence_line:b.fence_line + len(b.lines)] = new
                        b.lines = new
                        updated += 1
                        print('UPDATED %s:%d' % (b.rel, b.fence_line))
                    elif not ok:
                        stale += 1
                elif bad:
                    stale += 1
                    c, (idx, near) = bad
                    print('STALE %s:%d (block at line %d)\n  command: %s\n  README:  %s\n  output:  %s'
                          % (b.rel, b.line_no(idx), b.fence_line, c, b.lines[idx], near))
    finally:
        runner.close()
    if args.update:
        for f in files:
            path = os.path.join(root, f)
            new = '\n'.join(texts[f])
            if open(path, encoding='utf-8').read() != new:
                with open(path, 'w', encoding='utf-8') as fh:
                    fh.write(new)
        print('readme: %d blocks run, %d rewritten, %d could not be aligned; %d measured blocks and %d of another BLAS kernel left as they are'
              % (checked, updated, unaligned, measured, other_blas))
        return 1 if unaligned or errors else 0
    runs = len(runner.cache)
    secs = time.time() - t0
    msg = 'readme: %d output blocks in %d files match (%d runs, %.0f s)' % (checked - stale, len(files), runs, secs)
    if stale:
        msg = 'readme: %d of %d output blocks stale in %d files (%d runs, %.0f s)' % (stale, checked, len(files), runs, secs)
    if skipped:
        msg += ', %d slow ones skipped (make check-readme runs them)' % skipped
    if other_blas:
        msg += ', %d for another BLAS kernel skipped' % other_blas
    msg += ', %d measured ones not run' % measured
    if not args.no_refs:
        msg += ', %d references %s' % (n_refs, 'resolve' if not ref_problems else 'checked, %d broken' % len(ref_problems))
    print(msg)
    return 1 if stale or ref_problems or errors else 0


def main():
    ap = argparse.ArgumentParser(description='check (or rewrite) the README output blocks from real runs')
    g = ap.add_mutually_exclusive_group()
    g.add_argument('--check', action='store_true', help='compare every output block with a real run (default)')
    g.add_argument('--update', action='store_true', help='rewrite the output blocks from real runs')
    g.add_argument('--list', action='store_true', help='list the marked blocks')
    g.add_argument('--refs', action='store_true', help='only check the references')
    ap.add_argument('--file', action='append', help='only this README (repeatable)')
    ap.add_argument('--chapter', action='append', help='only chapter NN\'s README (repeatable; "root" for README.md)')
    ap.add_argument('--block', metavar='README:LINE', help='only the block at that line (its marker, fences or content)')
    ap.add_argument('--root', default=os.path.dirname(HERE), help='the repository (default: this script\'s)')
    ap.add_argument('--build-root', default=None, help='the build to run (default: $BUILD_ROOT or build)')
    ap.add_argument('--timeout', type=int, default=600, help='seconds per command (default 600)')
    ap.add_argument('--quick', action='store_true', help=QUICK_SKIP_NOTE)
    ap.add_argument('--jobs', type=int, default=1, help='blocks run at once (default 1; a refused input mostly waits for mpirun)')
    ap.add_argument('--no-refs', action='store_true', help='do not check the references')
    ap.add_argument('--save-outputs', metavar='DIR', help='write each block\'s real output to DIR')
    ap.add_argument('--verbose', action='store_true', help='print each command run, with its time')
    args = ap.parse_args()
    if args.chapter:
        args.chapter = ['%02d' % int(c) if c.isdigit() else c for c in args.chapter]
    sys.exit(process(args))


if __name__ == '__main__':
    main()
