#!/bin/sh
# spec/rock_check.sh — proves the rock installs offline, twice, in temporary trees:
#   1. `luarocks make` in a clean copy of this checkout (the files git tracks or
#      would track, no build outputs);
#   2. `luarocks pack` of a source rock made from that copy, then
#      `luarocks install` of the .src.rock;
# and after each, from another directory with only `luarocks path` of that tree,
# `lua5.4 -e 'require "moonkaas"'` loads the installed module and runs a network;
# where the build made the CUDA plugin, it is installed beside core.so and the
# module finds it there (on a machine without a GPU only the device probe fails).
# Prints "rock check: ok" and exits 0, or says what failed and exits 1.
#
#   sh spec/rock_check.sh          (CUDA=0 in the environment skips the CUDA build)
#
# CU_BUILD=DIR in the environment (an absolute path to a tree that `make` built,
# as CI does): both builds link the kernels' objects of DIR instead of running
# nvcc again (the Makefile's CU_BUILD); the rest is built in the copy.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LUAROCKS=${LUAROCKS:-luarocks}
LUA=${LUA:-lua5.4}
LR="$LUAROCKS --lua-version=5.4"
ROCKSPEC=$(ls moonkaas-*.rockspec | head -n 1) # moonkaas-<version>-<revision>.rockspec
case "${CU_BUILD:-/}" in
/*) ;;
*) echo "rock check: FAILED: CU_BUILD=$CU_BUILD is not an absolute path"; exit 1 ;;
esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mk-rock.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
export HOME="$tmp/home" # luarocks' cache and config stay in the temporary tree
mkdir -p "$HOME" "$tmp/src/moonkaas" "$tmp/pack" "$tmp/elsewhere"

fail() {
    echo "rock check: FAILED: $*"
    exit 1
}

# ---- a clean copy --------------------------------------------------------------
if git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git -C "$ROOT" ls-files --cached --others --exclude-standard |
        grep -v -e '^build' -e '^\.gpu/' |
        while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done > "$tmp/files"
else
    find . -type f ! -path './build*' ! -path './.git/*' ! -path './.gpu/*' | sed 's|^\./||' > "$tmp/files"
fi
tar cf - -T "$tmp/files" | tar xf - -C "$tmp/src/moonkaas"
tar czf "$tmp/moonkaas-scm.tar.gz" -C "$tmp/src" moonkaas
# every Lua module of the package must be installed: lua/moonkaas/a/b.lua -> moonkaas.a.b
grep '^lua/moonkaas/.*\.lua$' "$tmp/files" | sed -e 's|^lua/||' -e 's|\.lua$||' -e 's|/init$||' -e 's|/|.|g' \
    > "$tmp/modules"

# Loads the module installed in tree $1 from another directory and runs a network.
check_tree() {
    (
        eval "$($LR --tree "$1" path)"
        cd "$tmp/elsewhere"
        MK_TREE="$1" MK_MODULES="$tmp/modules" MK_PLUGIN="$plugin" $LUA -e '
            local tree = os.getenv("MK_TREE")
            local core = package.searchpath("moonkaas.core", package.cpath)
            assert(core and core:sub(1, #tree) == tree, "moonkaas.core not from the tree: " .. tostring(core))
            local mk = require "moonkaas"
            local x = mk.input("x", "float32", {2})
            local m <close> = mk.compile((x * 2):relu())
            local y = m:run({x = mk.tensor({1.5, -1})})
            assert(y:get(1) == 3 and y:get(2) == 0, tostring(y))
            for name in io.lines(os.getenv("MK_MODULES")) do
                local where = package.searchpath(name, package.path)
                assert(where and where:sub(1, #tree) == tree, "module " .. name .. " is not installed")
            end
            local plugin = core:gsub("core%.so$", "libmoonkaas_cuda.so")
            local ok, why = mk.cuda_available()
            if os.getenv("MK_PLUGIN") == "1" then
                assert(io.open(plugin), "no CUDA plugin beside the module: " .. plugin)
                assert(ok or not why:find("plugin", 1, true), "the CUDA plugin does not load: " .. why)
            else
                assert(not io.open(plugin), "a CUDA plugin where the build made none: " .. plugin)
            end
            print("  require \"moonkaas\" " .. mk.version .. " from " .. core)
            print("  CUDA: " .. (ok and "available" or why))
        '
    ) || fail "the module installed in $1 does not load from another directory"
    # no build tree is baked into the module's plugin search: luarocks deletes it
    ! grep -a -q -E "$tmp/src/moonkaas/build|/luarocks_moonkaas[^/]*/moonkaas/build" \
        $(find "$1" -name core.so) || fail "a build path is baked into $1's core.so"
}

# ---- 1. luarocks make in the clean copy ------------------------------------------
echo "rock check: luarocks make in a clean copy"
(cd "$tmp/src/moonkaas" && $LR make --tree "$tmp/tree-make" "$ROCKSPEC") \
    > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "luarocks make"; }
# the build made the plugin (nvcc found, CUDA not 0): each tree must have it beside core.so
plugin=0
[ -f "$tmp/src/moonkaas/build/libmoonkaas_cuda.so" ] && plugin=1
check_tree "$tmp/tree-make"

# ---- 2. luarocks pack, then install of the source rock ------------------------------
echo "rock check: luarocks pack + luarocks install of the source rock"
sed -e "s|^\([[:space:]]*\)url = .*|\1url = \"file://$tmp/moonkaas-scm.tar.gz\", dir = \"moonkaas\",|" \
    -e '/^[[:space:]]*tag = /d' "$ROCKSPEC" > "$tmp/pack/$ROCKSPEC"
(cd "$tmp/pack" && $LR pack "$ROCKSPEC") > "$tmp/pack.log" 2>&1 ||
    { cat "$tmp/pack.log"; fail "luarocks pack"; }
SRC_ROCK=${ROCKSPEC%.rockspec}.src.rock
[ -f "$tmp/pack/$SRC_ROCK" ] || { cat "$tmp/pack.log"; fail "no $SRC_ROCK"; }
(cd "$tmp/elsewhere" && $LR install --tree "$tmp/tree-rock" "$tmp/pack/$SRC_ROCK") \
    > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "luarocks install of the source rock"; }
check_tree "$tmp/tree-rock"

echo "rock check: ok"
