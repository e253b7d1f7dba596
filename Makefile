# The one entry point of the tutorial. `make help` lists the targets.
#
#   make deps            install what is missing (Debian/Ubuntu packages)
#   make run-00          build chapter 00 and run it on NP ranks (default 2) beside its baseline
#   make check-00        the chapter's parity check on each of its standard layouts
#   make plot-00         gnuplot PNGs of what the chapter measured
#   make test            every unit test and every chapter check; last line "N passed, N failed"
#   make cuda            compile and link every CUDA source with nvcc (sm_75, sm_80, sm_90 + PTX), warnings as errors
#   make sanitize        the unit tests and chapter layouts under ASan + UBSan + LeakSanitizer
#   make bench           every technique against one rank, beside its bound (never part of `make test`)
#   make bench-01        a benchmark (never part of `make test`)

SHELL := /bin/bash
.DEFAULT_GOAL := all

# ---------------------------------------------------------------- configuration
CUDA_HOME ?= $(if $(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda,$(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)))
NVCC      := $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,)
HAVE_NVCC := $(if $(wildcard $(NVCC)),yes,)
HAVE_GPU  := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)
# The default backend is cuda only where a cuda build can be made and run: a GPU visible, nvcc
# found, and a driver new enough for the CUDA 13 runtime the binaries link (>= 580; with an older
# one, or none, the first CUDA call fails). Anything less builds cpu, and BACKEND_WHY says why
# (the banner's first line). A BACKEND given by the user is kept whatever was found.
CUDA_MIN_DRIVER := 580
GPU_DRIVER := $(if $(HAVE_GPU),$(shell nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | tr -d ' '))
DRIVER_OK  := $(if $(GPU_DRIVER),$(shell [ "$(firstword $(subst ., ,$(GPU_DRIVER)))" -ge $(CUDA_MIN_DRIVER) ] 2>/dev/null && echo yes))
ifeq ($(HAVE_GPU),)
BACKEND_AUTO := cpu
BACKEND_AUTO_WHY := no GPU visible
else ifeq ($(HAVE_NVCC),)
BACKEND_AUTO := cpu
BACKEND_AUTO_WHY := GPU found but nvcc missing (set CUDA_HOME)
else ifeq ($(DRIVER_OK),)
BACKEND_AUTO := cpu
BACKEND_AUTO_WHY := GPU found but driver $(or $(GPU_DRIVER),version unknown) < $(CUDA_MIN_DRIVER) (CUDA 13 needs >= $(CUDA_MIN_DRIVER))
else
BACKEND_AUTO := cuda
BACKEND_AUTO_WHY := GPU, nvcc and driver $(GPU_DRIVER) found
endif
BACKEND   ?= $(BACKEND_AUTO)
# "given": on the command line, in the environment, or a local.mk choice other than the default
BACKEND_WHY = $(if $(or $(filter-out file,$(origin BACKEND)),$(filter-out $(BACKEND_AUTO),$(BACKEND))),BACKEND=$(BACKEND) given,$(BACKEND_AUTO_WHY))
NP        ?= 2
ARGS      ?=
# COMM picks the collectives at run time (common/backend/comm.h): mpi, nccl (CUDA build, one
# rank per GPU) or nccl-sim (CPU build: NCCL's ordering rules enforced over MPI); unset, each
# program picks (nccl on the CUDA build when every rank has its own GPU, else mpi). Exported, so
# `make check-05 COMM=nccl-sim` reaches the ranks.
ifneq ($(COMM),)
export COMM
endif
NPROC     := $(shell nproc 2>/dev/null || echo 1)

ifneq ($(shell [ "$(NP)" -ge 1 ] 2>/dev/null && echo ok),ok)
$(error NP=$(NP) is not valid: use the number of ranks, NP=1 or more)
endif
# Quiet builds: one short line per file; V=1 prints the whole commands.
ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @echo "  $(1) $(2)"
endif
ifeq ($(filter $(BACKEND),cpu cuda),)
$(error BACKEND=$(BACKEND) is not valid: use BACKEND=cpu or BACKEND=cuda)
endif
# BACKEND=cuda without nvcc: one line and exit 2 here, rather than the C files compiled first and
# then a recipe that runs the nvcc flags as a command (or, NVCC being empty, ignores the error
# of "-std=c++17 ..."). Goals that build nothing with BACKEND are let through.
NO_BACKEND_GOALS := help clean deps deps-check deps-check-test banner readme-outputs check-readme sanitize assignment-% grade gpu-check gpu-bundle
ifeq ($(BACKEND)$(HAVE_NVCC),cuda)
ifneq ($(filter-out $(NO_BACKEND_GOALS),$(or $(MAKECMDGOALS),all)),)
$(error BACKEND=cuda needs nvcc, $(if $(NVCC),not found at $(NVCC),not found (no /usr/local/cuda/bin/nvcc and none on PATH)): set CUDA_HOME to the CUDA Toolkit or build with BACKEND=cpu)
endif
endif

BUILD_ROOT ?= build
BUILD     := $(BUILD_ROOT)/$(BACKEND)
CC        := mpicc
# -O3 vectorizes the element-wise loops (AdamW, the norms, the softmax's backward: 4.5% of a step
# at bench-baseline's size ran in 1.5%); -fno-math-errno lets sqrtf be one instruction instead of a
# call that may set errno, which kept those loops scalar. Neither reorders a sum (that would take
# -ffast-math): the numbers are the same as at -O2, bit for bit. -fopenmp-simd (below, always on)
# honours the `#pragma omp simd reduction` of the softmax loops (llama_kernels_cpu.c) and nothing
# else: no OpenMP runtime, no threads. Those reductions do split their sums into partial sums,
# at -O1 and above alike (the same bits at -O1, -O2, -O3; an -O0 build differs in the last bits). With glibc's vector expf (common/kernels/vector_math_cpu.h)
# it took the element-wise passes from 146 to 66 ms of bench-baseline's step.
CFLAGS    ?= -O3 -g -fno-math-errno
-include local.mk
WERROR    ?= -Werror
# OpenBLAS's own cblas.h and library, as tools/blas.sh finds them (pkg-config, else OpenBLAS's
# header directory): <cblas.h> alone may be the reference BLAS's, which has no openblas_* calls.
# Worked out once, on first use (after deps-check has installed OpenBLAS if it was missing);
# `make BLAS_CFLAGS=-I... BLAS_LIBS=...` sets them by hand.
BLAS_CFLAGS ?= $(eval BLAS_CFLAGS := $(shell tools/blas.sh cflags))$(BLAS_CFLAGS)
BLAS_LIBS   ?= $(eval BLAS_LIBS := $(shell tools/blas.sh libs))$(BLAS_LIBS)
# What every compile adds to CFLAGS, kept apart from it: a CFLAGS from the environment (CFLAGS=-O1
# make check-03) is exported to the recursive makes, and appending to it there would hand them
# this rule's -DREPO_ROOT twice (a redefinition, an error under -Werror).
BUILD_CFLAGS = $(CFLAGS) -fopenmp-simd -DREPO_ROOT='"$(CURDIR)"' -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wno-unused-parameter $(COMMON_INC) $(BLAS_CFLAGS) -MMD -MP
LDLIBS_CPU   = $(LDFLAGS) $(BLAS_LIBS) -ldnnl -lgomp -lcjson -lz -lm -lpthread
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
LDLIBS_CUDA := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcublas -lnccl -lcudart -lstdc++ -lcjson -lz -lm -lpthread
MPI_CFLAGS  := $(shell mpicc --showme:compile 2>/dev/null)
# Machine code for Turing (sm_75: T4), Ampere (sm_80: A100) and Hopper (sm_90: H100), plus the PTX
# of compute_90, the newest in the list: a newer GPU (Blackwell, sm_100/sm_120) has no machine
# code here, and its driver JIT-compiles that PTX at the first launch instead of failing with
# "no kernel image is available". Other GPUs between these (sm_86, sm_89) run sm_80's code. (The
# quotes keep the shell from reading [...] as a file pattern.)
CUDA_ARCHS  := -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
               -gencode 'arch=compute_90,code=[sm_90,compute_90]'
NVCCFLAGS   = -std=c++17 -O2 $(CUDA_ARCHS) $(COMMON_INC) -I$(CUDA_HOME)/include $(MPI_CFLAGS) \
               -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter

# mpirun: root needs --allow-run-as-root; more ranks than cores need --oversubscribe.
# Each CPU rank uses one BLAS thread (the ranks are the parallelism). On a CPU with AVX-512
# that OpenBLAS takes for an AVX2 one, the runs select its AVX-512 kernels (tools/blas.sh
# coretype; the banner says so; OPENBLAS_CORETYPE=... make ... overrides).
BLAS_CORETYPE := $(shell tools/blas.sh coretype)
MPIRUN := mpirun -q $(if $(filter 0,$(shell id -u)),--allow-run-as-root,) \
          $(if $(shell [ $(NP) -gt $(NPROC) ] 2>/dev/null && echo y),--oversubscribe,) \
          --mca btl_vader_single_copy_mechanism none -x OPENBLAS_NUM_THREADS=1 \
          $(if $(BLAS_CORETYPE),-x OPENBLAS_CORETYPE=$(BLAS_CORETYPE),) -np $(NP)
export MPIRUN_BASE := $(shell tools/mpirun_base.sh)

# ---------------------------------------------------------------- sources
# common/: *_cpu.c are the CPU twins, *.cu the CUDA twins, every other .c is shared.
# common/ is split by role into layers, bottom up, each using only itself and the ones before it:
# backend/ (device memory, GEMM, collectives, rank-0 printing: the CPU/CUDA twins), kernels/ (the
# math of each layer, twins too), parallel/ (the device mesh and how a tensor splits over it),
# model/ (the Llama model written once, its parameter table and the plan of operators it runs
# under), harness/ (flags, step loop, parity, reports, files, exports); the chapters above them
# all. tests/t_layers.sh fails on an include or a link that points up or sideways.
COMMON_DIRS   := $(sort $(dir $(wildcard common/*/*.h)))
COMMON_SHARED := $(filter-out %_cpu.c,$(wildcard common/*/*.c))
COMMON_CPU    := $(wildcard common/*/*_cpu.c)
COMMON_CU     := $(wildcard common/*/*.cu)
COMMON_INC    := $(patsubst %/,-I%,$(COMMON_DIRS))
CHAPTERS      := $(sort $(patsubst %/main.c,%,$(wildcard [0-9][0-9]_*/main.c)))
TESTS_C       := $(wildcard tests/test_*.c)
TOOLS_C       := $(wildcard tools/bench_*.c)   # measuring programs (make bench-baseline), built like the tests

COMMON_OBJS_cpu  := $(patsubst %.c,$(BUILD_ROOT)/cpu/%.o,$(COMMON_SHARED) $(COMMON_CPU))
COMMON_OBJS_cuda := $(patsubst %.c,$(BUILD_ROOT)/cuda/%.o,$(COMMON_SHARED)) $(patsubst %.cu,$(BUILD_ROOT)/cuda/%.o,$(COMMON_CU))
LDLIBS_cpu   = $(LDLIBS_CPU)
LDLIBS_cuda := $(LDLIBS_CUDA)

# A chapter's binary: its own files plus the technique files of earlier chapters it names in
# its chapter.mk (e.g. LINKS_02 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c;
# TECHNIQUE_NN there says which of a chapter's files a later one may use).
# A chapter may own CUDA code as common/ does: a kernel's CUDA twin X_cuda.cu beside its CPU twin
# X_cpu.c, sharing the header X.h. The CPU build compiles the folder's .c files and leaves its .cu
# files out; the CUDA build compiles its .cu files with nvcc and leaves its *_cpu.c files out. A
# later chapter links such a kernel by naming X_cpu.c in its LINKS, which the CUDA build reads as
# X_cuda.cu. chapter_srcs DIR BACKEND: the sources of chapter DIR's binary on that backend.
-include $(sort $(wildcard [0-9][0-9]_*/chapter.mk))
chapter_num  = $(firstword $(subst _, ,$(1)))
chapter_own_cpu  = $(wildcard $(1)/*.c)
chapter_own_cuda = $(filter-out %_cpu.c,$(wildcard $(1)/*.c)) $(wildcard $(1)/*.cu)
chapter_links_cpu  = $(LINKS_$(1))
chapter_links_cuda = $(patsubst %_cpu.c,%_cuda.cu,$(LINKS_$(1)))
chapter_srcs = $(call chapter_own_$(2),$(1)) $(call chapter_links_$(2),$(call chapter_num,$(1)))
chapter_dir  = $(filter $(1)_%,$(CHAPTERS))
# objs BACKEND SOURCES: their object files (a .c and a .cu alike)
objs = $(patsubst %,$(BUILD_ROOT)/$(1)/%.o,$(basename $(2)))

# ---------------------------------------------------------------- build rules
$(BUILD_ROOT)/cpu/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(BUILD_CFLAGS) -c $< -o $@

$(BUILD_ROOT)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(BUILD_CFLAGS) -c $< -o $@

$(BUILD_ROOT)/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD_ROOT)/cpu/libcommon.a: $(COMMON_OBJS_cpu)
	$(Q)ar rcs $@ $^
$(BUILD_ROOT)/cuda/libcommon.a: $(COMMON_OBJS_cuda)
	$(Q)ar rcs $@ $^

define chapter_rule
$(1)_NUM := $(call chapter_num,$(1))
$(BUILD_ROOT)/$(2)/$$($(1)_NUM): $$(call objs,$(2),$$(call chapter_srcs,$(1),$(2))) $(BUILD_ROOT)/$(2)/libcommon.a
	$$(call say,LINK,$$@)
	$(Q)$$(CC) $$^ -o $$@ $$(LDLIBS_$(2))
endef
$(foreach c,$(CHAPTERS),$(eval $(call chapter_rule,$(c),cpu)))
$(foreach c,$(CHAPTERS),$(eval $(call chapter_rule,$(c),cuda)))

# A unit test links libcommon.a and, when a chapter's chapter.mk names it in TESTS_NN (a chapter's
# logic tested on its own), that chapter's sources but its main.c: its own files and its LINKS_NN.
test_chapter = $(firstword $(foreach c,$(CHAPTERS),$(if $(filter $(1),$(TESTS_$(call chapter_num,$(c)))),$(c))))
test_srcs    = $(if $(call test_chapter,$(1)),$(filter-out %/main.c,$(call chapter_srcs,$(call test_chapter,$(1)),$(2))))

define test_rule
$(BUILD_ROOT)/$(2)/$(3)/$(1): $(BUILD_ROOT)/$(2)/$(3)/$(1).o $$(call objs,$(2),$$(call test_srcs,$(1),$(2))) $(BUILD_ROOT)/$(2)/libcommon.a
	$$(call say,LINK,$$@)
	$(Q)$$(CC) $$^ -o $$@ $$(LDLIBS_$(2))
endef
$(foreach t,$(basename $(notdir $(TESTS_C))),$(eval $(call test_rule,$(t),cpu,tests)))
$(foreach t,$(basename $(notdir $(TESTS_C))),$(eval $(call test_rule,$(t),cuda,tests)))
$(foreach t,$(basename $(notdir $(TOOLS_C))),$(eval $(call test_rule,$(t),cpu,tools)))
$(foreach t,$(basename $(notdir $(TOOLS_C))),$(eval $(call test_rule,$(t),cuda,tools)))

CHAPTER_BINS = $(foreach c,$(CHAPTERS),$(BUILD_ROOT)/$(1)/$(call chapter_num,$(c)))
TEST_BINS    = $(foreach t,$(basename $(notdir $(TESTS_C))),$(BUILD_ROOT)/$(1)/tests/$(t)) \
               $(foreach t,$(basename $(notdir $(TOOLS_C))),$(BUILD_ROOT)/$(1)/tools/$(t))

.PHONY: bench bench-baseline bench-grade all cuda banner deps deps-check deps-check-test test sanitize clean help
all: banner deps-check $(call CHAPTER_BINS,$(BACKEND)) $(call TEST_BINS,$(BACKEND))

# `make cuda`: every .cu through nvcc for sm_75, sm_80 and sm_90 (plus compute_90 PTX, CUDA_ARCHS)
# with warnings as errors, and every chapter and test linked against cuBLAS, cuBLASLt and NCCL.
# Runs without a GPU.
cuda:
	@if [ -z "$(HAVE_NVCC)" ]; then echo "make cuda: nvcc not found (set CUDA_HOME); nothing to build"; exit 1; fi
	$(MAKE) --no-print-directory BACKEND=cuda $(call CHAPTER_BINS,cuda) $(call TEST_BINS,cuda)
	@echo "make cuda: every CUDA source compiled (sm_75, sm_80, sm_90 + compute_90 PTX, -Werror) and every binary linked"

banner:
	@./tools/banner.sh "$(BACKEND)" "$(NVCC)" "$(BACKEND_WHY)"

# ---------------------------------------------------------------- dependencies
deps:
	@BACKEND=$(BACKEND) ./tools/deps.sh install
deps-check:
	@BACKEND=$(BACKEND) ./tools/deps.sh check core >/dev/null || BACKEND=$(BACKEND) ./tools/deps.sh install core
deps-check-test:
	@BACKEND=$(BACKEND) ./tools/deps.sh check all >/dev/null || BACKEND=$(BACKEND) ./tools/deps.sh install all

# ---------------------------------------------------------------- running chapters
# make run-NN [NP=2] [ARGS="..."]: one mpirun of chapter NN with its parity check on.
# A failed run ends with one line saying what its exit status means (tools/exit_status.sh; the
# README's "Exit statuses"): make itself then says "Error N" with the run's status N. mpirun runs
# under tools/signal_status.sh, so an interrupted run ends with 128 + the signal (130 SIGINT, 143
# SIGTERM, 129 SIGHUP, 131 SIGQUIT) where Open MPI's mpirun alone exits 1; and make's own pid is
# watched (WATCH_PID: the recipe shell's parent), so that killing make alone ends the ranks too.
# A chapter number that does not exist is answered before anything is built.
CHAPTER_NUMS = $(foreach c,$(CHAPTERS),$(call chapter_num,$(c)))
chapter-exists-%:
	@[ -n "$(call chapter_dir,$*)" ] || { echo "no chapter $* yet; available: $(CHAPTER_NUMS)"; exit 2; }
# A chapter may set its own run in its chapter.mk: RUN_NP_NN (the ranks when NP is not given),
# RUN_FLAGS_NN (instead of --check) and RUN_ARGS_NN (when ARGS is not given); chapter 08 trains
# on 8 ranks without the baseline.
run_np   = $(if $(filter command line environment,$(origin NP)),$(NP),$(or $(RUN_NP_$(1)),$(NP)))
run_cmd  = $(if $(RUN_NP_$(1)),$(MPIRUN_BASE) -np $(call run_np,$(1)),$(MPIRUN)) $(BUILD)/$(1) \
           $(if $(RUN_FLAGS_$(1)),$(RUN_FLAGS_$(1)),--check) $(or $(ARGS),$(RUN_ARGS_$(1)))
run-%: chapter-exists-% all
	@d=$(call chapter_dir,$*); [ -n "$$d" ] || { echo "no chapter $* (have: $(CHAPTERS))"; exit 2; }
	@echo "$(strip $(call run_cmd,$*))"
	@WATCH_PID=$$PPID tools/signal_status.sh $(call run_cmd,$*) || { st=$$?; tools/exit_status.sh $$st run-$* >&2; exit $$st; }

# make test-NN: one chapter's tests, quickly: its unit tests (TESTS_NN) on their rank counts and
# its layouts under MPI and under the NCCL emulation (make test runs everything, the scripts too).
test-%: chapter-exists-% all
	@TEST_CHAPTER=$* UNIT_TESTS="$(TESTS_$*)" ./tests/run_tests.sh $(BACKEND) ""

# make check-NN: the chapter's standard layouts (its checks.txt), non-zero exit on failure. Builds
# what they run and nothing else (make build-NN: the chapter's binary and the unit tests its
# checks.txt names), so a student's make check-NN and make grade's sandboxes skip the other chapters.
check_units = $(shell awk '$$2 == "unit" {print $$3}' $(call chapter_dir,$(1))/checks.txt 2>/dev/null)
build-%: chapter-exists-% banner deps-check
	@$(MAKE) --no-print-directory $(BUILD)/$* $(foreach t,$(call check_units,$*),$(BUILD)/tests/$(t))
check-%: build-%
	@./tests/run_checks.sh $(BACKEND) $* $(BUILD_ROOT)

# make plot-NN: gnuplot PNGs of what the chapter measured, under out/NN/. A chapter with a
# plot.sh runs the layouts it needs itself; otherwise its plot.gp draws the CSV of `make run-NN`.
plot-%: chapter-exists-% all
	@d=$(call chapter_dir,$*); [ -f $$d/plot.gp ] || { echo "chapter $* has no plot"; exit 2; }
	@command -v gnuplot >/dev/null || ./tools/deps.sh install
	@d=$(call chapter_dir,$*); if [ -x $$d/plot.sh ]; then \
	    MPIRUN="$(MPIRUN_BASE)" $$d/plot.sh $(BUILD)/$* out/$*; \
	 else \
	    [ -n "$$(ls out/$*/*.csv 2>/dev/null)" ] || $(MAKE) --no-print-directory run-$*; \
	    gnuplot -e "outdir='out/$*'" $$d/plot.gp; \
	 fi
	@ls out/$*/*.png

# make assignment-NN [DEST=../student-NN]: a student copy with chapter NN's exercises removed,
# written outside the repository (beside it by default): a copy inside it would sit next to the
# solutions.
assignment-%:
	@./tools/make_assignment.sh $* $(or $(DEST),$(abspath $(CURDIR)/../student-$*))

# make grade DIR=submissions/ [CSV=DIR/grades.csv] [JOBS=N]: every student copy in DIR (a folder
# made by make assignment-NN, edited by a student) built and graded per exercise as its make
# check-NN grades it, with this tutorial's graders; one CSV of the points (tools/grade_many.sh).
# JOBS=N grades N submissions at once, each in its own sandbox (make's own -j does not reach a
# recipe's script); the CSV is the same as one at a time.
.PHONY: grade
grade:
	@JOBS="$(or $(JOBS),1)" ./tools/grade_many.sh "$(DIR)" "$(or $(CSV),$(DIR)/grades.csv)" $(BACKEND)

bench-%: chapter-exists-% all
	@d=$(call chapter_dir,$*); [ -x $$d/bench.sh ] || { echo "chapter $* has no benchmark"; exit 2; }
	@$(call chapter_dir,$*)/bench.sh $(BUILD)/$*

# make bench: every technique at 2 ranks (chapter 08's meshes at 8) against one rank, each speed-up
# beside its bound and judged against issue 26's goals (tools/bench_all.sh; REPS, STEPS, STEPS08, STEPS09, ONLY=01,04).
bench: all
	@./tools/bench_all.sh $(BUILD)

# make bench-grade: make grade on a class (N submissions of chapter NN, default 30 of 08, JOBS at once,
# default 2), timed against issue 39's goal (30 in 30 minutes on 2 cores); never in make test.
bench-grade: all
	@./tools/bench_grade.sh "$(or $(NN),08)" "$(or $(N),30)" "$(or $(JOBS),2)"

# make bench-baseline: the single-device step beside PyTorch's (issue: performance), never in make test.
bench-baseline: all
	@./tools/bench_baseline.sh $(BUILD)/01

# make readme-outputs: every README block marked <!-- output: COMMAND --> rewritten from a real run of
# the cpu build; make check-readme: every such block compared with a real run, and every README link
# and file name checked (tools/readme_outputs.py; README.md, "How the outputs in these READMEs are
# checked"). make test runs the quick blocks (tests/t_readme.sh).
.PHONY: readme-outputs check-readme
readme-outputs:
	@$(MAKE) --no-print-directory BACKEND=cpu all
	@python3 tools/readme_outputs.py --update --build-root $(BUILD_ROOT)
check-readme:
	@$(MAKE) --no-print-directory BACKEND=cpu all
	@python3 tools/readme_outputs.py --check --jobs 3 --build-root $(BUILD_ROOT)

# ---------------------------------------------------------------- tests
# (the builds run one job per core, make -j or not: they are most of make test's first minutes)
test: deps-check-test
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@if [ -n "$(HAVE_NVCC)" ]; then echo "== make cuda (nvcc found at $(NVCC))"; \
	 else echo "== nvcc not found: skipping the CUDA build (set CUDA_HOME to enable it)"; fi
	@./tests/run_tests.sh $(BACKEND) "$(HAVE_NVCC)"

# make sanitize: the CPU backend built with ASan + UBSan + LeakSanitizer into $(BUILD_ROOT)/sanitize,
# every unit test on its rank counts and two layouts per chapter under mpirun; fails on any
# report (Open MPI's own leaks suppressed: tests/lsan.supp). make test runs a quick subset.
sanitize:
	@./tests/sanitize.sh

# ---------------------------------------------------------------- GPU machines
# make gpu-check [OUT=out/gpu-check.txt] [MAX_NP=4]: the first command to run on a GPU machine,
# offline (tests/gpu_check.sh): the environment, Open MPI and cJSON (or the bundle below), the cuda
# build, its unit tests and every chapter's layouts of at most MAX_NP ranks sharing the GPU
# (COMM=mpi), chapter 01 on NCCL, a determinism run, tokens/s and MFU; a summary in OUT. Without
# a GPU, one line and exit 2.
# make gpu-bundle: on a Debian 12 machine with its registry, the Debian packages of Open MPI and
# cJSON in gpu-bundle/ (tools/gpu_bundle.sh: downloaded, then tried in a relocated prefix), for
# a GPU machine that has neither; make gpu-check unpacks it there.
.PHONY: gpu-check gpu-bundle
gpu-check:
	@OUT="$(OUT)" MAX_NP="$(or $(MAX_NP),4)" BUILD_ROOT="$(BUILD_ROOT)" ./tests/gpu_check.sh
gpu-bundle:
	@./tools/gpu_bundle.sh download gpu-bundle

clean:
	rm -rf build out

help:
	@echo "make                  build every chapter and test for BACKEND (cpu or cuda)"
	@echo "make deps             install what is missing (Debian/Ubuntu: Open MPI, OpenBLAS, cJSON, gnuplot, PyTorch for the dump check)"
	@echo "make run-NN           build chapter NN and run it under mpirun on NP ranks (default 2), baseline beside it"
	@echo "make check-NN         the chapter's parity check on each of its standard layouts (NN_*/checks.txt)"
	@echo "make build-NN         what make check-NN runs: the chapter's binary and the unit tests its checks.txt names"
	@echo "make test-NN          one chapter's tests quickly: its unit tests and its layouts under MPI and the NCCL emulation"
	@echo "make plot-NN          gnuplot PNGs of what the chapter measured, in out/NN/"
	@echo "make bench            every technique against one rank and its bound (REPS, STEPS, STEPS08, STEPS09, ONLY=01,04,...)"
	@echo "make bench-NN         the chapter's benchmark, if it has one (never part of make test)"
	@echo "make bench-baseline   the single-device step beside the same model in PyTorch (ms, GFLOP/s, ratio), QKV / W1-W3 as one GEMM or several, a linear's GEMMs in fp32 and bf16"
	@echo "make bench-grade      make grade on a class: N submissions of chapter NN (default 30 of 08), JOBS at once (default 2), timed against 30 in 30 minutes"
	@echo "make readme-outputs   rewrite the READMEs' output blocks (<!-- output: ... -->) from real runs"
	@echo "make check-readme     compare the READMEs' output blocks with real runs; check their links and file names"
	@echo "make assignment-NN    a student copy in ../student-NN (beside the repository) with the chapter's exercises removed"
	@echo "make grade DIR=...    grade every student copy in DIR per exercise (check-NN in each), one CSV; JOBS=N grades N at once (docs/course.md)"
	@echo "make test             every unit test, chapter check and scripted test; last line 'N passed, N failed'"
	@echo "make cuda             compile and link every CUDA source with nvcc (sm_75, sm_80, sm_90 + PTX), warnings as errors"
	@echo "make sanitize         unit tests and chapter layouts under ASan + UBSan + LeakSanitizer (build/sanitize)"
	@echo "make gpu-check        on a GPU machine, first: environment, cuda build, unit tests, chapter layouts, NCCL, determinism, MFU (OUT=out/gpu-check.txt)"
	@echo "make gpu-bundle       Open MPI and cJSON as Debian packages in gpu-bundle/, for a GPU machine without them"
	@echo "make clean            remove build/ and out/"
	@echo "chapters:  $(CHAPTERS)"
	@echo "variables: BACKEND=cpu|cuda (now $(BACKEND)), NP=ranks (now $(NP)), ARGS=\"chapter flags\", CUDA_HOME (now $(CUDA_HOME)),"
	@echo "           COMM=mpi|nccl|nccl-sim (the collectives; now $(or $(COMM),unset: the program picks))"

-include $(shell find $(BUILD_ROOT) -name '*.d' 2>/dev/null)
