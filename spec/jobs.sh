#!/bin/sh
# Runs jobs side by side, JOBS at a time (default: the machine's cores), for
# spec/run_tests.sh, spec/valgrind.sh and spec/fuzz/run.sh. Each line of
# stdin is one job: a name, then the command and its arguments (split at
# blanks, no quoting: `env A=B prog args` sets its environment). Longest jobs
# first keeps both cores busy to the end.
#
#   sh spec/jobs.sh LOGDIR < joblist
#
# Writes LOGDIR/NAME.out (stdout and stderr), LOGDIR/NAME.rc (its exit
# status) and LOGDIR/NAME.cpu (its CPU seconds, user + sys, children
# included); the caller reads them in its own order, so that what it prints
# does not depend on which job ended first. Exits 0 once every job ended.
log=${1:?usage: jobs.sh LOGDIR < joblist}
mkdir -p "$log"
if [ "$2" = --one ]; then
    # one job (xargs calls this): $3 the name, the rest its command
    name=$3
    shift 3
    "$@" > "$log/$name.out" 2>&1
    echo $? > "$log/$name.rc"
    # the second line of `times`: the CPU time of this shell's children
    # (a builtin in a pipeline runs in a subshell, which has no children: a file)
    times > "$log/$name.cpu"
    awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] }
                   printf "%.1f\n", n }' "$log/$name.cpu" > "$log/$name.cpu.tmp"
    mv "$log/$name.cpu.tmp" "$log/$name.cpu"
    exit 0
fi
JOBS=${JOBS:-$(nproc 2> /dev/null || echo 2)}
xargs -P "$JOBS" -L 1 sh "$0" "$log" --one
