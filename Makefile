# moonkaas — build the library, the Lua module, the CUDA plugin and the tests.
#
#   make            build/libmoonkaas.{so,a}, build/moonkaas/core.so (Lua module), C tests,
#                   and where nvcc is found the CUDA plugin build/libmoonkaas_cuda.so (with
#                   a copy in build/moonkaas/, beside core.so). The core links no CUDA
#                   library: it opens the plugin (core/plugin.c) the first time CUDA is asked for.
#   make test       every C test, busted spec and example, as many at a time as there are
#                   cores (JOBS=1: one by one); ends with "N passed, N failed, N skipped"
#   make LUA=luajit / LUA=lua5.1   the Lua module for LuaJIT or Lua 5.1 (build-luajit/,
#                   build-lua51/); make test-luajit / test-lua51 run the CPU specs there
#   make examples   build and run examples/ (CPU): mlp.lua, transformer_block.lua, cnn.lua, gpt2_block.lua,
#                   llama2_chat.lua, host.c (the C API tour), game_loop.c (a game host)
#   make asan       the same under AddressSanitizer + UBSan (build-asan/; the plugin's
#                   kernels are build/'s objects: nvcc runs for build/ only)
#   make valgrind   the C tests and CPU specs under valgrind (build-valgrind/, CUDA=0), one
#                   job per test or spec file, as many at a time as there are cores
#   make tsan       the C tests that start threads (threads_test, reentry_test, ...) under
#                   ThreadSanitizer (build-tsan/, CUDA=0, without OpenMP); any race report fails
#   make fuzz       each libFuzzer target in spec/fuzz/ for FUZZ_SECONDS (default 60) under
#                   ASan + UBSan, built with clang in build-fuzz/ (no OpenMP: one thread per
#                   run), as many targets at a time as there are cores; fails if any crashes
#   make plugin     only the CUDA plugin (and its copy beside core.so)
#   make module     only the Lua module and the plugin beside it (what luarocks builds)
#   make install    PREFIX=/usr/local (DESTDIR= for staging): the C library (lib/libmoonkaas.{so,a}),
#                   include/moonkaas.h, lib/pkgconfig/moonkaas.pc, the CUDA plugin in
#                   lib/moonkaas/, the Lua module (lib/lua/5.4, share/lua/5.4) and the scripts
#                   (share/moonkaas/scripts); `make uninstall` (same PREFIX) removes them
#   make CUDA=1     force the CUDA plugin (default: built when nvcc is found); CUDA=0: no plugin
#   make ONNX=0     without the ONNX importer (default: with it where protoc-c and
#                   libprotobuf-c are found; core/onnx/)
#   make CUDNN=0    the plugin without cuDNN (default: with it when cudnn_graph.h is found)
#   make CUDA_ARCH=sm_90   the plugin's machine code for one GPU generation (default: sm_80 sm_86
#                   sm_89 sm_90, A100 to H100, and PTX of the newest for later GPUs to JIT)

# LUA=luajit or LUA=lua5.1 builds the module for that host (lua/compat.h), each in
# its own tree so it never mixes with the 5.4 one: build-luajit/, build-lua51/.
LUA      ?= lua5.4
BUILD    ?= $(or $(if $(filter luajit,$(LUA)),build-luajit),$(if $(filter lua5.1,$(LUA)),build-lua51),build)
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
# cpu/matmul.c OpenBLAS (at the compile of the first model with a lone product)
LDLIBS   += -lm $(OPENMP) -ldl -pthread $(SAN)

# ---- where the headers and libraries are: pkg-config first, then the compiler's
# multiarch directory (Debian: /usr/include/<triplet>), never a fixed machine's path
PKG_CONFIG ?= pkg-config
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
pc_cflags = $(shell $(PKG_CONFIG) --cflags-only-I $(1) 2>/dev/null)
LUA_PC   ?= $(LUA)
LUA_CFLAGS_PC := $(call pc_cflags,$(LUA_PC))
LUA_INCDIR ?= $(or $(patsubst -I%,%,$(firstword $(LUA_CFLAGS_PC))),$(firstword $(wildcard /usr/include/$(LUA)) /usr/include))
LUA_LIBS_PC := $(shell $(PKG_CONFIG) --libs $(LUA_PC) 2>/dev/null)
# without a .pc: the library beside the headers' prefix (a Lua unpacked under a prefix)
LUA_LIBS ?= $(or $(LUA_LIBS_PC),-L$(abspath $(LUA_INCDIR)/../../lib/$(MULTIARCH)) -l$(LUA))
# Debian's luaconf.h includes lua5.x-deb-multiarch.h from the multiarch folder beside
LUA_CFLAGS ?= -I$(LUA_INCDIR) -I$(abspath $(LUA_INCDIR)/../$(MULTIARCH))
BLAS_CFLAGS_PC := $(call pc_cflags,openblas)
BLAS_INC ?= $(or $(patsubst -I%,%,$(firstword $(BLAS_CFLAGS_PC))),$(firstword $(wildcard /usr/include/$(MULTIARCH)/openblas-pthread /usr/include/openblas) /usr/include))
CFLAGS   += -I$(BLAS_INC)
# oneDNN's header: the CPU's convolutions may take oneDNN, opened at run time
# (core/cpu/conv_dnnl.c); DNNL=0, or no header, builds im2col only.
DNNL     ?= $(if $(wildcard /usr/include/oneapi/dnnl/dnnl.h),1,0)
CFLAGS   += $(if $(filter 1,$(DNNL)),-DMK_WITH_DNNL)

# ---- the CUDA plugin's toolchain ------------------------------------------------
NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA     ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Machine code for each GPU generation in CUDA_ARCH (spaces or semicolons between):
# sm_80 A100; sm_86 RTX 30, A10, A40 (and Jetson Orin's 8.7: machine code runs on later
# minors of its major); sm_89 L4, L40S, RTX 40; sm_90 H100, H200. Plus PTX of the newest
# (CUDA_PTX; empty for none), which the driver compiles at first use for any later GPU
# (Blackwell). Each entry is one more ptxas pass over every file: CI builds one.
CUDA_ARCH ?= sm_80 sm_86 sm_89 sm_90
CUDA_ARCHS := $(subst ;, ,$(CUDA_ARCH))
comma    := ,
ifeq ($(origin CUDA_PTX),undefined)
CUDA_PTX := $(if $(CUDA_ARCHS),compute_$(shell printf '%s\n' $(subst sm_,,$(CUDA_ARCHS)) | sort -n | tail -n 1))
endif
CUDNN_INC ?= $(firstword $(dir $(wildcard /usr/include/$(MULTIARCH)/cudnn_graph.h $(CUDA_HOME)/include/cudnn_graph.h /usr/include/cudnn_graph.h)))
CUDNN    ?= $(if $(CUDNN_INC),1,0)
ifneq ($(CUDA),1)
CUDNN    := 0
endif

# core/cpu/: the CPU device, its files sharing core/cpu/*.h; core/codegen/: the
# generators of the CUDA kernels (plain C, built into the core and the plugin).
CODEGEN_SRC := $(wildcard core/codegen/*.c)
CORE_SRC := $(wildcard core/*.c core/cpu/*.c core/onnx/*.c) $(CODEGEN_SRC)
CORE_H   := $(wildcard core/*.h)

# core/onnx/: the ONNX importer, its ModelProto read by the C protoc-c generates from
# core/onnx/onnx.proto into $(BUILD)/core/onnx/ (protobuf-c: Debian's protobuf-c-compiler
# and libprotobuf-c-dev). Without them (or ONNX=0) core/onnx/none.c stands in: the
# core builds, and opening an ONNX file says it was built without protobuf-c.
PROTOC_C ?= $(shell command -v protoc-c 2>/dev/null)
PROTOBUF_C_H := $(firstword $(wildcard /usr/include/protobuf-c/protobuf-c.h /usr/local/include/protobuf-c/protobuf-c.h))
ONNX     ?= $(if $(and $(PROTOC_C),$(PROTOBUF_C_H)),1,0)
ONNX_GEN := $(BUILD)/core/onnx/onnx.pb-c
ifeq ($(ONNX),1)
CORE_SRC := $(filter-out core/onnx/none.c,$(CORE_SRC))
CFLAGS   += -I$(BUILD)/core/onnx -DMK_WITH_ONNX
ONNX_LIBS := -lprotobuf-c
LDLIBS   += $(ONNX_LIBS)
else
CORE_SRC := $(filter-out core/onnx/import.c core/onnx/onnx_ops.c core/onnx/values.c,$(CORE_SRC))
ONNX_LIBS :=
endif
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o) $(if $(filter 1,$(ONNX)),$(ONNX_GEN).o)

LUA_SRC  := $(wildcard lua/*.c)
LUA_OBJ  := $(LUA_SRC:%.c=$(BUILD)/%.o)
CTEST_SRC := $(wildcard spec/c/*_test.c)
CTESTS   := $(CTEST_SRC:spec/c/%.c=$(BUILD)/tests/%)
# For a Lua 5.1 host (LUA=luajit, LUA=lua5.1) the module and the C tests, less the
# programs that embed a Lua 5.4 of their own (lua_host_test, the examples).
LUA51_HOST := $(filter luajit lua5.1,$(LUA))
ifneq ($(LUA51_HOST),)
CTESTS   := $(filter-out $(BUILD)/tests/lua_host_test,$(CTESTS))
endif

LIB_SO   := $(BUILD)/libmoonkaas.so
LIB_A    := $(BUILD)/libmoonkaas.a
LUA_MOD  := $(BUILD)/moonkaas/core.so

# The plugin: kernels/*.cu (cudnn_fuser.cu only with CUDNN=1) and its own copies of the
# core's error.c, tensor.c (mk_fail, the string builder, dtypes, mk_walk, mk_fault),
# file.c (the kernel cache's safe writes and digests) and of the generators
# (core/codegen/*.c).
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
PLUGIN_CORE_OBJ := $(BUILD)/plugin/core/error.o $(BUILD)/plugin/core/tensor.o \
                   $(BUILD)/plugin/core/file.o $(CODEGEN_SRC:%.c=$(BUILD)/plugin/%.o)
# The core knows only that a plugin was built (mk_build_info), never a CUDA header.
CFLAGS   += -DMK_WITH_CUDA $(if $(filter 1,$(CUDNN)),-DMK_WITH_CUDNN)
NVFLAGS  ?= -O3 -g -lineinfo
NVFLAGS  += -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -DMK_BUILDING -DMK_WITH_CUDA -Icore \
            $(if $(filter 1,$(CUDNN)),-DMK_WITH_CUDNN $(if $(CUDNN_INC),-I$(CUDNN_INC))) \
            $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(subst sm_,,$(a)),code=$(a)) \
            $(if $(CUDA_PTX),-gencode arch=$(CUDA_PTX)$(comma)code=$(CUDA_PTX))
# Only the entry is exported (kernels/plugin.map); -Bsymbolic binds the plugin's own
# references to its own copies; -z defs: everything it needs is in it or its libraries.
PLUGIN_LDFLAGS := -shared -Wl,--version-script=kernels/plugin.map -Wl,-Bsymbolic -Wl,-z,defs \
            -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64
PLUGIN_LIBS := -lcublas -lcudart -lnvrtc $(if $(filter 1,$(CUDNN)),-lcudnn) -lstdc++ -lm -ldl $(SAN)
endif

all: $(LIB_SO) $(LIB_A) $(if $(LUA_SRC),$(LUA_MOD)) $(CTESTS) $(PLUGIN) $(PLUGIN_LUA)
module: $(LUA_MOD) $(PLUGIN_LUA)
plugin: $(PLUGIN) $(PLUGIN_LUA)

# Every object depends on what the build includes (CUDA, CUDNN): switching CUDA=0/1 or
# CUDNN=0/1 in one build tree rebuilds what it changes, never a mix of both.
CONFIG   := CUDA=$(CUDA) CUDNN=$(CUDNN) ONNX=$(ONNX)$(if $(filter 1,$(CUDA)), CUDA_ARCH=$(CUDA_ARCHS) CUDA_PTX=$(CUDA_PTX))
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

$(BUILD)/core/%.o: core/%.c core/moonkaas.h $(CORE_H) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(filter $(BUILD)/core/cpu/%,$(CORE_OBJ)): $(wildcard core/cpu/*.h)

ifeq ($(ONNX),1)
$(ONNX_GEN).c $(ONNX_GEN).h: core/onnx/onnx.proto
	@mkdir -p $(dir $@)
	$(PROTOC_C) --c_out=$(dir $@) -Icore/onnx core/onnx/onnx.proto
$(ONNX_GEN).o: $(ONNX_GEN).c $(ONNX_GEN).h $(STAMP)
	$(CC) $(CFLAGS) -Wno-unused-parameter -c $< -o $@
$(BUILD)/core/onnx/import.o $(BUILD)/core/onnx/onnx_ops.o $(BUILD)/core/onnx/values.o: \
    $(ONNX_GEN).h core/onnx/onnx.h
# onnx_test builds its files with the generated C
$(BUILD)/tests/onnx_test: $(ONNX_GEN).h
endif

# The device code that generated kernels take as it is (helpers, and the attention
# kernel's body), kept as real CUDA files (kernels/skeletons/*.cuh) and embedded as
# C strings (mk_skeleton_NAME) for the generators, in every build (CUDA=0 too:
# model:kernel_source needs no plugin); the plugin's kernels #include those they share
# (the fault record, PDL, the timeline's stamps, the cluster barrier). embed.sh needs
# only sh, awk and sed.
SKELETONS := $(wildcard kernels/skeletons/*.cuh)
SKELETONS_H := $(BUILD)/core/codegen/skeletons.h
$(SKELETONS_H): $(SKELETONS) kernels/skeletons/embed.sh
	@mkdir -p $(dir $@)
	sh kernels/skeletons/embed.sh $(SKELETONS) > $@.tmp && mv $@.tmp $@
$(CODEGEN_SRC:%.c=$(BUILD)/%.o) $(CODEGEN_SRC:%.c=$(BUILD)/plugin/%.o): \
    $(wildcard core/codegen/*.h) $(SKELETONS_H)
$(CODEGEN_SRC:%.c=$(BUILD)/%.o) $(CODEGEN_SRC:%.c=$(BUILD)/plugin/%.o): \
    CFLAGS += -I$(dir $(SKELETONS_H))

# The build directory is baked into the library's plugin search, for programs that link
# libmoonkaas.a (the C tests, the examples), where it belongs to root or this user;
# core/plugin.c opens it only while it is still safe.
BAKED_DIR := $(shell o=$$(stat -c %u $(BUILD) 2>/dev/null); \
                     { [ "$$o" = 0 ] || [ "$$o" = "$$(id -u)" ]; } && echo '$(abspath $(BUILD))')
$(BUILD)/core/plugin.o: CFLAGS += -DMK_CUDA_PLUGIN_DIR='"$(BAKED_DIR)"'

# The Lua module looks beside itself only, with nothing baked in: luarocks builds it in
# a temporary tree that is deleted (and may be made again, by anyone) after the install.
$(BUILD)/module/plugin.o: core/plugin.c core/moonkaas.h $(CORE_H) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMK_CUDA_PLUGIN_BESIDE_ONLY=1 -c $< -o $@

$(BUILD)/lua/%.o: lua/%.c $(wildcard lua/*.h) core/moonkaas.h $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -c $< -o $@

$(LIB_A): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(CORE_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

# The Lua module has the core in it (its own plugin search): one self-contained core.so.
MODULE_CORE_OBJ := $(filter-out $(BUILD)/core/plugin.o,$(CORE_OBJ)) $(BUILD)/module/plugin.o
$(LUA_MOD): $(LUA_OBJ) $(MODULE_CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $(LUA_OBJ) $(MODULE_CORE_OBJ) $(LDLIBS)

# every test rebuilds when a header beside it changes (test.h, the shared helpers
# of a split test: lowp.h, table.h)
$(BUILD)/tests/%: spec/c/%.c $(wildcard spec/c/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ispec/c -o $@ $< $(LIB_A) $(LDLIBS)

# The embedding example: a C host with its own lua_State and the module linked in.
$(BUILD)/tests/lua_host_test: spec/c/lua_host_test.c spec/c/test.h $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -Ispec/c -Ilua -o $@ $< $(LUA_OBJ) $(LIB_A) $(LUA_LIBS) $(LDLIBS)

# ---- examples/ (make examples builds the C ones and runs every one; make test runs them
# through spec/run_tests.sh, counted as tests). The game loop embeds Lua and the module
# like lua_host_test; the C API tour links the library alone.
EXAMPLES := $(BUILD)/examples/host $(if $(LUA51_HOST),,$(BUILD)/examples/game_loop $(BUILD)/examples/llama2_server)
examples-build: $(EXAMPLES) $(PLUGIN) $(if $(LUA_SRC),$(LUA_MOD))
examples: examples-build
	sh examples/run.sh $(BUILD)
$(BUILD)/examples/game_loop: examples/game_loop.c $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -o $@ $< $(LUA_OBJ) $(LIB_A) $(LUA_LIBS) $(LDLIBS)
$(BUILD)/examples/llama2_server: examples/llama2_server.c $(LUA_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -o $@ $< $(LUA_OBJ) $(LIB_A) $(LUA_LIBS) $(LDLIBS)
$(BUILD)/examples/host: examples/host.c core/moonkaas.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# ---- the CUDA plugin ------------------------------------------------------------------
ifeq ($(CUDA),1)
$(CU_BUILD)/kernels/%.o: kernels/%.cu core/moonkaas.h $(CORE_H) $(wildcard core/codegen/*.h) \
                         $(wildcard kernels/*.h) $(SKELETONS) $(CU_BUILD)/.config
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/plugin/core/%.o: core/%.c core/moonkaas.h $(CORE_H) $(STAMP)
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

# ---- install ------------------------------------------------------------------------
# The version comes from core/moonkaas.h (MK_VERSION_*); the rockspec, the CHANGELOG and
# moonkaas.pc follow it (spec/install_spec.lua checks). 0.x: each minor may change the ABI.
VERSION_PARTS := $(shell sed -n 's/^\#define MK_VERSION_[A-Z]* *\([0-9][0-9]*\).*/\1/p' core/moonkaas.h)
VERSION  := $(subst $(eval) ,.,$(strip $(VERSION_PARTS)))
SONAME   := libmoonkaas.so.$(word 1,$(VERSION_PARTS)).$(word 2,$(VERSION_PARTS))
PREFIX      ?= /usr/local
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
DATADIR     ?= $(PREFIX)/share
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PLUGINDIR   ?= $(LIBDIR)/moonkaas
SCRIPTDIR   ?= $(DATADIR)/moonkaas/scripts
LUA_VERSION ?= 5.4
INST_LIBDIR ?= $(LIBDIR)/lua/$(LUA_VERSION)
INST_LUADIR ?= $(DATADIR)/lua/$(LUA_VERSION)
INST     := $(BUILD)/install

install: install-lib install-module install-scripts
	$(if $(PLUGIN),ln -sf $(PLUGINDIR)/$(PLUGIN_NAME) $(DESTDIR)$(INST_LIBDIR)/moonkaas/$(PLUGIN_NAME))

# The installed libraries bake PLUGINDIR into their plugin search (for programs that link
# libmoonkaas.a; libmoonkaas.so finds lib/moonkaas/ beside itself) where it belongs to root
# or this user now; core/plugin.c checks again at each load.
install-lib: $(CORE_OBJ) $(PLUGIN) moonkaas.pc.in
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) $(INST)
	$(if $(PLUGIN),install -d $(DESTDIR)$(PLUGINDIR) && install -m 755 $(PLUGIN) $(DESTDIR)$(PLUGINDIR)/$(PLUGIN_NAME))
	@o=$$(stat -c %u '$(DESTDIR)$(PLUGINDIR)' 2>/dev/null); dir=; \
	if [ -z '$(PLUGIN)' ]; then :; elif [ "$$o" = 0 ] || [ "$$o" = "$$(id -u)" ]; then dir='$(PLUGINDIR)'; \
	else echo "make install: $(DESTDIR)$(PLUGINDIR) belongs to user $$o: not baked in" >&2; fi; \
	echo "$(CC) ... -DMK_CUDA_PLUGIN_DIR='\"$$dir\"' -c core/plugin.c -o $(INST)/plugin.o"; \
	$(CC) $(CFLAGS) -DMK_CUDA_PLUGIN_DIR="\"$$dir\"" -c core/plugin.c -o $(INST)/plugin.o
	rm -f $(INST)/libmoonkaas.a
	ar rcs $(INST)/libmoonkaas.a $(filter-out $(BUILD)/core/plugin.o,$(CORE_OBJ)) $(INST)/plugin.o
	$(CC) -shared -Wl,-soname,$(SONAME) -o $(INST)/libmoonkaas.so.$(VERSION) \
	    $(filter-out $(BUILD)/core/plugin.o,$(CORE_OBJ)) $(INST)/plugin.o $(LDLIBS)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@PLUGINDIR@|$(PLUGINDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@LIBS_PRIVATE@|$(strip -lm $(OPENMP) -ldl -pthread $(ONNX_LIBS))|' moonkaas.pc.in > $(INST)/moonkaas.pc
	install -m 755 $(INST)/libmoonkaas.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libmoonkaas.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libmoonkaas.so
	install -m 644 $(INST)/libmoonkaas.a $(DESTDIR)$(LIBDIR)/
	install -m 644 core/moonkaas.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(INST)/moonkaas.pc $(DESTDIR)$(PKGCONFIGDIR)/

# What luarocks installs (build type make: `make module`, then this with INST_LIBDIR and
# INST_LUADIR set): the Lua module, and the plugin beside core.so, where it looks.
install-module: module
	install -d $(DESTDIR)$(INST_LIBDIR)/moonkaas $(DESTDIR)$(INST_LUADIR)/moonkaas
	install -m 755 $(LUA_MOD) $(DESTDIR)$(INST_LIBDIR)/moonkaas/core.so
	$(if $(PLUGIN_LUA),install -m 755 $(PLUGIN_LUA) $(DESTDIR)$(INST_LIBDIR)/moonkaas/$(PLUGIN_NAME))
	cd lua && find moonkaas -name '*.lua' -exec install -D -m 644 {} $(DESTDIR)$(INST_LUADIR)/{} \;

install-scripts:
	install -d $(DESTDIR)$(SCRIPTDIR)
	install -m 644 scripts/*.lua $(DESTDIR)$(SCRIPTDIR)/

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libmoonkaas.so $(DESTDIR)$(LIBDIR)/$(SONAME) \
	    $(DESTDIR)$(LIBDIR)/libmoonkaas.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libmoonkaas.a \
	    $(DESTDIR)$(INCLUDEDIR)/moonkaas.h $(DESTDIR)$(PKGCONFIGDIR)/moonkaas.pc \
	    $(DESTDIR)$(PLUGINDIR)/$(PLUGIN_NAME)
	rm -rf $(DESTDIR)$(INST_LIBDIR)/moonkaas $(DESTDIR)$(INST_LUADIR)/moonkaas $(DESTDIR)$(DATADIR)/moonkaas
	rmdir $(DESTDIR)$(PLUGINDIR) 2> /dev/null || true

test: all examples-build
	@sh spec/run_tests.sh $(BUILD)

# The CPU specs of spec/hosts51.sh's list on Lua 5.1 and LuaJIT, each against the
# module built for it in its own tree (build-lua51/, build-luajit/; no CUDA plugin).
test-lua51:
	$(MAKE) LUA=lua5.1 BUILD=build-lua51 CUDA=0 module
	sh spec/hosts51.sh lua5.1 build-lua51
test-luajit:
	$(MAKE) LUA=luajit BUILD=build-luajit CUDA=0 module
	sh spec/hosts51.sh luajit build-luajit

# The whole suite under AddressSanitizer + UBSan, in a separate build tree. Its
# plugin links its own sanitized copies of the core's C with the kernels' objects
# of $(BUILD) (nvcc compiles them once; host code compiled by nvcc is not
# instrumented either way).
asan:
	$(MAKE) plugin
	$(MAKE) BUILD=build-asan CU_BUILD=$(BUILD) OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" all examples-build
	ASAN=1 sh spec/run_tests.sh build-asan

# The C tests and the CPU specs under valgrind (leaks are errors), each a job of
# its own, as many at a time as there are cores (spec/jobs.sh), in a CPU-only
# build (CUDA=0: valgrind would only walk NVRTC and the CUDA libraries, for
# minutes) without -march=native: valgrind does not decode every extension (AVX-512).
valgrind:
	$(MAKE) BUILD=build-valgrind CUDA=0 ARCH= all examples-build
	sh spec/valgrind.sh build-valgrind

# The C tests that start threads (pthread_create in their source; the others run
# one thread here, where TSan has nothing to find) under ThreadSanitizer, in a
# CPU-only build (CUDA=0: without a GPU the plugin runs no thread of ours). libgomp and OpenBLAS are not built with TSan: it
# cannot see how they hand work to their own threads and would report races in their
# frames. So this tree is built without OpenMP (-fopenmp-simd: each `#pragma omp
# parallel` loop runs on its calling thread) and spec/tsan.sh runs OpenBLAS on the
# calling thread (OPENBLAS_NUM_THREADS=1); nothing is suppressed. The first report
# fails its test (halt_on_error, exit code 66) and the target.
TSAN_TESTS := $(patsubst spec/c/%.c,build-tsan/tests/%,$(shell grep -l pthread_create spec/c/*_test.c))
tsan:
	$(MAKE) BUILD=build-tsan CUDA=0 OPENMP=-fopenmp-simd OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=thread" $(TSAN_TESTS)
	sh spec/tsan.sh build-tsan

# libFuzzer targets (spec/fuzz/*_fuzz.c) over a clang build of the library and the
# binding with ASan + UBSan; spec/fuzz/seeds.lua writes their seed corpora (with
# the plain Lua module) into build-fuzz/seeds; spec/fuzz/run.sh runs each target on
# a scratch copy of its seeds, as many targets at a time as there are cores,
# and prints the executions per target.
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
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(LUA_CFLAGS) \
	    -DMK_FUZZ_ROOT='"$(abspath .)"' -o $@ $< $(LUA_OBJ) $(LIB_A) $(LUA_LIBS) $(LDLIBS)

clean:
	rm -rf build build-asan build-valgrind build-tsan build-nocudnn build-fuzz build-lua51 build-luajit

.PHONY: all module plugin test test-lua51 test-luajit examples examples-build asan valgrind tsan fuzz fuzz-targets clean install \
        install-lib install-module install-scripts uninstall
