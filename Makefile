# nbgrad -- build, test and benchmark.
#
#   make            build the library (build/libnbgrad.a), the CLI (build/nbgrad), tests, examples, benches
#   make demo       build, then refine cell and orientation on the built-in example (examples/refine_cell.c)
#   make test       build and run every test (golden parity needs ../shared/golden or NBG_GOLDEN), the Python
#                   package's included (make test-python runs those alone; python/tests/run.sh)
#   make bench      benchmarks (set NB_REF_BIN to a reference nanoBragg binary for ratios)
#   make checksymbols  fail if the library exports a symbol that is neither API (nbgrad.h) nor internal (nbgi_),
#                   or if libnbgrad.so does not export exactly the functions nbgrad.h declares
#   make deps       install missing Debian packages (GSL, LAPACKE, OpenMP runtime, HDF5, CBFlib, jansson, msgpack-c,
#                   Open MPI, pkg-config); run by every build
#   make install    the program, libnbgrad.so and .a, nbgrad.h, nbgrad.pc and nbgrad(1) under PREFIX (/usr/local);
#                   DESTDIR stages; make uninstall; make test-install (run by make test) tries it in a scratch prefix;
#                   make install-python the Python package under the same prefix (PYTHON=python3)
#   make clean
#
# Variables: CC, NVCC, CUDA (1 when nvcc is found; CUDA=0 leaves the CUDA backend out), CUDA_ARCH, OPT,
# GSL (1; GSL=0 builds without GSL and LAPACKE, i.e. without refinement and its tests, installs nothing: for a
# GPU machine without Debian packages, `make GSL=0 test`), FORMATS, FORMATS_DL, MPI (below).

# Every core builds unless the command line gives -j (make -j1: one file at a time); the sanitizer tier's second
# build and the fuzzing harnesses share the jobs through make's jobserver.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

CC      ?= cc
NVCC    ?= nvcc
OPT     ?= -O3 -march=native
CSTD    := -std=gnu11
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
B       ?= build
CFLAGS  += $(CSTD) $(OPT) $(WARN) -fPIC -fopenmp -fno-math-errno -Iinclude -Isrc -Igrad -Icuda -I$(B)/gen -MMD -MP
GSL     ?= 1
LDLIBS  += -Wl,--as-needed -fopenmp -lm
ifeq ($(GSL),1)
LDLIBS  += -lgsl -lgslcblas -llapacke -llapack -lblas
DEPS    := $(B)/.deps
else
CFLAGS  += -DNBG_NO_REFINE
DEPS    :=
endif
# The formats that carry the whole geometry: NeXus/NXmx (HDF5), CBF (CBFlib), DIALS experiment lists (jansson),
# and DIALS reflection tables (libmsgpack-c).
# FORMATS=0 leaves them out (their calls then return NBG_EUNSUP), e.g. on a GPU machine without Debian packages;
# it follows GSL by default.
#
# Start-up: every shared library the program is linked with is loaded and relocated at every run, and HDF5 and
# CBFlib pull in some 40 (curl, krb5, gnutls, ...), Open MPI a dozen.  So with FORMATS_DL=1 (the default) the NXmx
# and CBF code is the plug-in $(B)/nbgrad-formats.so (src/nxmx.c, cbf.c, cbfbin.c, fmtplugin.c), which the library
# of the build tree opens on the first NXmx or CBF call (src/plugin.c; NBG_EUNSUP naming it when it cannot);
# FORMATS_DL=0 links them in (the Python package's build does; the installed libraries always do).  jansson (.expt,
# JSON) and msgpack-c (.refl) are small and stay linked.  MTZ files are read through gemmi (header-only C++,
# src/mtzread.cc behind src/mtz.c): in the plug-in too, so that the program does not load the C++ runtime.
FORMATS ?= $(GSL)
FORMATS_DL ?= 1
FMT_OBJ :=
FMT_LIBS :=
FMT_PLUGIN :=
ifeq ($(FORMATS),1)
HDF5_INC ?= $(firstword $(wildcard /usr/include/hdf5/serial) /usr/include)
HDF5_LIB ?= $(if $(wildcard /usr/lib/*/libhdf5_serial.so /usr/lib/libhdf5_serial.so),-lhdf5_serial,-lhdf5)
CFLAGS  += -DNBG_HAVE_FORMATS -I$(HDF5_INC) -I/usr/include/cbflib
DEPS    := $(B)/.deps
ifeq ($(FORMATS_DL),1)
FMT_OBJ := $(B)/src/nxmx.o $(B)/src/cbf.o $(B)/src/cbfbin.o $(B)/src/mtz.o $(B)/src/mtzread.o
FMT_LIBS := $(HDF5_LIB) -lcbf -lstdc++
FMT_PLUGIN := $(B)/nbgrad-formats.so
LDLIBS  += -ljansson -lmsgpackc
else
LDLIBS  += $(HDF5_LIB) -lcbf -ljansson -lmsgpackc -lstdc++
endif
endif


# CUDA: built when nvcc is found (CUDA=0 turns it off); the runtime is linked statically, so the program needs
# no CUDA library at run time and runs on machines without a GPU (the CUDA backend then reports no device).
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC_FOUND),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC_FOUND))
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fno-math-errno
CUDA_OBJ := $(B)/cuda/backend.o
CFLAGS += -DNBG_HAVE_CUDA
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
endif

# MPI (Open MPI's mpicc, Debian libopenmpi-dev, installed by the deps step): `nbgrad batch` splits its shots over
# the ranks of mpirun.  Built when mpicc is found when the recipe runs (after the deps step, so that a fresh
# machine's first build has it); MPI=0 leaves it out (batch then runs on one process and refuses mpirun).
# The MPI build is the second program $(B)/nbgrad-mpi: $(B)/nbgrad loads no MPI library, and executes nbgrad-mpi
# in its place when it finds itself under mpirun (src/batch.c, nbgi_mpi_reexec).
MPICC    ?= mpicc
MPI      ?= 1
MPI_PROG :=
ifeq ($(MPI),1)
MPI_CFLAGS = $$(command -v $(MPICC) >/dev/null 2>&1 && echo -DNBG_HAVE_MPI $$($(MPICC) --showme:compile))
MPI_LIBS   = $$(command -v $(MPICC) >/dev/null 2>&1 && $(MPICC) --showme:link)
MPI_PROG  := $(B)/nbgrad-mpi
endif

# The program links the libraries it loads at every run statically where their archives are installed (GSL,
# LAPACKE, LAPACK, BLAS with gfortran and quadmath, jansson, msgpack-c, and the C++ runtime of CUDA's): a shared library costs
# its loading and symbol binding at each start, a third of an 8x8 image's run (make bench's start-up lines;
# docs/benchmarks.md).  The tests, examples and the installed libraries link them as shared libraries.
static_lib   = $(if $(filter /%,$(shell $(CC) -print-file-name=lib$(1).a)),-l:lib$(1).a,-l$(1))
PROG_STATIC := -lgsl -lgslcblas -llapacke -llapack -lblas -ljansson -lmsgpackc -lstdc++
PROG_LDLIBS := $(foreach w,$(LDLIBS),$(if $(filter $(w),$(PROG_STATIC)),$(call static_lib,$(w:-l%=%)),$(w)))
PROG_LDLIBS += $(if $(filter -l:liblapack.a,$(PROG_LDLIBS)),$(call static_lib,gfortran) $(call static_lib,quadmath)) -lm

LIB_SRC  := $(wildcard src/*.c) $(wildcard grad/*.c)
CLI_SRC  := src/cli.c src/main.c src/batch.c src/ensemble.c
LIB_SRC  := $(filter-out $(CLI_SRC) src/fmtplugin.c,$(LIB_SRC))
LIB_SRC  := $(filter-out $(patsubst $(B)/%.o,%.c,$(FMT_OBJ)),$(LIB_SRC))
ifneq ($(GSL),1)
LIB_SRC  := $(filter-out grad/refine.c,$(LIB_SRC))
endif
LIB_OBJ  := $(patsubst %.c,$(B)/%.o,$(LIB_SRC))
ifeq ($(FORMATS),1)
ifneq ($(FORMATS_DL),1)
LIB_OBJ  += $(B)/src/mtzread.o
endif
endif
TEST_SRC := $(wildcard tests/test-*.c)
TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRC))
BENCH_SRC:= $(wildcard bench/*.c)
BENCHES  := $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC))
EX_SRC   := $(wildcard examples/*.c)
ifneq ($(GSL),1)
# (the tests that refine: they need GSL and LAPACKE)
TEST_SRC := $(filter-out tests/test-refine.c tests/test-examples.c tests/test-cli-grad.c tests/test-realdata.c \
                         tests/test-panels.c tests/test-spots.c tests/test-scanvary.c,$(TEST_SRC))
BENCH_SRC:= $(filter-out bench/bench-grad.c bench/bench-spots.c,$(BENCH_SRC))
EX_SRC   := $(filter-out examples/refine_cell.c examples/refine_modules.c,$(EX_SRC))
TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(TEST_SRC))
BENCHES  := $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC))
endif
EXAMPLES := $(patsubst examples/%.c,$(B)/examples/%,$(EX_SRC))

# The CUDA backend run on the CPU (tests/cudaemu/): cuda/backend.cu compiled by the host C++ compiler against an
# emulated CUDA runtime, linked with the library's dispatch built for CUDA, as the test program test-cuda-emu and
# the program $(B)/emu/nbgrad.  Built everywhere, with or without nvcc, so that the backend's launch, indexing and
# reduction code is tested in CI.
CXX     ?= c++
EMU_CUDA_SRC := src/simulate.c grad/grad.c
EMU_OBJ  := $(patsubst %.c,$(B)/emu/%.o,$(EMU_CUDA_SRC)) $(B)/emu/cuda/backend.o \
            $(filter-out $(patsubst %.c,$(B)/%.o,$(EMU_CUDA_SRC)),$(LIB_OBJ))
EMU_FLAGS := -DNBG_HAVE_CUDA -DNBG_CUDA_EMU
EMU      := $(B)/emu/libnbgrad.a $(B)/tests/test-cuda-emu $(B)/emu/nbgrad $(B)/tests/test-cudaemu

all: $(DEPS) $(B)/libnbgrad.a $(B)/nbgrad $(FMT_PLUGIN) $(MPI_PROG) $(TESTS) $(BENCHES) $(EXAMPLES) $(EMU)

# Install what a fresh Debian machine lacks.  Uses sudo only when not root.
deps: $(B)/.deps
$(B)/.deps:
	@mkdir -p $(B)
	@missing=""; \
	 [ -f /usr/include/gsl/gsl_multimin.h ] || missing="$$missing libgsl-dev"; \
	 [ -f /usr/include/lapacke.h ] || missing="$$missing liblapacke-dev"; \
	 command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
	 echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o $(B)/.omp-check 2>/dev/null || missing="$$missing libgomp1"; \
	 if [ "$(FORMATS)" = 1 ]; then \
	   [ -f /usr/include/hdf5/serial/hdf5.h ] || [ -f /usr/include/hdf5.h ] || missing="$$missing libhdf5-dev"; \
	   [ -f /usr/include/cbflib/cbf.h ] || missing="$$missing libcbf-dev"; \
	   [ -f /usr/include/jansson.h ] || missing="$$missing libjansson-dev"; \
	   [ -f /usr/include/msgpack.h ] || missing="$$missing libmsgpack-dev"; \
	   ls /usr/lib/*/hdf5/serial/plugins/libh5bshuf.so >/dev/null 2>&1 || missing="$$missing bitshuffle"; \
	   [ -f /usr/include/gemmi/symmetry.hpp ] || missing="$$missing gemmi-dev"; \
	 fi; \
	 if [ "$(MPI)" = 1 ]; then \
	   command -v $(MPICC) >/dev/null 2>&1 || missing="$$missing libopenmpi-dev"; \
	   command -v mpirun >/dev/null 2>&1 || missing="$$missing openmpi-bin"; \
	 fi; \
	 if [ -n "$$missing" ]; then \
	   echo "installing Debian packages:$$missing"; \
	   SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	   $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null || \
	     { echo "could not install:$$missing"; exit 1; }; \
	 fi; touch $@

$(B)/%.o: %.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# the one C++ source (the MTZ reader through gemmi's headers)
CXXFLAGS_LIB = -std=c++11 $(OPT) -fPIC -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -MMD -MP
$(B)/%.o: %.cc | $(DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_LIB) -c $< -o $@

# Where GCC tunes the target for 128-bit vectors though its registers are 256 bits wide (-march=native on AMD Zen 1:
# -mprefer-vector-width=128), the CPU kernels' lane loops are built at 256 bits, as every other AVX2 target's are
# (the Python package's x86-64-v3 build included): the forward 5-11 % faster on such a machine (tric1k, heavy512),
# the same image bits; the gradients no faster, but the same bits as the x86-64-v3 build's (at 128 bits GCC
# contracted some sums into multiply-adds otherwise: python/tests' grad against the program differed by 8e-14).
VEC256 := $(shell $(CC) $(OPT) -Q --help=target 2>/dev/null | awk '$$1 == "-mprefer-vector-width=" && $$2 == "128" \
            { w = 1 } $$1 == "-mavx2" && $$2 == "[enabled]" { a = 1 } END { if (w && a) print "-mprefer-vector-width=256" }')
# The CPU kernels' functions start on a cache line: the row kernels' speed moved by up to 15 % with where the
# linker happened to place them (heavy512 in float: 1.45 s or 1.72 s for the same code), which made benchmark ratios
# between versions a matter of layout.
$(B)/src/forward_cpu.o $(B)/src/forward_cpu_f.o $(B)/grad/adjoint_cpu.o: CFLAGS += -falign-functions=64
$(B)/src/forward_cpu.o $(B)/src/forward_cpu_f.o $(B)/grad/adjoint_cpu.o: CFLAGS += $(VEC256)
# The adjoint's lane loops select (a lane's contribution or 0) where GCC sinks the products into the branch: with
# trapping math they then vectorise only where the ISA has masked arithmetic (AVX-512, not AVX2), and a vectorised
# loop fuses multiply-adds where the scalar one does not, so the -march=native and the Python package's x86-64-v3
# builds gave different gradient bits.  The forward's sum over samples (a select of the running sum) GCC left
# scalar with trapping math ("control flow in loop"): without it, heavy512 and tric1k in float 12-17 % faster, the
# same image bits.  No nbgrad code enables floating-point traps.
$(B)/src/forward_cpu.o $(B)/src/forward_cpu_f.o $(B)/grad/adjoint_cpu.o: CFLAGS += -fno-trapping-math
# The forward rows' start sets a few lane arrays to 0 in one loop; GCC splits such loops into memsets, which at 16
# lanes of double (128 bytes, the float rows' sums) it wrote as `rep stos`: tens of cycles to start, three times a
# row of 16 pixels, cubic1k's float forward 10-20 % slower.  Without the split, vector stores.
$(B)/src/forward_cpu.o $(B)/src/forward_cpu_f.o: CFLAGS += -fno-tree-loop-distribute-patterns

# batch and ensemble: without MPI in $(B)/nbgrad (which runs nbgrad-mpi under mpirun), with it in nbgrad-mpi
$(B)/src/batch.o $(B)/src/ensemble.o: $(B)/src/%.o: src/%.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(MPI_PROG),-DNBG_MPI_EXEC) -c $< -o $@

$(B)/mpi/src/batch.o $(B)/mpi/src/ensemble.o: $(B)/mpi/src/%.o: src/%.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -c $< -o $@

# the formats loader of the build tree's library (the installed ones link the formats in: $(SO_B)/src/plugin.o)
$(B)/src/plugin.o: CFLAGS += $(if $(FMT_PLUGIN),-DNBG_FORMATS_DL) -DNBG_HELPER_DIR='"$(LIBDIR)/nbgrad"'

$(B)/emu/src/batch.o $(B)/emu/src/ensemble.o: $(B)/emu/src/%.o: src/%.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(EMU_FLAGS) $(MPI_CFLAGS) -c $< -o $@

$(B)/cuda/%.o: cuda/%.cu $(wildcard src/*.h grad/*.h cuda/*.h include/*.h include/*.def)
	@mkdir -p $(dir $@)
	$(NVCC_FOUND) $(NVFLAGS) -DNBG_HAVE_CUDA -Iinclude -Isrc -Igrad -Icuda -c $< -o $@

$(B)/libnbgrad.a: $(LIB_OBJ) $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/emu/%.o: %.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(EMU_FLAGS) -c $< -o $@

$(B)/emu/cuda/backend.o: cuda/backend.cu tests/cudaemu/cuda_runtime.h | $(DEPS)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 $(OPT) -fopenmp -fno-math-errno -Wall -Wno-unused-parameter -Wno-unknown-pragmas \
	  $(EMU_FLAGS) -Itests/cudaemu -Iinclude -Isrc -Igrad -Icuda -MMD -MP -c $< -o $@

$(B)/emu/libnbgrad.a: $(EMU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/emu/nbgrad: $(patsubst %.c,$(B)/emu/%.o,$(CLI_SRC)) $(B)/emu/libnbgrad.a | $(FMT_PLUGIN)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(MPI_LIBS) -lstdc++

# test-cuda also reads the golden cases through the program's wrapper of the library's flag parser (src/cli.c)
$(B)/tests/test-cuda: $(B)/tests/test-cuda.o $(B)/src/cli.o $(B)/libnbgrad.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS)

$(B)/tests/test-cuda-emu: $(B)/emu/tests/test-cuda.o $(B)/emu/src/cli.o $(B)/emu/libnbgrad.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS) -lstdc++

# the emulator's own test: it catches a missing barrier and a divergent one
$(B)/tests/test-cudaemu: tests/test-cudaemu.cc tests/cudaemu/cuda_runtime.h tests/testutil.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Wno-unused-parameter -DNBG_CUDA_EMU -Itests/cudaemu -Itests -Iinclude $< -o $@

$(B)/nbgrad: $(patsubst %.c,$(B)/%.o,$(CLI_SRC)) $(B)/libnbgrad.a | $(FMT_PLUGIN) $(MPI_PROG)
	$(CC) $(CFLAGS) $^ -o $@ $(PROG_LDLIBS)

$(B)/nbgrad-mpi: $(patsubst %.c,$(B)/%.o,$(filter-out src/batch.c src/ensemble.c,$(CLI_SRC))) \
                 $(B)/mpi/src/batch.o $(B)/mpi/src/ensemble.o $(B)/libnbgrad.a | $(FMT_PLUGIN)
	$(CC) $(CFLAGS) $^ -o $@ $(PROG_LDLIBS) $(MPI_LIBS)

# The formats plug-in: the format sources and the library objects they call (copies, hidden behind
# src/pkg/formats.map), linked with HDF5 and CBFlib; from the library without CUDA (the installed one's objects,
# $(B)/so) when CUDA is built: the geometry code names nbg_describe, which would bring in the CUDA runtime.
FMT_PLUGIN_LIB := $(if $(CUDA_OBJ),$(B)/so/libnbgrad.a,$(B)/libnbgrad.a)
$(FMT_PLUGIN): $(B)/src/fmtplugin.o $(FMT_OBJ) $(FMT_PLUGIN_LIB) src/pkg/formats.map
	$(CC) -shared -fopenmp $(filter -fsanitize=%,$(CFLAGS)) -Wl,--version-script=src/pkg/formats.map \
	  -Wl,--no-undefined $(B)/src/fmtplugin.o $(FMT_OBJ) $(FMT_PLUGIN_LIB) -o $@ $(SO_LDLIBS)

# The program linked as before the plug-ins (formats and MPI in the one program), for make bench's start-up line.
$(B)/bench/nbgrad-linked: $(patsubst %.c,$(B)/%.o,$(filter-out src/batch.c src/ensemble.c,$(CLI_SRC))) \
                          $(B)/mpi/src/batch.o $(B)/mpi/src/ensemble.o $(FMT_OBJ) $(B)/libnbgrad.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS) $(MPI_LIBS)

$(B)/tests/%: $(B)/tests/%.o $(B)/libnbgrad.a | $(FMT_PLUGIN)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS)

$(B)/bench/%: $(B)/bench/%.o $(B)/libnbgrad.a | $(FMT_PLUGIN)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS)

$(B)/examples/%: $(B)/examples/%.o $(B)/libnbgrad.a | $(FMT_PLUGIN)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(FMT_LIBS)

test: all checksymbols $(B)/tests/test-python $(B)/tests/test-layers
	@sh tests/run-all.sh $(B)

# The library's layering and its CPU kernels' inlining, on its object files (tests/layers.sh, told OPT), run by
# run-all.sh like a test program.
$(B)/tests/test-layers: tests/layers.sh $(B)/libnbgrad.a
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec sh tests/layers.sh $(B) "$(OPT)"\n' > $@ && chmod +x $@

# The Python package's tests (python/tests, pytest; python/tests/run.sh builds the package into $(B)/py first).
# run-all.sh runs them through $(B)/tests/test-python like a test program and adds their summary line to the total.
$(B)/tests/test-python: python/tests/run.sh
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec sh python/tests/run.sh $(B)\n' > $@ && chmod +x $@

test-python: $(B)/nbgrad
	@sh python/tests/run.sh $(B)

# Every symbol the library exports is either the API (an nbg_ name declared in include/nbgrad.h) or internal (the
# nbgi_ prefix); the CUDA compiler's own symbols for the kernels and its C++ runtime reference excepted.
checksymbols: $(B)/libnbgrad.a
	@pub=$$(grep -o -E '\bnbg_[a-z0-9_]+' include/nbgrad.h | sort -u); \
	 bad=$$(nm -g --defined-only $(B)/libnbgrad.a 2>/dev/null | awk 'NF == 3 { print $$3 }' | sort -u | \
	   grep -v -E '^nbgi_|^_Z[0-9]+(__device_stub__)?.*nbgi?_|^DW\.ref\.__gxx_personality_v0$$' | \
	   grep -v -x -F "$$pub"); \
	 if [ -n "$$bad" ]; then echo "exported symbols neither declared in include/nbgrad.h nor internal (nbgi_):"; \
	   echo "$$bad"; exit 1; fi

# The main job on the built-in example: fit a crystal's cell and orientation to a noisy image.
demo: all
	$(B)/examples/refine_cell

bench: all $(if $(FMT_PLUGIN)$(MPI_PROG),$(B)/bench/nbgrad-linked)
	@sh bench/run.sh $(B)

# the link flags, for the Python extension's build (python/setup.py)
print-ldlibs:
	@echo $(LDLIBS)

clean:
	rm -rf $(B)

.PHONY: all deps test test-python demo bench clean checksymbols print-ldlibs
.SECONDARY:
-include $(shell find $(B) -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------------------------------------------------------
# Sanitizer and fuzzing tiers (run by .ci/run after `make test`).
#
#   make test-asan  the library, the program and the tests (but test-examples and the CUDA ones) built with
#                   ASan + UBSan into $(B)/asan and run by tests/run-all.sh ($(B)/asan/nbgrad is the program
#                   they test); 4-9 minutes on 2 cores
#   make fuzz       builds the libFuzzer harnesses (tests/fuzz/fuzz-*.c) into $(B)/fuzz and runs each for FUZZ_TIME
#                   seconds on a scratch corpus $(B)/fuzz/corpus/<target> seeded from tests/fuzz/corpus/<target>,
#                   going on past findings (fork mode); findings are saved under $(B)/fuzz/findings/<target>/
#   make fuzz-ci    every committed corpus and tests/fuzz/regress/<target>/ input once, then each harness for
#                   FUZZ_CI_TIME seconds from the committed corpus, stopping at the first finding
#   make fuzz-build the harnesses only
#
# The fuzzing build needs clang with its libFuzzer runtime ($(B)/fuzz/.deps installs clang and libclang-rt-14-dev
# when missing); it uses OpenMP when clang can link it, else runs serially (tests/fuzz/noomp/omp.h).
# Variables: FUZZ_CC (clang), FUZZ_TIME (300), FUZZ_CI_TIME (20: 11 harnesses two at a time, 2 minutes, which the
# CI's 30 minutes allow; make fuzz goes deeper), FUZZ_JOBS (2: fuzz-ci runs two harnesses at once),
# FUZZ_TARGETS, FUZZ_OPTS (libFuzzer flags),
# ASAN_TESTS, ASAN_GOLDEN_CASES.

FUZZ_CC      ?= clang
FUZZ_CXX     ?= clang++
FZ           := $(B)/fuzz
FUZZ_TARGETS ?= hkl fdump smv sources matrix cli expt image refl mtz
FUZZ_TIME    ?= 300
FUZZ_CI_TIME ?= 20
FUZZ_OPTS    ?= -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10
FUZZ_CFLAGS  := -std=gnu11 -g -O1 -fno-omit-frame-pointer -fno-math-errno -fsanitize=fuzzer,address,undefined \
                -fsanitize=float-cast-overflow -fno-sanitize-recover=all -DNBG_NO_REFINE $(WARN) -Wno-pass-failed \
                -Iinclude -Isrc -Igrad -Icuda -I$(B)/gen -MMD -MP
ifeq ($(FORMATS),1)
FUZZ_CFLAGS  += -DNBG_HAVE_FORMATS -I$(HDF5_INC) -I/usr/include/cbflib
FUZZ_LIBS    := $(HDF5_LIB) -lcbf -ljansson -lmsgpackc -lstdc++
endif
FUZZ_LIB_SRC := $(filter-out src/main.c src/cli.c src/batch.c src/ensemble.c grad/refine.c,$(wildcard src/*.c) $(wildcard grad/*.c))
FUZZ_CXXFLAGS := -std=c++11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
                -fsanitize=float-cast-overflow -fno-sanitize=vptr -fno-sanitize-recover=all -Wall -Wextra \
                -Wno-unused-parameter \
                -Iinclude -Isrc -MMD -MP
FUZZ_BINS    := $(patsubst %,$(FZ)/fuzz-%,$(FUZZ_TARGETS))

$(FZ)/.deps:
	@mkdir -p $(FZ)
	@check() { echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d == 0 && n; }' | \
	   $(FUZZ_CC) -fsanitize=fuzzer,address,undefined -x c - -o $(FZ)/.fuzz-check >/dev/null 2>&1; }; \
	 if ! check; then \
	   missing=""; command -v $(FUZZ_CC) >/dev/null 2>&1 || missing="clang"; missing="$$missing libclang-rt-14-dev"; \
	   echo "installing Debian packages: $$missing"; \
	   SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	   $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null || \
	     { echo "could not install: $$missing"; exit 1; }; \
	   check || { echo "$(FUZZ_CC) cannot build a libFuzzer program (-fsanitize=fuzzer)"; exit 1; }; \
	 fi; \
	 if printf '#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n' | \
	    $(FUZZ_CC) -fopenmp -x c - -o $(FZ)/.fuzz-check >/dev/null 2>&1; then echo "-fopenmp" > $(FZ)/omp-flags; \
	 else echo "-Wno-unknown-pragmas -Itests/fuzz/noomp" > $(FZ)/omp-flags; fi; \
	 rm -f $(FZ)/.fuzz-check; touch $@

$(FZ)/obj/%.o: %.c | $(FZ)/.deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $$(cat $(FZ)/omp-flags) -c $< -o $@

$(FZ)/obj/%.o: %.cc | $(FZ)/.deps
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -c $< -o $@

$(FZ)/libnbgrad.a: $(patsubst %.c,$(FZ)/obj/%.o,$(FUZZ_LIB_SRC)) $(if $(filter 1,$(FORMATS)),$(FZ)/obj/src/mtzread.o)
	@rm -f $@
	ar rcs $@ $^

$(FZ)/fuzz-cli: $(FZ)/obj/tests/fuzz/fuzz-cli.o $(FZ)/obj/src/cli.o $(FZ)/libnbgrad.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) $$(cat $(FZ)/omp-flags) $^ -o $@ -lm $(FUZZ_LIBS)

$(FZ)/fuzz-%: $(FZ)/obj/tests/fuzz/fuzz-%.o $(FZ)/libnbgrad.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) $$(cat $(FZ)/omp-flags) $^ -o $@ -lm $(FUZZ_LIBS)

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	@sh tests/fuzz/run.sh fuzz $(FZ) $(FUZZ_TIME) "$(FUZZ_OPTS)" $(FUZZ_TARGETS)

fuzz-ci: fuzz-build
	@sh tests/fuzz/run.sh ci $(FZ) $(FUZZ_CI_TIME) "$(FUZZ_OPTS)" $(FUZZ_TARGETS)

# The ASan + UBSan tier: a second build of the same sources (CUDA off) with its own program, which the tests
# that run the program find through NBG_BIN.  Left out: test-examples (it runs build/examples/... by fixed
# paths, i.e. the unsanitized programs), the CUDA tests, and test-ensemble (45 s of optimisation unsanitized; its
# code paths are those of nbgrad batch and refine, which the tier runs).  ASAN_GOLDEN_CASES (comma-separated ids) limits
# test-golden to some cases; empty runs them all.
ASAN_B            := $(B)/asan
ASAN_OPT          := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_TESTS        ?= $(filter-out test-examples test-cuda test-ensemble,$(patsubst tests/%.c,%,$(TEST_SRC)))
ASAN_GOLDEN_CASES ?=
ASAN_ENV          := ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1 \
                     UBSAN_OPTIONS=abort_on_error=1:halt_on_error=1:print_stacktrace=1

test-asan:
	@$(MAKE) --no-print-directory B=$(ASAN_B) OPT="$(ASAN_OPT)" CUDA=0 \
	   $(ASAN_B)/nbgrad $(patsubst %,$(ASAN_B)/tests/%,$(ASAN_TESTS))
	@for p in $(ASAN_B)/tests/test-*; do \
	   case " $(ASAN_TESTS) " in *" $${p##*/} "*) ;; *) case "$$p" in *.o|*.d) ;; *) rm -f "$$p" ;; esac ;; esac; \
	 done
	@$(ASAN_ENV) NBG_BIN=$(ASAN_B)/nbgrad NBG_GOLDEN_CASES="$(ASAN_GOLDEN_CASES)" sh tests/run-all.sh $(ASAN_B)

# The DIALS tier: nbgrad's NXmx, CBF and experiment list through the real client (tests/dials/roundtrip.py:
# dials.import, find_spots, index, refine on a 20-image series; a few minutes).  Installs Debian's dials when it is
# missing; runs it with Debian's /usr/bin/python3 (another python3 may come first on PATH).
DIALS_PY ?= /usr/bin/python3
$(B)/.dials-deps:
	@mkdir -p $(B)
	@if ! $(DIALS_PY) -c 'import dxtbx, dials' >/dev/null 2>&1 || ! command -v dials.import >/dev/null 2>&1; then \
	   echo "installing Debian packages: dials"; \
	   SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	   $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dials >/dev/null || \
	     { echo "could not install: dials"; exit 1; }; \
	 fi; touch $@

# (tests/dials/cbfpanels.c: what nbgrad reads of a CBF file, for cbfpanels.py to compare with dxtbx)
$(B)/tests/dials-cbfpanels: tests/dials/cbfpanels.c $(B)/libnbgrad.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(filter %.c %.a,$^) -o $@ $(LDLIBS)

test-dials: $(B)/nbgrad $(B)/tests/dials-cbfpanels $(B)/.dials-deps
	@DIALS_PY=$(DIALS_PY) NBG_CBFPANELS=$(B)/tests/dials-cbfpanels sh tests/dials/run.sh $(B)/nbgrad $(B)/dials $(DIALS_OPTS)

# The real-data tier (tests/dials/realstills.py; about 2 minutes): real stills (../shared/data/real: the thaumatin
# grid scan's Pilatus 6M still and the LCLS CSPAD still of thermolysin, 64 panels) indexed by Debian's dials, refined
# by nbgrad from DIALS's model (orientation, cell, crystal size, background, per-reflection scales), and the spot
# centroids both predict compared with the observed ones; a temporary work folder (REAL_WORK=dir keeps it there).
test-real: $(B)/nbgrad $(B)/.dials-deps
	@PATH=/usr/bin:$$PATH $(DIALS_PY) tests/dials/realstills.py $(B)/nbgrad $(REAL_WORK)

.PHONY: fuzz fuzz-ci fuzz-build test-asan test-dials test-real install-python

# ---------------------------------------------------------------------------------------------------------------
# Installation: make install [PREFIX=/usr/local] [DESTDIR=] (make uninstall removes the same files), and its test
# make test-install (tests/install/run.sh; make test runs it too).  Installs
#
#   $(BINDIR)/nbgrad                     the program as built ($(B)/nbgrad: CUDA linked statically when built)
#   $(LIBDIR)/libnbgrad.so.X.Y.Z         the shared library, soname libnbgrad.so.X (X.Y.Z is NBG_VERSION in
#   $(LIBDIR)/libnbgrad.so.X, .so        include/nbgrad.h, which states the ABI rules), and the links to it
#   $(LIBDIR)/libnbgrad.a                the static library
#   $(INCLUDEDIR)/nbgrad.h, nbgrad_params.def
#   $(PKGCONFIGDIR)/nbgrad.pc            Libs: -lnbgrad; Libs.private: what a static link needs ($(LDLIBS) less CUDA)
#   $(MANDIR)/man1/nbgrad.1              generated from `nbgrad -h` by src/pkg/man.sh ($(B)/nbgrad.1)
#
# and, when built, $(LIBDIR)/nbgrad/nbgrad-formats.so and nbgrad-mpi (the formats plug-in and the MPI program that
# bin/nbgrad finds in ../lib/nbgrad or in the LIBDIR/nbgrad of its build; the installed libraries link the formats
# in: their objects are those of $(B)/libnbgrad.a with the format sources for the loader src/plugin.c).
#
# The installed libraries have no CUDA backend, so that a C user's program needs no CUDA runtime: they are the
# objects of $(B)/libnbgrad.a but for the two sources that see NBG_HAVE_CUDA (src/simulate.c, grad/grad.c), which
# are compiled again without it into $(B)/so (there NBG_BACKEND_AUTO picks the CPU and NBG_BACKEND_CUDA fails with
# NBG_ENODEV).  The shared library exports the nbg_ functions only (src/pkg/libnbgrad.map); make checksymbols checks that
# it exports exactly the functions include/nbgrad.h declares.  Variables: PREFIX, DESTDIR, BINDIR, LIBDIR,
# INCLUDEDIR, MANDIR, PKGCONFIGDIR, LDCONFIG (run by root's install without DESTDIR; LDCONFIG=true skips it).
# OPT's -march=native is in the installed libraries too: a package for other machines sets OPT (e.g. OPT=-O3).

PREFIX       ?= /usr/local
DESTDIR      ?=
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
LDCONFIG     ?= ldconfig

NBG_VER      := $(shell sed -n 's/^.define NBG_VERSION "\([0-9.]*\)"$$/\1/p' include/nbgrad.h)
SO_B         := $(B)/so
SO_NAME      := libnbgrad.so.$(firstword $(subst ., ,$(NBG_VER)))
SO_FILE      := libnbgrad.so.$(NBG_VER)
SO_LIB       := $(SO_B)/$(SO_FILE)
SO_CUDA_SRC  := src/simulate.c grad/grad.c src/plugin.c
SO_OBJ       := $(patsubst %.c,$(SO_B)/%.o,$(SO_CUDA_SRC)) $(FMT_OBJ) \
                $(filter-out $(patsubst %.c,$(B)/%.o,$(SO_CUDA_SRC)),$(LIB_OBJ))
SO_CFLAGS    := $(filter-out -DNBG_HAVE_CUDA,$(CFLAGS))
SO_LDLIBS    := $(filter-out -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++,$(LDLIBS)) $(FMT_LIBS) \
                $(if $(filter 1,$(FORMATS)),$(if $(FMT_LIBS),,-lstdc++))
PC_LIBS_PRIVATE := $(filter-out -Wl%,$(SO_LDLIBS))

$(SO_B)/%.o: %.c | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SO_CFLAGS) -c $< -o $@

$(SO_LIB): $(SO_OBJ) src/pkg/libnbgrad.map
	$(CC) -shared -fopenmp -Wl,-soname,$(SO_NAME) -Wl,--version-script=src/pkg/libnbgrad.map -Wl,--no-undefined \
	  $(SO_OBJ) -o $@ $(SO_LDLIBS)
	ln -sf $(SO_FILE) $(SO_B)/$(SO_NAME)
	ln -sf $(SO_NAME) $(SO_B)/libnbgrad.so

$(SO_B)/libnbgrad.a: $(SO_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/nbgrad.1: $(B)/nbgrad src/pkg/man.sh
	sh src/pkg/man.sh $(B)/nbgrad > $@.tmp && mv $@.tmp $@

install: $(B)/nbgrad $(SO_LIB) $(SO_B)/libnbgrad.a $(B)/nbgrad.1 src/pkg/nbgrad.pc.in
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	  $(DESTDIR)$(MANDIR)/man1
	install -m 755 $(B)/nbgrad $(DESTDIR)$(BINDIR)/nbgrad
	$(if $(FMT_PLUGIN)$(MPI_PROG),install -d $(DESTDIR)$(LIBDIR)/nbgrad)
	$(if $(FMT_PLUGIN)$(MPI_PROG),install -m 755 $(FMT_PLUGIN) $(MPI_PROG) $(DESTDIR)$(LIBDIR)/nbgrad/)
	install -m 755 $(SO_LIB) $(DESTDIR)$(LIBDIR)/$(SO_FILE)
	ln -sf $(SO_FILE) $(DESTDIR)$(LIBDIR)/$(SO_NAME)
	ln -sf $(SO_NAME) $(DESTDIR)$(LIBDIR)/libnbgrad.so
	install -m 644 $(SO_B)/libnbgrad.a $(DESTDIR)$(LIBDIR)/libnbgrad.a
	install -m 644 include/nbgrad.h include/nbgrad_params.def $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${exec_prefix}/%,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))|' -e 's|@VERSION@|$(NBG_VER)|' \
	    -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|' src/pkg/nbgrad.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/nbgrad.pc
	install -m 644 $(B)/nbgrad.1 $(DESTDIR)$(MANDIR)/man1/nbgrad.1
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null 2>&1; then $(LDCONFIG); fi

# The Python package too (optional): pip builds it against the library (python/setup.py) and installs it under the
# same prefix (and DESTDIR); PYTHON picks the interpreter.
PYTHON ?= python3
install-python:
	$(PYTHON) -m pip install --no-build-isolation --no-deps --root "$(or $(DESTDIR),/)" --prefix "$(PREFIX)" ./python

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/nbgrad/nbgrad-formats.so $(DESTDIR)$(LIBDIR)/nbgrad/nbgrad-mpi
	rmdir $(DESTDIR)$(LIBDIR)/nbgrad 2>/dev/null || true
	rm -f $(DESTDIR)$(BINDIR)/nbgrad $(DESTDIR)$(LIBDIR)/$(SO_FILE) $(DESTDIR)$(LIBDIR)/$(SO_NAME) \
	  $(DESTDIR)$(LIBDIR)/libnbgrad.so $(DESTDIR)$(LIBDIR)/libnbgrad.a $(DESTDIR)$(INCLUDEDIR)/nbgrad.h \
	  $(DESTDIR)$(INCLUDEDIR)/nbgrad_params.def $(DESTDIR)$(PKGCONFIGDIR)/nbgrad.pc $(DESTDIR)$(MANDIR)/man1/nbgrad.1

# The shared library exports exactly the functions include/nbgrad.h declares (with GSL=0 some are left out: only
# that nothing else is exported is checked then).
checksymbols: checksymbols-so
checksymbols-so: $(SO_LIB)
	@exp=$$(nm -D --defined-only $(SO_LIB) | awk 'NF == 3 { print $$3 }' | sed 's/@.*//' | sort -u); \
	 decl=$$(grep -o -E '^[A-Za-z_][A-Za-z0-9_ *]*[ *]nbg_[a-z0-9_]+\(' include/nbgrad.h | \
	   grep -o -E 'nbg_[a-z0-9_]+\($$' | tr -d '(' | sort -u); \
	 bad=$$(echo "$$exp" | grep -v -x -F "$$decl"); \
	 if [ -n "$$bad" ]; then echo "$(SO_LIB) exports symbols that include/nbgrad.h does not declare:"; \
	   echo "$$bad"; exit 1; fi; \
	 if [ "$(GSL)" = 1 ]; then missing=$$(echo "$$decl" | grep -v -x -F "$$exp"); \
	   if [ -n "$$missing" ]; then echo "functions declared in include/nbgrad.h that $(SO_LIB) does not export:"; \
	     echo "$$missing"; exit 1; fi; fi

# the install test, run by run-all.sh like a test program (make test) or alone
$(B)/tests/test-install: tests/install/run.sh $(B)/nbgrad $(SO_LIB) $(SO_B)/libnbgrad.a $(B)/nbgrad.1
	@mkdir -p $(dir $@)
	@printf '#!/bin/sh\nexec sh tests/install/run.sh $(B)\n' > $@ && chmod +x $@

test-install: $(B)/tests/test-install
	@$(B)/tests/test-install

all: $(SO_LIB)
test: $(B)/tests/test-install

.PHONY: install uninstall test-install checksymbols-so

# The space-group settings that symmetry.c looks symbols up in (Hermann-Mauguin and numbers to the Hall symbols
# DIALS's lists carry): generated at build time from gemmi's tables (Debian gemmi-dev, header-only) by
# src/sgtable-gen.cc, not typed in; without gemmi's headers the table is empty and such symbols have no Hall symbol.
SG_H := $(B)/gen/sgtable.h
$(SG_H): src/sgtable-gen.cc | $(DEPS)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++11 -O1 $< -o $(B)/gen/sgtable-gen
	$(B)/gen/sgtable-gen > $@.tmp && mv $@.tmp $@
$(B)/src/symmetry.o $(B)/emu/src/symmetry.o $(SO_B)/src/symmetry.o $(FZ)/obj/src/symmetry.o: $(SG_H)
