#!/bin/sh
# Runs every fuzz target built in BUILD/fuzz/ for SECONDS each, as many
# targets at a time as the machine has cores (spec/jobs.sh; each target runs
# one thread), on a scratch corpus BUILD/corpus/<target> seeded from
# BUILD/seeds/<target>/ (spec/fuzz/seeds.lua writes those; what the fuzzer adds
# stays out of the checkout).
# Prints one line per target (executions, seconds, result) and exits non-zero
# if any target crashed; crashing inputs are kept in BUILD/artifacts/.
#
#   sh spec/fuzz/run.sh [BUILD] [SECONDS]       (make fuzz FUZZ_SECONDS=60 calls this)
BUILD=${1:-build-fuzz}
SECONDS_EACH=${2:-60}
cd "$(dirname "$0")/../.." || exit 2
# libFuzzer reports leaks itself; UBSan findings abort (-fno-sanitize-recover)
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1}
if [ "$3" = --target ]; then
    # one target (a job of spec/jobs.sh): its exit status is the fuzzer's
    name=$4
    corpus="$BUILD/corpus/$name"
    mkdir -p "$corpus"
    [ -d "$BUILD/seeds/$name" ] && cp "$BUILD/seeds/$name"/* "$corpus"/ 2> /dev/null
    dict=""
    [ -f "spec/fuzz/$name.dict" ] && dict="-dict=spec/fuzz/$name.dict"
    exec "$BUILD/fuzz/$name" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2560 \
        -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$name-" $dict "$corpus"
fi
mkdir -p "$BUILD/corpus" "$BUILD/artifacts" "$BUILD/logs"
jobs=$(mktemp)
for bin in "$BUILD"/fuzz/*_fuzz; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    echo "$name sh $0 $BUILD $SECONDS_EACH --target $name" >> "$jobs"
done
echo "== $(wc -l < "$jobs") targets, $SECONDS_EACH s each, $(nproc 2> /dev/null || echo 2) at a time"
sh spec/jobs.sh "$BUILD/logs" < "$jobs"
failed=0
summary=""
total=0
while read -r name rest; do
    log="$BUILD/logs/$name.log"
    mv "$BUILD/logs/$name.out" "$log"
    rc=$(cat "$BUILD/logs/$name.rc")
    echo "== $name ($SECONDS_EACH s, $(cat "$BUILD/logs/$name.cpu") s CPU)"
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
    secs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
        result=ok
    else
        result="FAILED (exit $rc, log $log)"
        failed=$((failed + 1))
        grep -A 40 -m 1 -E 'ERROR:|==== fuzz finding|==== graph_fuzz|runtime error:|out-of-memory|timeout' "$log"
        runs=${runs:-$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -n 1)}
    fi
    runs=${runs:-0}
    total=$((total + runs))
    summary="$summary$(printf '%-18s %12s runs %6s s  %s' "$name" "$runs" "${secs:-?}" "$result")
"
done < "$jobs"
rm -f "$jobs"
echo "== fuzz summary"
printf '%s' "$summary"
printf '%-18s %12s runs\n' total "$total"
[ "$failed" -eq 0 ]
