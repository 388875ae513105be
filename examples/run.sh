#!/bin/sh
# Runs every example on the CPU against a build: the C ones built by `make
# examples-build` in BUILD/examples/, the Lua ones with lua5.4 (LUA=...) and
# BUILD's module. Prints "ok - NAME", "not ok - NAME" or "ok - NAME # SKIP why"
# per example (spec/run_tests.sh counts them) and exits non-zero on a failure.
#
#   sh examples/run.sh [BUILD_DIR]        (make examples calls this; make test too)
BUILD=${1:-build}
LUA=${LUA:-lua5.4}
cd "$(dirname "$0")/.." || exit 2
MODELS=${MK_MODELS:-../shared/models}
log=$(mktemp)
failed=0

# run NAME COMMAND...: one example, its output shown, its exit status judged
run() {
    name=$1
    shift
    echo "== $name"
    "$@" > "$log" 2>&1
    rc=$?
    cat "$log"
    if [ "$rc" -eq 0 ]; then
        echo "ok - $name"
    else
        echo "not ok - $name exited with $rc"
        failed=1
    fi
}

skip() {
    echo "ok - $1 # SKIP $2"
}

for c in host game_loop llama2_server; do
    bin="$BUILD/examples/$c"
    if [ ! -x "$bin" ]; then
        skip "$c.c" "not built for this Lua ($bin)"
        continue
    fi
    if [ "$c" = llama2_server ] && [ ! -f "$MODELS/stories260K.bin" ]; then
        skip "$c.c" "$MODELS/stories260K.bin is absent"
        continue
    fi
    case $c in
        game_loop) run "$c.c" "$bin" --frames 1000 ;;
        llama2_server) run "$c.c" env MK_MODELS="$MODELS" "$bin" ;;
        *) run "$c.c" "$bin" ;;
    esac
done

# The Lua examples load the module of BUILD; under ASan (ASAN=1) lua5.4 itself
# is not instrumented, so the sanitizer's runtime is preloaded as for the specs.
preload=
if [ -n "$ASAN" ]; then
    preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
    export ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}
fi
for f in mlp transformer_block cnn gpt2_block llama2_chat; do
    if [ "$f" = llama2_chat ] && [ ! -f "$MODELS/stories260K.bin" ]; then
        skip "$f.lua" "$MODELS/stories260K.bin is absent"
        continue
    fi
    run "$f.lua" env ${preload:+LD_PRELOAD="$preload"} MK_BUILD="$BUILD" MK_MODELS="$MODELS" \
        "$LUA" "examples/$f.lua"
done
rm -f "$log"
exit $failed
