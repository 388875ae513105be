#!/bin/sh
# Runs every C test, the C examples and the CPU busted specs (less those named
# in SKIP below) under valgrind, one job per test, spec file or example, as
# many at a time as the machine has cores (spec/jobs.sh: valgrind runs a
# process's threads one at a time, so each job takes one core); any error or
# definite leak fails.
#
#   sh spec/valgrind.sh [BUILD_DIR]
#   VALGRIND= sh spec/valgrind.sh build-gcov    the same commands without valgrind
#                                               (dev/valgrind_coverage.sh)
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 2
VG=${VALGRIND-valgrind -q --keep-debuginfo=yes --suppressions=spec/valgrind.supp --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite}
log=$(mktemp -d)
# generated kernels compiled here are cached in a throwaway directory
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$log/kernels}"
# MK_VALGRIND: tests run fewer rounds of what repeats; MK_CASES=quick: the op
# table's sample (doc/testing.md)
export MK_VALGRIND=1 MK_CASES=quick MK_BUILD="$BUILD"
# The CPU specs, less what valgrind would only repeat (doc/testing.md): the op
# table is sampled (MK_CASES=quick: every kernel, a fifth of the exhaustive
# loops' cases, no large ones), and these files are left to ASan: the ones that
# only drive child processes (valgrind follows no child) and the llama2
# end-to-end runs, whose kernels are the op table's and lowp_products_test's
# and whose loaders llama2_errors_spec reaches (dev/valgrind_coverage.sh shows
# that leaving them out loses no line of our C).
SKIP="kernels scripts install demo driver cuda_arch lua_hosts llama2 llama2_formats llama2_sampler
llama2_tokenizer llama2_batch"
# The longest first (CPU seconds under valgrind, doc/testing.md), then the rest
FIRST="examples/llama2_server tests/lowp_products_test spec/cpu_frames spec/ops spec/compat51
spec/docs spec/onnx_nn tests/mnist_test spec/nets spec/onnx spec/files tests/script_test spec/group
tests/file_test examples/game_loop"
jobs=$log/jobs
: > "$jobs"
add() { # add NAME COMMAND...: one job, once
    grep -q "^$1 " "$jobs" || echo "$*" >> "$jobs"
}
job() { # job tests/NAME | examples/NAME | spec/NAME: its line, or nothing
    case $1 in
        tests/*) [ -x "$BUILD/$1" ] && add "${1#*/}" $VG "$BUILD/$1" ;;
        examples/game_loop) [ -x "$BUILD/$1" ] && add example_game_loop $VG "$BUILD/$1" --frames 200 ;;
        examples/*) [ -x "$BUILD/$1" ] && add "example_${1#*/}" $VG "$BUILD/$1" ;;
        spec/*)
            s=${1#spec/}
            case " $(echo $SKIP) " in *" $s "*) return ;; esac
            [ -f "spec/${s}_spec.lua" ] &&
                add "spec_$s" $VG lua5.4 /usr/bin/busted --exclude-tags=gpu,slow "spec/${s}_spec.lua" ;;
    esac
    return 0
}
for j in $FIRST; do job "$j"; done
for t in "$BUILD"/tests/*; do job "tests/${t##*/}"; done
for e in "$BUILD"/examples/*; do job "examples/${e##*/}"; done
for f in spec/*_spec.lua; do f=${f#spec/}; job "spec/${f%_spec.lua}"; done

sh spec/jobs.sh "$log" < "$jobs"
status=0 n=0
while read -r name rest; do
    n=$((n + 1))
    if [ "$(cat "$log/$name.rc")" -eq 0 ]; then
        echo "valgrind clean: $name ($(cat "$log/$name.cpu") s CPU)"
    else
        cat "$log/$name.out"
        echo "valgrind FAILED: $name (exit $(cat "$log/$name.rc"))"
        status=1
    fi
done < "$jobs"
[ "$status" -eq 0 ] && echo "valgrind: $n jobs clean"
rm -rf "$log"
exit $status
