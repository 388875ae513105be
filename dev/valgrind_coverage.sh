#!/bin/sh
# Shows that spec/valgrind.sh's workload reaches every line of our own C
# (core/, lua/) that an earlier revision's reached: builds a CPU-only tree with
# gcov (build-gcov/, as make valgrind's: CUDA=0, no -march=native), runs REV's
# spec/valgrind.sh commands without valgrind, and the checkout's, and compares
# the sets of lines each executed at least once. Both runs take one seed
# (MK_SEED, default 1), so that the op table's random MK_CASES=quick sample is
# the same. Prints both counts and the lines the checkout's workload no longer
# reaches; exits non-zero if there are any.
#
#   sh dev/valgrind_coverage.sh [REV]        (default HEAD~1)
REV=${1:-HEAD~1}
cd "$(dirname "$0")/.." || exit 2
B=build-gcov
export MK_SEED=${MK_SEED:-1}
tmp=$(mktemp -d)
make -s BUILD=$B CUDA=0 ARCH= OPT=-O1 SAN=--coverage all examples-build > "$tmp/make.out" 2>&1 ||
    { cat "$tmp/make.out"; exit 2; }

# Each run writes its counters under a directory of its own (GCOV_PREFIX: the
# tree's absolute paths below it), so that both run at once.
# lines RUN: "file:line" of every line of core/ and lua/ that RUN executed
lines() {
    d=$tmp/$1
    find "$d" -name '*.gcda' > "$tmp/$1.gcda"
    while read -r f; do # each counter file beside its notes file, as gcov wants
        g=${f%.gcda}.gcno
        cp "${g#"$d"}" "$g"
    done < "$tmp/$1.gcda"
    mkdir -p "$tmp/$1.json"
    (cd "$tmp/$1.json" && xargs gcov -j -p < "$tmp/$1.gcda" > /dev/null 2>&1)
    python3 - "$tmp/$1.json" "$(pwd)" > "$tmp/$1.lines" <<'PY'
import glob, gzip, json, os, sys
out, root = sys.argv[1], sys.argv[2]
seen = set()
for path in glob.glob(os.path.join(out, "*.gcov.json.gz")):
    data = json.load(gzip.open(path))
    cwd = data.get("current_working_directory", root)
    for f in data["files"]:
        name = os.path.relpath(os.path.join(cwd, f["file"]), root)
        if not (name.startswith("core/") or name.startswith("lua/")):
            continue
        for l in f["lines"]:
            if l["count"] > 0:
                seen.add("%s:%d" % (name, l["line_number"]))
print("\n".join(sorted(seen)))
PY
}

# REV's script with its valgrind command emptied: the same commands, natively
git show "$REV:spec/valgrind.sh" | sed 's/^VG=.*/VG=/' > spec/.valgrind_rev.sh
GCOV_PREFIX=$tmp/old sh spec/.valgrind_rev.sh $B > "$tmp/old.out" 2>&1 &
GCOV_PREFIX=$tmp/new VALGRIND= sh spec/valgrind.sh $B > "$tmp/new.out" 2>&1
new_rc=$?
wait $!
old_rc=$?
rm -f spec/.valgrind_rev.sh
for run in old new; do
    grep FAILED "$tmp/$run.out" | sed "s/^/$run run: /"
done
echo "$REV's workload: exit $old_rc; this checkout's: exit $new_rc (natively; a timing check may fail)"
lines old
lines new
lost=$(comm -23 "$tmp/old.lines" "$tmp/new.lines")
echo "lines of core/ and lua/ executed: $REV's workload $(wc -l < "$tmp/old.lines"), this checkout's $(wc -l < "$tmp/new.lines"), only $REV's: $(printf '%s' "$lost" | grep -c .)"
[ -n "$lost" ] && printf '%s\n' "$lost"
rm -rf "$tmp"
[ -z "$lost" ]
