-- luarocks --lua-version=5.4 make          (in a checkout: builds and installs offline)
-- luarocks pack moonkaas-scm-1.rockspec    (a source rock; spec/rock_check.sh proves both)
rockspec_format = "3.0"
package = "moonkaas"
version = "scm-1"
source = {
    -- a checkout of this repository; spec/rock_check.sh packs from a local tarball instead
    url = "git+file:///work/main",
}
description = {
    summary = "A small tensor compiler in C that Lua 5.4 programs embed",
    detailed = [[
Networks defined in Lua (tensor and node userdata) are lowered to a small
HamKaas-compatible text IR, compiled by a C core (passes, one-arena memory
planner) and evaluated on the CPU (OpenMP, OpenBLAS) or an NVIDIA GPU (CUDA
kernels, cuBLAS, cuDNN, CUDA graphs).
]],
    license = "MIT",
}
dependencies = {
    "lua >= 5.4, < 5.5",
}
external_dependencies = {
    OPENBLAS = { library = "openblas" },
}
build = {
    type = "make",
    -- the module and, where nvcc is found, the CUDA plugin beside it (core/plugin.c
    -- looks in the module's directory first); the C tests are not installed
    build_target = "module",
    build_variables = {
        LUA_INCDIR = "$(LUA_INCDIR)",
        -- luarocks' CFLAGS (-O2 -fPIC) go to OPT: the Makefile appends its own
        -- flags to CFLAGS, which a command-line CFLAGS would replace
        OPT = "$(CFLAGS)",
    },
    install_target = "install",
    install_variables = {
        INST_LIBDIR = "$(LIBDIR)",
        INST_LUADIR = "$(LUADIR)",
    },
}
