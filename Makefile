# mirrored - single-node multi-GPU data-parallel trainer.
#   make          build build/mirrored (CLI) and build/mirrored_tests
#   make train    install what is missing, build, train configs/fashion_mnist_mlp.yaml
#   make test     build and run every test; ends with "N passed, N failed[, N skipped]"
#   make clean
# CUDA: nvcc from $(CUDA_HOME) (default /usr/local/cuda); without it a CPU-only build.

CUDA_HOME ?= /usr/local/cuda
BUILD     ?= build
CONFIG    ?= configs/fashion_mnist_mlp.yaml
ARGS      ?=
NVCC      := $(wildcard $(CUDA_HOME)/bin/nvcc)

# --- dependencies: distribution packages only; scripts/install_deps.sh installs what is missing
REQUIRED_HEADERS := /usr/include/yaml-cpp/yaml.h /usr/include/doctest/doctest.h /usr/include/zlib.h \
                    /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp
CBLAS_HEADER := $(firstword $(wildcard /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/*/*/cblas.h))
MISSING_DEPS := $(filter-out $(wildcard $(REQUIRED_HEADERS)),$(REQUIRED_HEADERS)) $(if $(CBLAS_HEADER),,cblas.h)
DEPS_STEP := $(if $(strip $(MISSING_DEPS)),install-deps,)

# Recursive (=) so pkg-config runs after install-deps has had its chance; plain -l flags where a
# distribution ships no .pc file.
PKG_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null) $(shell pkg-config --cflags yaml-cpp 2>/dev/null)
PKG_LIBS   = $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas) \
             $(or $(shell pkg-config --libs yaml-cpp 2>/dev/null),-lyaml-cpp) -lz

CXXFLAGS_BASE := -std=c++20 -O2 -g -Wall -Wextra -pthread -MMD -MP -I.
CXXFLAGS_EXTRA ?=
CXXFLAGS = $(CXXFLAGS_BASE) $(PKG_CFLAGS) $(CXXFLAGS_EXTRA)
LDFLAGS_EXTRA ?=
LDLIBS = $(PKG_LIBS) -pthread -ldl

LIB_CPP := $(wildcard kernels/*.cpp kernels/cpu/*.cpp data/*.cpp mirrored/*.cpp)
LIB_CPP := $(filter-out mirrored/main.cpp kernels/cuda_stub.cpp,$(LIB_CPP))
TEST_CPP := $(wildcard tests/*.cpp)

ifneq ($(NVCC),)
  GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
  NVCCFLAGS := -std=c++20 -O3 -I. -ccbin $(CXX) $(GENCODE) -Xcompiler -Wall,-Wextra,-pthread -MMD -MP
  LIB_CU := $(wildcard kernels/cuda/*.cu)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lnccl
  CXXFLAGS_BASE += -isystem $(CUDA_HOME)/include -DMIRRORED_CUDA=1
else
  $(info mirrored: nvcc not found under $(CUDA_HOME); building the CPU-only backend)
  LIB_CPP += kernels/cuda_stub.cpp
  LIB_CU :=
  CUDA_LIBS :=
endif

OBJ := $(BUILD)/obj
LIB_OBJ := $(LIB_CPP:%.cpp=$(OBJ)/%.o) $(LIB_CU:%.cu=$(OBJ)/%.cu.o)
TEST_OBJ := $(TEST_CPP:%.cpp=$(OBJ)/%.o)
LIB := $(BUILD)/libmirrored.a

.PHONY: all train test clean install-deps bench
all: $(BUILD)/mirrored $(BUILD)/mirrored_tests

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/mirrored: $(OBJ)/mirrored/main.o $(LIB)
	$(CXX) -o $@ $^ $(LDFLAGS_EXTRA) $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/mirrored_tests: $(TEST_OBJ) $(LIB)
	$(CXX) -o $@ $^ $(LDFLAGS_EXTRA) $(LDLIBS) $(CUDA_LIBS)

$(OBJ)/%.o: %.cpp | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(OBJ)/%.cu.o: %.cu | $(DEPS_STEP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MF $(@:.o=.d) -c $< -o $@

install-deps:
	scripts/install_deps.sh

# The default run reads the real Fashion-MNIST files (package dataset-fashion-mnist).
train: $(BUILD)/mirrored
	@test -n "$$MIRRORED_DATA_DIR" || test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
	  || scripts/install_deps.sh
	$(BUILD)/mirrored train $(CONFIG) $(ARGS)

test: $(BUILD)/mirrored_tests $(BUILD)/mirrored
	$(BUILD)/mirrored_tests

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(OBJ)/mirrored/main.d
