#!/bin/bash
# bench_cpu_q8.sh — CPU int8 decoding, moonkaas against llama.cpp's Q8_0, in
# alternating rounds on one machine: moonkaas before (MKB, a checkout built
# elsewhere; optional) and after (MK) with -q q8 and -q q8a8, and llama.cpp's
# llama-bench (LC: its build/bin) on the same random checkpoints as Q8_0 GGUFs.
# THREADS (2) threads each. Prints one TSV row a run: round model engine prec
# tok/s maxrss_KB load1 (the 1-minute load average after the run).
#   M=/tmp/i8 LC=/tmp/lcpp_src/build/bin MKB=/tmp/mk_before sh scripts/bench_cpu_q8.sh
# M holds s15.bin, s110.bin (../shared/bench/randckpt.c: 288 768 6 6 6 32000 256
# and 768 2048 12 12 12 32000 1024) and s15-q8_0.gguf, s110-q8_0.gguf
# (llama-convert-llama2c-to-ggml, then llama-quantize ... Q8_0).
ROUNDS=${ROUNDS:-5}
MODELS=${MODELS:-"s15 s110"}
LC=${LC:-/tmp/lcpp_src/build/bin}
MK=${MK:-$(cd "$(dirname "$0")/.." && pwd)}
MKB=${MKB:-}
M=${M:-/tmp/i8}
TOK=${TOK:-$(dirname "$0")/../../shared/models/tokenizer.bin}
TOK=$(cd "$(dirname "$TOK")" && pwd)/$(basename "$TOK")
N=${N:-128}
THREADS=${THREADS:-2}
T=$(mktemp -d)
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" "$(cut -d' ' -f1 /proc/loadavg)"; }
lcpp() { # round model
    /usr/bin/time -f '%M' -o $T/rss "$LC/llama-bench" -m "$M/$2-q8_0.gguf" -p 0 -n $N -t $THREADS -r 2 -o csv \
        > $T/lb.csv 2> $T/lb.err
    local ts=$(python3 -c "import csv; r=list(csv.DictReader(open('$T/lb.csv'))); print(r[-1]['avg_ts'])" 2>/dev/null)
    row "$1" "$2" llama.cpp Q8_0 "${ts:-NA}" "$(tail -1 $T/rss)"
}
mk() { # round model dir name prec
    (cd "$3" && OMP_NUM_THREADS=$THREADS /usr/bin/time -f '%M' -o $T/rss lua5.4 scripts/llama2.lua "$M/$2.bin" -z "$TOK" -t 0 -n $N \
        -i "Once upon a time" -d cpu -q "$5" > $T/mk.out 2> $T/mk.err)
    row "$1" "$2" "$4" "$5" "$(grep -o 'achieved tok/s: [0-9.]*' $T/mk.err | awk '{print $3}')" "$(tail -1 $T/rss)"
}
printf 'round\tmodel\tengine\tprec\ttok/s\tmaxrss_KB\tload1\n'
for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        runs=("lcpp $r $m")
        [ -n "$MKB" ] && runs+=("mk $r $m $MKB before q8" "mk $r $m $MKB before q8a8")
        runs+=("mk $r $m $MK after q8" "mk $r $m $MK after q8a8")
        if [ $((r % 2)) = 0 ]; then # reversed every other round
            for ((i = ${#runs[@]} - 1; i >= 0; i--)); do ${runs[$i]}; done
        else
            for c in "${runs[@]}"; do $c; done
        fi
    done
done
rm -rf $T
