# moonkaas — build the library, the Lua module, the CUDA plugin and the tests.
#
#   make            build/libmoonkaas.{so,a}, build/moonkaas/core.so (Lua module), C tests,
#                   and where nvcc is found the CUDA plugin build/libmoonkaas_cuda.so (with
#                   a copy in build/moonkaas/, beside core.so). The core links no CUDA
#                   library: it opens the plugin (core/plugin.c) the first time CUDA is asked for.
#   make test       every C test, busted spec and example; ends with "N passed, N failed, N skipped"
#   make examples   build/examples/game_loop (a game host embedding Lua and moonkaas)
#   make asan       the same under AddressSanitizer + UBSan (build-asan/; the plugin's
#                   kernels are build/'s objects: nvcc runs for build/ only)
#   make valgrind   the C tests and CPU specs under valgrind (build-valgrind/, CUDA=0)
#   make tsan       every C test (threads_test's threads among them) under ThreadSanitizer
#                   (build-tsan/, CUDA=0, without OpenMP); any race report fails
#   make fuzz       each libFuzzer target in spec/fuzz/ for FUZZ_SECONDS (default 60) under
#                   ASan + UBSan, built with clang in build-fuzz/ (no OpenMP: one thread per
#                   run); fails if any target crashes
#   make plugin     only the CUDA plugin (and its copy beside core.so)
#   make module     only the Lua module and the plugin beside it (what luarocks builds)
#   make CUDA=1     force the CUDA plugin (default: built when nvcc is found); CUDA=0: no plugin
#   make CUDNN=0    the plugin without cuDNN (default: with it when cudnn_graph.h is found)

BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
# Built where it runs (make, luarocks): use the machine's vector units; ARCH= for a portable build.
ARCH     ?= -march=native
CFLAGS   ?= $(OPT) $(ARCH) -g
SAN      ?=
OPENMP   ?= -fopenmp
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fPIC $(OPENMP) \
            -fvisibility=hidden -DMK_BUILDING -Icore $(SAN)
# -ldl -pthread: plugin.c opens the CUDA plugin once (dlopen, pthread_once), and
# cpu.c OpenBLAS (at the compile of the first model with a lone product)
LDLIBS   += -lm $(OPENMP) -ldl -pthread $(SAN)
LUA      ?= lua5.4
LUA_INCDIR ?= $(firstword $(wildcard /usr/include/lua5.4) /usr/include)
LUA_LIBDIR ?= $(LUA_INCDIR)/../../lib/x86_64-linux-gnu
BLAS_INC ?= $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread) /usr/include/x86_64-linux-gnu)
CFLAGS   += -I$(BLAS_INC)

# ---- the CUDA plugin's toolchain ------------------------------------------------
NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA     ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= sm_90
CUDNN_INC ?= $(firstword $(dir $(wildcard /usr/include/x86_64-linux-gnu/cudnn_graph.h $(CUDA_HOME)/include/cudnn_graph.h /usr/include/cudnn_graph.h)))
CUDNN    ?= $(if $(CUDNN_INC),1,0)
ifneq ($(CUDA),1)
CUDNN    := 0
endif

CORE_SRC := $(wildcard core/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)

LUA_SRC  := $(wildcard lua/*.c)
LUA_OBJ  := $(LUA_SRC:%.c=$(BUILD)/%.o)
CTEST_SRC := $(wildcard spec/c/*_test.c)
CTESTS   := $(CTEST_SRC:spec/c/%.c=$(BUILD)/tests/%)

LIB_SO   := $(BUILD)/libmoonkaas.so
LIB_A    := $(BUILD)/libmoonkaas.a
LUA_MOD  := $(BUILD)/moonkaas/core.so

# The plugin: kernels/*.cu (cudnn_fuser.cu only with CUDNN=1) and its own copies of the
# core's error.c and tensor.c (mk_fail, the string builder, dtypes, mk_walk, mk_fault).
PLUGIN_NAME := libmoonkaas_cuda.so
PLUGIN   :=
PLUGIN_LUA :=
CU_OBJ   :=
ifeq ($(CUDA),1)
PLUGIN   := $(BUILD)/$(PLUGIN_NAME)
PLUGIN_LUA := $(BUILD)/moonkaas/$(PLUGIN_NAME)
CU_SRC   := $(filter-out $(if $(filter 1,$(CUDNN)),,kernels/cudnn_fuser.cu),$(wildcard kernels/*.cu))
# CU_BUILD: where nvcc's objects go. The sanitizer trees take the plain tree's
# (their host C is rebuilt, the kernels' objects are the same): nvcc runs once.
CU_BUILD ?= $(BUILD)
CU_OBJ   := $(CU_SRC:%.cu=$(CU_BUILD)/%.o)
PLUGIN_CORE_OBJ := $(BUILD)/plugin/core/error.o $(BUILD)/plugin/core/tensor.o
# The core knows only that a plugin was built (mk_build_info), never a CUDA header.
CFLAGS   += -DMK_WITH_CUDA $(if $(filter 1,$(CUDNN)),-DMK_WITH_CUDNN)
NVFLAGS  ?= -O3 -g -lineinfo
NVFLAGS  += -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -DMK_BUILDING -DMK_WITH_CUDA -Icore \
            $(if $(filter 1,$(CUDNN)),-DMK_WITH_CUDNN $(if $(CUDNN_INC),-I$(CUDNN_INC))) \
            $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(subst sm_,,$(a)),code=$(a))
# Only the entry is exported (kernels/plugin.map); -Bsymbolic binds the plugin's own
# references to its own copies; -z defs: everything it needs is in it or its libraries.
PLUGIN_LDFLAGS := -shared -Wl,--version-script=kernels/plugin.map -Wl,-Bsymbolic -Wl,-z,defs \
            -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64
PLUGIN_LIBS := -lcublas -lcudart -lnvrtc $(if $(filter 1,$(CUDNN)),-lcudnn) -lstdc++ -lm $(SAN)
endif

all: $(LIB_SO) $(LIB_A) $(if $(LUA_SRC),$(LUA_MOD)) $(CTESTS) $(PLUGIN) $(PLUGIN_LUA)
module: $(LUA_MOD) $(PLUGIN_LUA)
plugin: $(PLUGIN) $(PLUGIN_LUA)

# Every object depends on what the build includes (CUDA, CUDNN): switching CUDA=0/1 or
# CUDNN=0/1 in one build tree rebuilds what it changes, never a mix of both.
CONFIG   := CUDA=$(CUDA) CUDNN=$(CUDNN)
STAMP    := $(BUILD)/.config
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(STAMP) 2>/dev/null)" = '$(CONFIG)' ] || printf '%s\n' '$(CONFIG)' > $(STAMP); })
# kernels' objects taken from another tree must be of this configuration
ifneq ($(CU_BUILD),$(BUILD))
ifneq ($(CUDA),0)
ifneq ($(shell cat $(CU_BUILD)/.config 2>/dev/null),$(CONFIG))
$(error CU_BUILD=$(CU_BUILD) has no kernels built with $(CONFIG): make BUILD=$(CU_BUILD) plugin first)
endif
endif
endif
endif

$(BUILD)/core/%.o: core/%.c core/moonkaas.h core/internal.h $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The build directory is the plugin's last-but-one place to look (core/plugin.c).
$(BUILD)/core/plugin.o: CFLAGS += -DMK_CUDA_PLUGIN_DIR='"$(abspath $(BUILD))"'

$(BUILD)/lua/%.o: lua/%.c $(wildcard lua/*.h) core/moonkaas.h $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu -c $< -o $@

$(LIB_A): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(CORE_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

# The Lua module links the static library: one self-contained core.so.
$(LUA_MOD): $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $(LUA_OBJ) $(LIB_A) $(LDLIBS)

$(BUILD)/tests/%: spec/c/%.c spec/c/test.h spec/c/mnist_script.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ispec/c -o $@ $< $(LIB_A) $(LDLIBS)

# The embedding example: a C host with its own lua_State and the module linked in.
$(BUILD)/tests/lua_host_test: spec/c/lua_host_test.c spec/c/test.h $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu -Ispec/c -Ilua -o $@ $< $(LUA_OBJ) $(LIB_A) -L$(LUA_LIBDIR) -l$(LUA) $(LDLIBS)

# The game-loop host (scripts/game_loop.c): Lua and the module linked in, like lua_host_test.
EXAMPLES := $(BUILD)/examples/game_loop
examples: $(EXAMPLES) $(PLUGIN)
$(BUILD)/examples/game_loop: scripts/game_loop.c $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu -o $@ $< $(LUA_OBJ) $(LIB_A) -L$(LUA_LIBDIR) -l$(LUA) $(LDLIBS)

# ---- the CUDA plugin ------------------------------------------------------------------
ifeq ($(CUDA),1)
# The device code that generated kernels take as it is (helpers, and the attention
# kernel's body), kept as real CUDA files (kernels/skeletons/*.cuh) and embedded as
# C strings (mk_skeleton_NAME) for the generators.
SKELETONS := $(wildcard kernels/skeletons/*.cuh)
$(CU_BUILD)/kernels/skeletons.h: $(SKELETONS) kernels/skeletons/embed.sh
	@mkdir -p $(dir $@)
	sh kernels/skeletons/embed.sh $(SKELETONS) > $@.tmp && mv $@.tmp $@

$(CU_BUILD)/kernels/%.o: kernels/%.cu core/moonkaas.h core/internal.h $(wildcard kernels/*.h) \
                         $(CU_BUILD)/kernels/skeletons.h $(CU_BUILD)/.config
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -I$(CU_BUILD)/kernels -c $< -o $@

$(BUILD)/plugin/core/%.o: core/%.c core/moonkaas.h core/internal.h $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(PLUGIN): $(CU_OBJ) $(PLUGIN_CORE_OBJ) kernels/plugin.map
	$(CC) $(PLUGIN_LDFLAGS) -o $@ $(CU_OBJ) $(PLUGIN_CORE_OBJ) $(PLUGIN_LIBS)

# A copy beside the Lua module: the core looks in its own file's directory first.
# Renamed into place, not copied over: a process that has the old copy loaded
# (a spec run during a rebuild) keeps it, where a copy over it crashed that
# process when its mapped pages changed.
$(PLUGIN_LUA): $(PLUGIN)
	@mkdir -p $(dir $@)
	cp -f $< $@.tmp && mv -f $@.tmp $@
endif

# luarocks (build type make) calls `make module` then `make install` with these set.
PREFIX      ?= /usr/local
INST_LIBDIR ?= $(PREFIX)/lib/lua/5.4
INST_LUADIR ?= $(PREFIX)/share/lua/5.4
install: module
	install -d $(INST_LIBDIR)/moonkaas $(INST_LUADIR)/moonkaas
	install -m 755 $(LUA_MOD) $(INST_LIBDIR)/moonkaas/core.so
	$(if $(PLUGIN_LUA),install -m 755 $(PLUGIN_LUA) $(INST_LIBDIR)/moonkaas/$(PLUGIN_NAME))
	cd lua && find moonkaas -name '*.lua' -exec install -D -m 644 {} $(INST_LUADIR)/{} \;

test: all examples
	@sh spec/run_tests.sh $(BUILD)

# The whole suite under AddressSanitizer + UBSan, in a separate build tree. Its
# plugin links its own sanitized copies of the core's C with the kernels' objects
# of $(BUILD) (nvcc compiles them once; host code compiled by nvcc is not
# instrumented either way).
asan:
	$(MAKE) plugin
	$(MAKE) BUILD=build-asan CU_BUILD=$(BUILD) OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" all examples
	ASAN=1 sh spec/run_tests.sh build-asan

# The C tests and the CPU specs under valgrind (leaks are errors), in a CPU-only
# build (CUDA=0: valgrind would only walk NVRTC and the CUDA libraries, for
# minutes) without -march=native: valgrind does not decode every extension (AVX-512).
valgrind:
	$(MAKE) BUILD=build-valgrind CUDA=0 ARCH= all examples
	sh spec/valgrind.sh build-valgrind

# The C tests under ThreadSanitizer, in a CPU-only build (CUDA=0: without a GPU the
# plugin runs no thread of ours). libgomp and OpenBLAS are not built with TSan: it
# cannot see how they hand work to their own threads and would report races in their
# frames. So this tree is built without OpenMP (-fopenmp-simd: each `#pragma omp
# parallel` loop runs on its calling thread) and spec/tsan.sh runs OpenBLAS on the
# calling thread (OPENBLAS_NUM_THREADS=1); nothing is suppressed. The first report
# fails its test (halt_on_error, exit code 66) and the target.
tsan:
	$(MAKE) BUILD=build-tsan CUDA=0 OPENMP=-fopenmp-simd OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=thread" all
	sh spec/tsan.sh build-tsan

# libFuzzer targets (spec/fuzz/*_fuzz.c) over a clang build of the library and the
# binding with ASan + UBSan; spec/fuzz/seeds.lua writes their seed corpora (with
# the plain Lua module) into build-fuzz/seeds; spec/fuzz/run.sh runs each target on
# a scratch copy of its seeds and prints the executions per target.
FUZZ_SECONDS ?= 60
FUZZ_CC  ?= clang
FUZZ_BINS := $(patsubst spec/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard spec/fuzz/*_fuzz.c))
fuzz:
	$(MAKE) BUILD=build-fuzz CC=$(FUZZ_CC) CUDA=0 ARCH= OPENMP= OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" fuzz-targets
	$(MAKE) $(LUA_MOD)
	rm -rf build-fuzz/seeds
	MK_BUILD=$(BUILD) $(LUA) spec/fuzz/seeds.lua build-fuzz/seeds > /dev/null
	sh spec/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

fuzz-targets: $(FUZZ_BINS)

$(BUILD)/fuzz/%: spec/fuzz/%.c spec/fuzz/fuzz.h $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu \
	    -DMK_FUZZ_ROOT='"$(abspath .)"' -o $@ $< $(LUA_OBJ) $(LIB_A) -L$(LUA_LIBDIR) -l$(LUA) $(LDLIBS)

clean:
	rm -rf build build-asan build-valgrind build-tsan build-nocudnn build-fuzz

.PHONY: all module plugin test examples asan valgrind tsan fuzz fuzz-targets clean install
