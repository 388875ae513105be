# moonkaas — build the library, the Lua module and the tests.
#
#   make            build/libmoonkaas.{so,a}, build/moonkaas/core.so (Lua module), C tests
#   make test       every C test and busted spec; ends with "N passed, N failed, N skipped"
#   make asan       the same under AddressSanitizer + UBSan (build-asan/)
#   make CUDA=1     force the CUDA device (default: built when nvcc is found); CUDA=0 turns it off

BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
# Built where it runs (make, luarocks): use the machine's vector units; ARCH= for a portable build.
ARCH     ?= -march=native
CFLAGS   ?= $(OPT) $(ARCH) -g
SAN      ?=
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fPIC -fopenmp \
            -fvisibility=hidden -DMK_BUILDING -Icore $(SAN)
LDLIBS   += -lopenblas -lm -fopenmp $(SAN)
LUA      ?= lua5.4
LUA_INCDIR ?= $(firstword $(wildcard /usr/include/lua5.4) /usr/include)
LUA_LIBDIR ?= $(LUA_INCDIR)/../../lib/x86_64-linux-gnu
BLAS_INC ?= $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread) /usr/include/x86_64-linux-gnu)
CFLAGS   += -I$(BLAS_INC)

NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA     ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= sm_90
CUDNN_INC ?= $(firstword $(dir $(wildcard /usr/include/x86_64-linux-gnu/cudnn_graph.h $(CUDA_HOME)/include/cudnn_graph.h /usr/include/cudnn_graph.h)))

CORE_SRC := $(wildcard core/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)
CU_SRC   := $(wildcard kernels/*.cu)
CU_OBJ   :=
ifeq ($(CUDA),1)
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o)
CFLAGS   += -DMK_WITH_CUDA -I$(CUDA_HOME)/include $(if $(CUDNN_INC),-I$(CUDNN_INC))
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lcudnn -lstdc++
NVFLAGS  ?= -O3 -g -lineinfo -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -DMK_BUILDING \
            -DMK_WITH_CUDA -Icore $(if $(CUDNN_INC),-I$(CUDNN_INC)) \
            $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(subst sm_,,$(a)),code=$(a))
endif

LUA_SRC  := $(wildcard lua/*.c)
LUA_OBJ  := $(LUA_SRC:%.c=$(BUILD)/%.o)
CTEST_SRC := $(wildcard spec/c/*_test.c)
CTESTS   := $(CTEST_SRC:spec/c/%.c=$(BUILD)/tests/%)

LIB_SO   := $(BUILD)/libmoonkaas.so
LIB_A    := $(BUILD)/libmoonkaas.a
LUA_MOD  := $(BUILD)/moonkaas/core.so

all: $(LIB_SO) $(LIB_A) $(if $(LUA_SRC),$(LUA_MOD)) $(CTESTS)

$(BUILD)/core/%.o: core/%.c core/moonkaas.h core/internal.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu core/moonkaas.h core/internal.h $(wildcard kernels/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/lua/%.o: lua/%.c core/moonkaas.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu -c $< -o $@

$(LIB_A): $(CORE_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(CORE_OBJ) $(CU_OBJ)
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
	$(CC) $(CFLAGS) -I$(LUA_INCDIR) -I$(LUA_INCDIR)/../x86_64-linux-gnu -Ispec/c -o $@ $< $(LUA_OBJ) $(LIB_A) -L$(LUA_LIBDIR) -l$(LUA) $(LDLIBS)

# luarocks (build type make) calls `make` then `make install` with these set.
PREFIX      ?= /usr/local
INST_LIBDIR ?= $(PREFIX)/lib/lua/5.4
INST_LUADIR ?= $(PREFIX)/share/lua/5.4
install: $(LUA_MOD)
	install -d $(INST_LIBDIR)/moonkaas $(INST_LUADIR)/moonkaas
	install -m 755 $(LUA_MOD) $(INST_LIBDIR)/moonkaas/core.so
	cd lua && find moonkaas -name '*.lua' -exec install -D -m 644 {} $(INST_LUADIR)/{} \;

test: all
	@sh spec/run_tests.sh $(BUILD)

# The whole suite under AddressSanitizer + UBSan (a separate build tree).
asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" all
	ASAN=1 sh spec/run_tests.sh build-asan

# The C tests and the CPU specs under valgrind (leaks are errors), in a build
# without -march=native: valgrind does not decode every extension (AVX-512).
valgrind:
	$(MAKE) BUILD=build-valgrind ARCH= all
	sh spec/valgrind.sh build-valgrind

clean:
	rm -rf build build-asan build-valgrind

.PHONY: all test asan valgrind clean install
