-- luarocks --lua-version=5.4 make            (in a checkout: builds and installs offline)
-- luarocks pack moonkaas-0.1.0-1.rockspec    (a source rock; spec/rock_check.sh proves both)
-- The version is core/moonkaas.h's MK_VERSION_* (spec/version_spec.lua checks this file,
-- the tag and CHANGELOG.md against it); a release renames this file and its tag.
rockspec_format = "3.0"
package = "moonkaas"
version = "0.1.0-1"
source = {
    url = "git+https://github.com/moonkaas/moonkaas.git",
    tag = "v0.1.0",
}
description = {
    summary = "A small tensor compiler in C that Lua programs (5.4, 5.1, LuaJIT) embed",
    detailed = [[
Networks defined in Lua (tensor and node userdata) are lowered to a small
HamKaas-compatible text IR, compiled by a C core (passes, one-arena memory
planner) and evaluated on the CPU (OpenMP, OpenBLAS) or an NVIDIA GPU (CUDA
kernels, cuBLAS, cuDNN, CUDA graphs).
]],
    homepage = "https://github.com/moonkaas/moonkaas",
    license = "MIT",
}
dependencies = {
    -- 5.4, 5.1 and LuaJIT (lua/compat.h picks the API from the headers luarocks
    -- passes in LUA_INCDIR; doc/building.md "Lua versions")
    "lua >= 5.1, < 5.5",
}
external_dependencies = {
    OPENBLAS = { library = "openblas" },
}
build = {
    type = "make",
    -- the module and, where nvcc is found, the CUDA plugin beside it (the module looks
    -- for it there only: no build path is baked in); the C tests are not installed
    build_target = "module",
    build_variables = {
        LUA_INCDIR = "$(LUA_INCDIR)",
        -- luarocks' CFLAGS (-O2 -fPIC) go to OPT: the Makefile appends its own
        -- flags to CFLAGS, which a command-line CFLAGS would replace
        OPT = "$(CFLAGS)",
    },
    -- the Lua module and its plugin only (`make install` would add the C library)
    install_target = "install-module",
    install_variables = {
        INST_LIBDIR = "$(LIBDIR)",
        INST_LUADIR = "$(LUADIR)",
    },
}
