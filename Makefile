# mirrored - single-node multi-GPU data-parallel trainer.
#   make          build build/mirrored (CLI) and build/mirrored_tests
#   make train    install what is missing, build, train configs/fashion_mnist_mlp.yaml
#   make train-gpt  a byte-level GPT on the Python standard library (configs/python_gpt.yaml)
#   make train-llm  a Llama-style model on it, BPE-tokenized (configs/python_llama_bpe.yaml)
#   make train-llama  a byte-level Llama-style model on the same text (configs/python_llama.yaml)
#   make train-images  the CNN from a folder of JPEG images (configs/fashion_mnist_images.yaml)
#   make test     build and run every test; ends with "N passed, N failed[, N skipped]"
#   make test-timing  the tests that time this machine (suite "timing"; not in make test)
#   make test-tsan  the tests once more under ThreadSanitizer (CPU-only build in build-tsan/)
#   make test-cuda-emu  the GPU tests on emulated GPUs: the CUDA backend run on the CPU (build-emu/)
#   make fuzz     libFuzzer targets (clang, ASan + UBSan) in build-fuzz/; scripts/fuzz.sh runs one
#   make format   apply .clang-format to every C++/CUDA source; make lint checks it, and cppcheck
#   make clean
# CUDA: nvcc from $(CUDA_HOME) (default /usr/local/cuda); without it a CPU-only build.
# NCCL: nccl.h and libnccl from $(NCCL_HOME) (default $(CUDA_HOME)) or the system; without them
# the CUDA backend is built without the nccl op (WITH_NCCL=0 forces that).

# One compile job per core unless the command line sets -j (it wins over this); a `make clean ...`
# stays serial so that clean runs before what follows it.
ifeq ($(filter clean,$(MAKECMDGOALS)),)
  MAKEFLAGS += -j$(shell nproc)
endif

CUDA_HOME ?= /usr/local/cuda
BUILD     ?= build
CONFIG    ?= configs/fashion_mnist_mlp.yaml
ARGS      ?=
NVCC      := $(wildcard $(CUDA_HOME)/bin/nvcc)

# --- dependencies: distribution packages only; scripts/install_deps.sh installs what is missing
REQUIRED_HEADERS := /usr/include/yaml-cpp/yaml.h /usr/include/doctest/doctest.h /usr/include/zlib.h \
                    /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp \
                    /usr/include/turbojpeg.h /usr/include/png.h /usr/include/pcre2.h \
                    /usr/include/sentencepiece_processor.h
CBLAS_HEADER := $(firstword $(wildcard /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/*/cblas.h))
MISSING_DEPS := $(filter-out $(wildcard $(REQUIRED_HEADERS)),$(REQUIRED_HEADERS)) $(if $(CBLAS_HEADER),,cblas.h)
DEPS_STEP := $(if $(strip $(MISSING_DEPS)),install-deps,)

# Recursive (=) so pkg-config runs after install-deps has had its chance; plain -l flags where a
# distribution ships no .pc file.
PKG_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null) $(shell pkg-config --cflags yaml-cpp 2>/dev/null)
PKG_LIBS   = $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas) \
             $(or $(shell pkg-config --libs yaml-cpp 2>/dev/null),-lyaml-cpp) -lz -lturbojpeg -lpng -lpcre2-8 -lsentencepiece

CXXFLAGS_BASE := -std=c++20 -O2 -g -Wall -Wextra -pthread -MMD -MP -I.
CXXFLAGS_EXTRA ?=
CXXFLAGS = $(CXXFLAGS_BASE) $(PKG_CFLAGS) $(CXXFLAGS_EXTRA)
LDFLAGS_EXTRA ?=
# MPI (Open MPI from the distribution) joins the nodes of a multi-node run (mirrored/nodes.h);
# without it, or with WITH_MPI=0, the build runs on one node only.
WITH_MPI ?= $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || echo 0)
MPI_CFLAGS = $(if $(filter 1,$(WITH_MPI)),$(shell pkg-config --cflags ompi-c) -DMIRRORED_MPI=1,-DMIRRORED_MPI=0)
MPI_LIBS = $(if $(filter 1,$(WITH_MPI)),$(shell pkg-config --libs ompi-c))
# libxsmm (Debian's libxsmm-dev, x86-64) JIT-compiles the CPU replicas' GEMMs for their exact
# shapes (kernels/cpu/jit_gemm.h); without it, or with WITH_XSMM=0, OpenBLAS runs them all.
WITH_XSMM ?= $(shell pkg-config --exists libxsmm 2>/dev/null && echo 1 || echo 0)
XSMM_CFLAGS = $(if $(filter 1,$(WITH_XSMM)),$(shell pkg-config --cflags libxsmm) -DMIRRORED_XSMM=1,-DMIRRORED_XSMM=0)
XSMM_LIBS = $(if $(filter 1,$(WITH_XSMM)),$(shell pkg-config --libs libxsmm))
LDLIBS = $(XSMM_LIBS) $(PKG_LIBS) $(MPI_LIBS) -pthread -ldl

LIB_CPP := $(wildcard base/*.cpp kernels/*.cpp kernels/cpu/*.cpp kernels/ops/*.cpp kernels/sim/*.cpp data/*.cpp data/*/*.cpp mirrored/*.cpp mirrored/*/*.cpp)
LIB_CPP := $(filter-out mirrored/main.cpp kernels/cuda_stub.cpp,$(LIB_CPP))
TEST_CPP := $(wildcard tests/*.cpp) tests/fuzz/targets.cpp
# The backend's own sources (beside LIB_CU / EMU_CU), set below: the CUDA stubs, or the emulator.
BACKEND_CPP :=
BACKEND_TEST_CPP :=

ifeq ($(CUDA_EMU),1)
  # The emulated GPU (make test-cuda-emu, tests/cuda_emu/README.md): the CUDA backend's own source
  # compiled as C++ by $(CXX) against a CPU implementation of the CUDA runtime, cuBLAS and cuBLASLt
  # and NCCL (headers from $(CUDA_HOME), no CUDA library linked; without nccl.h, no nccl op).
  EMU_CU := kernels/cuda/cuda_device.cu kernels/cuda/cuda_kernels.cu kernels/cuda/fused_gemm.cu
  OP_CU := $(wildcard kernels/ops/*.cu)
  BACKEND_CPP += tests/cuda_emu/fibers.cpp tests/cuda_emu/runtime.cpp tests/cuda_emu/queue.cpp
  BACKEND_TEST_CPP += tests/cuda_emu/test_emulator.cpp
  LIB_CU :=
  CUDA_LIBS :=
  EMU_NCCL := $(if $(wildcard $(CUDA_HOME)/include/nccl.h),1,0)
  ifeq ($(EMU_NCCL),1)
    EMU_CU += kernels/cuda/nccl_group.cu
    BACKEND_CPP += tests/cuda_emu/nccl.cpp
  else
    BACKEND_CPP += kernels/cuda/nccl_stub.cpp
  endif
  CXXFLAGS_BASE += -isystem $(CUDA_HOME)/include -DMIRRORED_CUDA=1 -DMIRRORED_NCCL=$(EMU_NCCL)
else ifneq ($(NVCC),)
  # SASS for Ampere (sm_80, also runs on sm_86/89), Hopper, Blackwell datacenter and consumer,
  # and PTX the driver can compile for newer GPUs. Turing and older are refused at start-up.
  GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_100,code=sm_100 -gencode arch=compute_120,code=sm_120 \
             -gencode arch=compute_120,code=compute_120
  NCCL_HOME ?= $(CUDA_HOME)
  NCCL_HEADER := $(firstword $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h))
  NCCL_LIBFILE := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/libnccl.so \
                    /usr/lib/*/libnccl.so /usr/lib/libnccl.so))
  WITH_NCCL ?= $(if $(and $(NCCL_HEADER),$(NCCL_LIBFILE)),1,0)
  LIB_CU := $(filter-out kernels/cuda/nccl_group.cu,$(wildcard kernels/cuda/*.cu))
  OP_CU := $(wildcard kernels/ops/*.cu)
  ifeq ($(WITH_NCCL),1)
    LIB_CU += kernels/cuda/nccl_group.cu
    NCCL_LIBS := -L$(dir $(NCCL_LIBFILE)) -Wl,-rpath,$(dir $(NCCL_LIBFILE)) -lnccl
    NCCL_INC := $(if $(NCCL_HEADER),-isystem $(dir $(NCCL_HEADER)))
  else
    $(info mirrored: NCCL (nccl.h + libnccl) not found; building without the nccl op (the ring needs none))
    BACKEND_CPP += kernels/cuda/nccl_stub.cpp
    NCCL_LIBS :=
    NCCL_INC :=
  endif
  # --threads 0: the five architectures of one file compile in parallel (cuda_kernels.cu 22-27 s
  # -> 15 s on 2 cores)
  NVCCFLAGS := -std=c++20 -O3 -I. $(NCCL_INC) -ccbin $(CXX) $(GENCODE) -DMIRRORED_NCCL=$(WITH_NCCL) --threads 0 \
               -Xcompiler -Wall,-Wextra,-pthread -MMD -MP
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart $(NCCL_LIBS)
  CXXFLAGS_BASE += -isystem $(CUDA_HOME)/include -DMIRRORED_CUDA=1
else
  $(info mirrored: nvcc not found under $(CUDA_HOME); building the CPU-only backend)
  BACKEND_CPP += kernels/cuda_stub.cpp
  LIB_CU :=
  CUDA_LIBS :=
endif

OBJ := $(BUILD)/obj
# The host objects (all but the backend's) do not depend on the backend: nothing outside
# kernels/cuda/ sees a CUDA header or macro. So with HOST_BUILD set (make test-cuda-emu), this
# build links that folder's host objects as they are and compiles only the backend and the
# emulator; its caller brings them up to date first (make host-objects).
HOST_OBJ_DIR := $(if $(HOST_BUILD),$(HOST_BUILD)/obj,$(OBJ))
HOST_OBJ := $(LIB_CPP:%.cpp=$(HOST_OBJ_DIR)/%.o)
HOST_TEST_OBJ := $(TEST_CPP:%.cpp=$(HOST_OBJ_DIR)/%.o)
MAIN_OBJ := $(HOST_OBJ_DIR)/mirrored/main.o
LIB_OBJ := $(HOST_OBJ) $(BACKEND_CPP:%.cpp=$(OBJ)/%.o) $(LIB_CU:%.cu=$(OBJ)/%.cu.o) $(EMU_CU:%.cu=$(OBJ)/%.emu.o)
# The op families' CUDA kernels (kernels/ops/*.cu) register their launchers as the program starts
# (nothing refers to them by name), so they are linked as objects, never left in the archive.
OP_CU_OBJ := $(if $(filter 1,$(CUDA_EMU)),$(OP_CU:%.cu=$(OBJ)/%.emu.o),$(OP_CU:%.cu=$(OBJ)/%.cu.o))
TEST_OBJ := $(HOST_TEST_OBJ) $(BACKEND_TEST_CPP:%.cpp=$(OBJ)/%.o)
LIB := $(BUILD)/libmirrored.a

.PHONY: all host-objects train train-gpt train-llama train-llm train-images test test-timing test-tsan test-cuda-emu test-cuda-emu-asan fuzz fuzz-targets format lint clean install-deps
all: $(BUILD)/mirrored $(BUILD)/mirrored_tests
host-objects: $(HOST_OBJ) $(HOST_TEST_OBJ) $(MAIN_OBJ)

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/mirrored: $(MAIN_OBJ) $(OP_CU_OBJ) $(LIB)
	$(CXX) -o $@ $^ $(LDFLAGS_EXTRA) $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/mirrored_tests: $(TEST_OBJ) $(OP_CU_OBJ) $(LIB)
	$(CXX) -o $@ $^ $(LDFLAGS_EXTRA) $(LDLIBS) $(CUDA_LIBS)

# Every object depends on the flags of its build, kept in flags.txt and rewritten only when they
# change: building again in one folder with other switches (WITH_NCCL=0, CXXFLAGS_EXTRA=...)
# recompiles instead of linking objects made with the old ones.
FLAGS_FILE := $(OBJ)/flags.txt
BUILD_FLAGS = $(CXX) $(CXXFLAGS) $(MPI_CFLAGS) $(XSMM_CFLAGS) | $(NVCCFLAGS)
.PHONY: FORCE
$(FLAGS_FILE): FORCE | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	@echo '$(BUILD_FLAGS)' | cmp -s - $@ || echo '$(BUILD_FLAGS)' > $@

$(OBJ)/%.o: %.cpp $(FLAGS_FILE) | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The CPU backend's element loops: vectorised (-O3), square roots without errno, and no FMA
# contraction, so that results do not depend on the instruction set the compiler picks. Without
# trapping maths (no code here reads the floating-point exception flags) a loop whose formula
# selects (GELU's clamps and signs, kernels/op_math.h) vectorises too; no value changes.
$(OBJ)/kernels/cpu/%.o: CXXFLAGS += -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off
# The op families' CPU loops (kernels/ops/*.cpp, not their CUDA files' emulated objects), likewise.
$(patsubst %.cpp,$(OBJ)/%.o,$(wildcard kernels/ops/*.cpp)): CXXFLAGS += -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off
# The image loader's resampling loops (data/image_transform.cpp), likewise.
$(OBJ)/data/image_transform.o: CXXFLAGS += -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off

$(OBJ)/mirrored/nodes.o: CXXFLAGS += $(MPI_CFLAGS)

# The build's version, `git describe` of the checkout ("unknown" outside one): mirrored/software.cpp
# alone is compiled with it, and again only when it changes (version.txt keeps the last one).
VERSION := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
VERSION_FILE := $(OBJ)/version.txt
$(shell mkdir -p $(OBJ) && (echo '$(VERSION)' | cmp -s - $(VERSION_FILE) || echo '$(VERSION)' > $(VERSION_FILE)))
$(OBJ)/mirrored/software.o: $(VERSION_FILE)
$(OBJ)/mirrored/software.o: CXXFLAGS += -DMIRRORED_VERSION='"$(VERSION)"'
$(OBJ)/kernels/cpu/jit_gemm.o: CXXFLAGS += $(XSMM_CFLAGS)

$(OBJ)/%.cu.o: %.cu $(FLAGS_FILE) | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MF $(@:.o=.d) -c $< -o $@

# A .cu file for the emulated GPU: launches rewritten into calls, device code given by kernel_emu.h.
$(OBJ)/%.emu.o: %.cu $(wildcard kernels/cuda/*.cuh) tests/cuda_emu/rewrite.pl tests/cuda_emu/kernel_emu.h $(FLAGS_FILE) | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	perl tests/cuda_emu/rewrite.pl $< > $(@:.o=.cpp)
	$(CXX) $(CXXFLAGS) -Wno-attributes -Wno-sign-compare -Itests/cuda_emu/include -include tests/cuda_emu/kernel_emu.h \
	  -c $(@:.o=.cpp) -o $@

install-deps:
	scripts/install_deps.sh

# The default run reads the real Fashion-MNIST files (package dataset-fashion-mnist).
train: $(BUILD)/mirrored
	@test -n "$$MIRRORED_DATA_DIR" || test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
	  || scripts/install_deps.sh
	$(BUILD)/mirrored train $(CONFIG) $(ARGS)

# A byte-level GPT on the source of Python's standard library (configs/python_gpt.yaml): the token
# files are written once, from the distribution's python3.
GPT_DATA := runs/data/python-stdlib
train-gpt: $(BUILD)/mirrored
	@test -f $(GPT_DATA)/meta.json || /usr/bin/python3 scripts/prepare_text.py --python-stdlib --out $(GPT_DATA)
	$(BUILD)/mirrored train configs/python_gpt.yaml $(ARGS)

train-llama: $(BUILD)/mirrored
	@test -f $(GPT_DATA)/meta.json || /usr/bin/python3 scripts/prepare_text.py --python-stdlib --out $(GPT_DATA)
	$(BUILD)/mirrored train configs/python_llama.yaml $(ARGS)

# The Llama-style model on the same files tokenized by a byte-level BPE of 2,048 tokens trained on
# the training files (configs/python_llama_bpe.yaml); the same files held out as train-gpt's.
BPE_DATA := runs/data/python-stdlib-bpe
train-llm: $(BUILD)/mirrored
	@test -f $(BPE_DATA)/meta.json || $(BUILD)/mirrored tokenize \
	  $$(/usr/bin/python3 scripts/prepare_text.py --python-stdlib --list) --train-bpe 2048 --val-every 10 --out $(BPE_DATA)
	$(BUILD)/mirrored train configs/python_llama_bpe.yaml $(ARGS)

# The CNN from a folder of JPEG images written once from Fashion-MNIST (needs python3-pil).
IMAGE_DATA := runs/data/fashion-mnist-images
train-images: $(BUILD)/mirrored
	@test -f $(IMAGE_DATA)/meta.json || { test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
	  && /usr/bin/python3 -c 'import PIL' 2>/dev/null || scripts/install_deps.sh --pytorch; \
	  /usr/bin/python3 scripts/make_image_folder.py --out $(IMAGE_DATA); }
	$(BUILD)/mirrored train configs/fashion_mnist_images.yaml $(ARGS)

# make test asserts nothing about speed, so it passes on a busy machine; the tests that time the
# machine (suite "timing": the planner's predictions against measurements) run on their own.
test: $(BUILD)/mirrored_tests $(BUILD)/mirrored
	$(BUILD)/mirrored_tests -tse=timing

test-timing: $(BUILD)/mirrored_tests $(BUILD)/mirrored
	$(BUILD)/mirrored_tests -ts=timing

# ThreadSanitizer over the whole suite, CPU-only (the CUDA runtime is opaque to it): the CPU and
# simulated-GPU replicas, the loader and the trainer's threads. Its own build folder.
test-tsan:
	$(MAKE) -j$(shell nproc) BUILD=build-tsan CUDA_HOME=/nonexistent WITH_MPI=0 CXXFLAGS_EXTRA="-fsanitize=thread -O1" \
	  LDFLAGS_EXTRA="-fsanitize=thread" build-tsan/mirrored_tests build-tsan/mirrored
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/mirrored_tests -tse=timing

# The CUDA backend's own source on emulated GPUs (tests/cuda_emu/README.md): every test that skips
# without a GPU runs the backend's kernels, cuBLAS, cuBLASLt and graph calls on the CPU, on eager
# streams and again (but the emulator's own tests) on asynchronous ones that reorder the work.
# EMU_TESTS: doctest filters, by default the GPU tests (suite "cuda"), those that need the
# emulator's knobs ("emulated") and the emulator's own ("emulator"); EMU_TESTS= runs every test.
# The host objects are $(BUILD)'s own (HOST_BUILD).
EMU_TESTS ?= -ts=cuda,emulated,emulator
test-cuda-emu:
	@test -f $(CUDA_HOME)/include/cuda_runtime.h || \
	  { echo "test-cuda-emu: no CUDA toolkit headers under $(CUDA_HOME) (set CUDA_HOME)"; exit 2; }
	@! grep -rlE 'MIRRORED_(CUDA|NCCL)\b|#include <(cuda|cublas|nccl)' base kernels/*.* kernels/cpu kernels/ops/*.h kernels/ops/*.cpp kernels/sim data mirrored \
	  tests/*.cpp tests/*.h tests/fuzz || { echo "test-cuda-emu: the files above see CUDA: $(BUILD)'s objects cannot be shared"; exit 2; }
	$(MAKE) -j$(shell nproc) host-objects
	$(MAKE) -j$(shell nproc) BUILD=build-emu CUDA_EMU=1 HOST_BUILD=$(BUILD) build-emu/mirrored_tests build-emu/mirrored
	tests/cuda_emu/run_suites.sh build-emu/mirrored_tests $(EMU_TESTS)

# The same under AddressSanitizer (build-emu-asan/): a kernel, copy or GEMM reaching past its
# allocation (device allocations are exact-size host blocks) is reported where it happens.
test-cuda-emu-asan:
	$(MAKE) -j$(shell nproc) BUILD=build-emu-asan CUDA_EMU=1 WITH_MPI=0 CXXFLAGS_EXTRA="-fsanitize=address -fno-omit-frame-pointer -O1" \
	  LDFLAGS_EXTRA="-fsanitize=address" build-emu-asan/mirrored_tests build-emu-asan/mirrored
	ASAN_OPTIONS=detect_leaks=0 tests/cuda_emu/run_suites.sh build-emu-asan/mirrored_tests $(EMU_TESTS)

# Fuzz targets for every parser of untrusted input (tests/fuzz/targets.h): the library built by
# clang with coverage and AddressSanitizer + UndefinedBehaviorSanitizer, one binary per target.
# The parsers (the planner's --profile reader among them) sit below the trainer and the commands
# of mirrored/tools/, so those are not compiled for it (a minute of CI).
FUZZ_TARGETS := $(shell grep -oE '\{"[a-z0-9]+", [a-z0-9]+\}' tests/fuzz/targets.h | cut -d'"' -f2)
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB := $(BUILD)/libmirrored_parsers.a
fuzz-targets:
	@echo $(FUZZ_TARGETS)

fuzz:
	$(MAKE) -j$(shell nproc) BUILD=build-fuzz CUDA_HOME=/nonexistent WITH_MPI=0 CXX=clang++ \
	  CXXFLAGS_EXTRA="-fsanitize=fuzzer-no-link $(FUZZ_SAN) -O1" $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)

FUZZ_LEFT_OUT := $(filter $(OBJ)/mirrored/tools/%,$(LIB_OBJ)) $(OBJ)/mirrored/trainer.o
$(FUZZ_LIB): $(filter-out $(FUZZ_LEFT_OUT),$(LIB_OBJ))
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fuzz_%: tests/fuzz/fuzz_main.cpp $(OBJ)/tests/fuzz/targets.o $(FUZZ_LIB)
	$(CXX) -std=c++20 -O1 -g -I. -fsanitize=fuzzer $(FUZZ_SAN) -DMIRRORED_FUZZ_TARGET=$* $^ $(LDLIBS) -o $@

# The sources' format (.clang-format, clang-format 14 as Debian 12 ships it) and cppcheck's warning
# and portability checks over the host code (CUDA files are left to nvcc's warnings). A finding
# that is not one is suppressed inline with the reason beside it.
SOURCES = $(shell git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null)
format:
	clang-format -i $(SOURCES)

lint:
	@command -v clang-format >/dev/null && command -v cppcheck >/dev/null || scripts/install_deps.sh --lint
	@clang-format --dry-run --Werror $(SOURCES) && echo "lint: $(words $(SOURCES)) sources formatted as .clang-format says"
	cppcheck --enable=warning,portability --std=c++20 --language=c++ -I. --inline-suppr --quiet \
	  --suppress=missingIncludeSystem --error-exitcode=1 -j$(shell nproc) base data mirrored kernels/*.cpp kernels/cpu kernels/ops/*.cpp kernels/sim
	@echo "lint: clean"

clean:
	rm -rf $(BUILD) build-tsan build-fuzz build-emu build-emu-asan

-include $(LIB_OBJ:.o=.d) $(OP_CU_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(MAIN_OBJ:.o=.d)
