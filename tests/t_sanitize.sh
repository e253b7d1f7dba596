#!/usr/bin/env bash
# t_sanitize.sh: the quick part of `make sanitize` inside `make test`: every unit test on its
# smallest rank count and chapter 00's two layouts, built with ASan + UBSan + LeakSanitizer
# (tests/sanitize.sh quick). Any sanitizer report fails it. The last line is the summary.
cd "$(dirname "$0")/.." && exec tests/sanitize.sh quick
